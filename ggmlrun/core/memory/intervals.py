"""Buffers as columns of lifetimes, and who overlaps whom: what both planners build on."""

from __future__ import annotations

import numpy as np


def columns(buffers):
    """Columns as int64 arrays; buffers that can never conflict get `active == False`."""
    lower = np.fromiter((b.lower for b in buffers), dtype=np.int64, count=len(buffers))
    upper = np.fromiter((b.upper for b in buffers), dtype=np.int64, count=len(buffers))
    size = np.fromiter((b.size for b in buffers), dtype=np.int64, count=len(buffers))
    active = (upper > lower) & (size > 0)
    return lower, upper, size, active


def overlap_pairs(lower, upper, active, max_pairs=None):
    """All index pairs (i, j) whose lifetimes overlap, each pair once, in O(n log n + pairs).

    After sorting by start, the buffers overlapping i that start no earlier than i are exactly
    those whose start lies in [lower_i, upper_i): one searchsorted per buffer finds them.
    """
    idx = np.flatnonzero(active)
    order = idx[np.argsort(lower[idx], kind="stable")]
    starts = lower[order]
    pos = np.arange(order.size)
    end = np.searchsorted(starts, upper[order], side="left")
    counts = np.maximum(end - pos - 1, 0)
    total = int(counts.sum())
    if max_pairs is not None and total > max_pairs:
        raise MemoryError(f"{total} overlapping pairs exceed {max_pairs}")
    first = np.repeat(pos, counts)
    offsets_in_run = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    second = first + 1 + offsets_in_run
    return order[first], order[second]


def neighbours(lower, upper, active):
    """Adjacency lists of the time-overlap graph, as Python lists (the greedy loop's input)."""
    a, b = overlap_pairs(lower, upper, active)
    n = lower.size
    src = np.concatenate([a, b])
    dst = np.concatenate([b, a])
    order = np.argsort(src, kind="stable")
    dst = dst[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    flat = dst.tolist()
    bounds = ptr.tolist()
    return [flat[bounds[i]:bounds[i + 1]] for i in range(n)]
