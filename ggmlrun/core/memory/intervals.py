"""Buffers as columns of lifetimes, and who overlaps whom: what both planners build on."""

from __future__ import annotations

import bisect

import numpy as np


def columns(buffers):
    """Columns as int64 arrays; buffers that can never conflict get `active == False`."""
    lower = np.fromiter((b.lower for b in buffers), dtype=np.int64, count=len(buffers))
    upper = np.fromiter((b.upper for b in buffers), dtype=np.int64, count=len(buffers))
    size = np.fromiter((b.size for b in buffers), dtype=np.int64, count=len(buffers))
    active = (upper > lower) & (size > 0)
    return lower, upper, size, active


def _pair_counts(lower, upper, active):
    """Active buffers by start, and for each how many later-starting ones overlap it."""
    idx = np.flatnonzero(active)
    order = idx[np.argsort(lower[idx], kind="stable")]
    starts = lower[order]
    pos = np.arange(order.size)
    end = np.searchsorted(starts, upper[order], side="left")
    return order, pos, np.maximum(end - pos - 1, 0)


def count_pairs(lower, upper, active) -> int:
    """How many lifetime-overlapping pairs there are, in O(n log n) without listing them:
    the planners check this before building anything quadratic in live buffers."""
    return int(_pair_counts(lower, upper, active)[2].sum())


def overlap_pairs(lower, upper, active, max_pairs=None):
    """All index pairs (i, j) whose lifetimes overlap, each pair once, in O(n log n + pairs).

    After sorting by start, the buffers overlapping i that start no earlier than i are exactly
    those whose start lies in [lower_i, upper_i): one searchsorted per buffer finds them.
    """
    order, pos, counts = _pair_counts(lower, upper, active)
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


def online_plan(lower, upper, size, active, alignment=1):
    """Offsets placed in time order by a best-fit free list, as ggml's online allocator does:
    O(n log n + n * free blocks), never quadratic in live buffers. Returns (offsets, peak)."""
    n = lower.size
    offsets = [0] * n
    events = _events(lower, upper, active)
    free: list[list[int]] = []          # [start, end) blocks, sorted, never adjacent
    top = 0
    sizes = size.tolist()
    for _, is_alloc, i in events:
        if not is_alloc:
            _release(free, offsets[i], offsets[i] + sizes[i])
            continue
        need, best, best_slack = sizes[i], None, None
        for k, (start, end) in enumerate(free):
            at = -(-start // alignment) * alignment
            slack = end - at - need
            if slack >= 0 and (best is None or slack < best_slack):
                best, best_slack = k, slack
        if best is None:              # past every gap: on top, from the last free block if it
            at = top                  # reaches the top (ggml grows that block the same way)
            if free and free[-1][1] == top:
                at = free.pop()[0]
            aligned = -(-at // alignment) * alignment
            if at < aligned:
                free.append([at, aligned])
            offsets[i] = aligned
            top = max(top, aligned + need)
            continue
        start, end = free.pop(best)
        at = -(-start // alignment) * alignment
        offsets[i] = at
        pieces = [[start, at]] if start < at else []
        if at + need < end:
            pieces.append([at + need, end])
        free[best:best] = pieces
    return offsets, top


def _events(lower, upper, active):
    """(time, 0 = free / 1 = allocate, index), sorted: at equal times frees come first, as a
    lifetime [lower, upper) ends before another one starting at `upper` begins."""
    live = np.flatnonzero(active).tolist()
    return sorted([(int(upper[i]), 0, i) for i in live] + [(int(lower[i]), 1, i) for i in live])


def _release(free, start, end):
    k = bisect.bisect_left(free, [start, end])
    if k > 0 and free[k - 1][1] == start:
        k -= 1
        start = free.pop(k)[0]
    if k < len(free) and free[k][0] == end:
        end = free.pop(k)[1]
    free.insert(k, [start, end])


def sweep_conflicts(lower, upper, size, active, offsets, limit=20):
    """Pairs live at once whose address ranges meet, found by a sweep over time with the live
    ranges kept sorted by offset: O(n log n) plus list shifts, where listing pairs is O(n^2)."""
    events = _events(lower, upper, active)
    live: list[tuple[int, int]] = []     # (offset, index), sorted
    sizes = size.tolist()
    found = []
    for _, is_alloc, i in events:
        key = (offsets[i], i)
        if not is_alloc:
            k = bisect.bisect_left(live, key)
            if k < len(live) and live[k] == key:
                live.pop(k)
            continue
        k = bisect.bisect_left(live, key)
        for j in (k - 1, k):
            if 0 <= j < len(live):
                other = live[j][1]
                if offsets[other] < offsets[i] + sizes[i] and offsets[i] < offsets[other] + sizes[other]:
                    found.append((other, i))
        live.insert(k, key)
        if len(found) >= limit:
            break
    return found
