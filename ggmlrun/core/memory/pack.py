"""Offline offset planning for buffers with known lifetimes ("dynamic storage allocation").

Every buffer lives over a half-open time interval [lower, upper) and needs `size` bytes. Two
buffers whose lifetimes overlap must not overlap in address space; the goal is the smallest
peak, max(offset + size). The planner runs cheap greedy placements first (`pack_greedy`: good
enough for the arena planner's easy graphs, and an upper bound for everything else), then,
when asked, a MiniMalloc-style exact search (see `pack_search`) that tries to close the gap to
the lower bound within a time limit. Here: the buffers, the bound, the check of a placement
and the planner that chooses; MiniMalloc's CSV files are `pack_csv`'s.

This module and its helpers have no dependency on the rest of ggmlrun (the CSV reader adds
the error class), so they can be tested and benchmarked on their own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ggmlrun.core.memory.intervals import columns, count_pairs, online_plan, sweep_conflicts
from ggmlrun.core.memory.pack_greedy import plan_greedy
from ggmlrun.core.memory.pack_search import minimise_peak

# The exact search keeps per-section state in memory and costs O(n) numpy work per node; past
# this many buffers it is not worth starting (the arena planner's graphs only use greedy).
SEARCH_MAX_BUFFERS = 20_000
# past this many lifetime-overlapping pairs the greedy passes (which list every pair) would
# take minutes and gigabytes: 50k buffers live at once are 1.25e9 pairs
MAX_PAIRS = 1_000_000
FALLBACK_PREFIX = "size bound: "


@dataclass(frozen=True)
class Buffer:
    """One allocation request: `size` bytes needed over time [lower, upper)."""

    id: str
    lower: int
    upper: int
    size: int

    def __post_init__(self):
        if self.size < 0:
            raise ValueError(f"buffer {self.id!r}: size {self.size} is negative")
        if self.upper < self.lower:
            raise ValueError(f"buffer {self.id!r}: upper {self.upper} < lower {self.lower}")


@dataclass
class PackResult:
    """The chosen offsets and how good they are: `peak == lower_bound` proves optimality."""

    offsets: dict[str, int]
    peak: int
    lower_bound: int
    method: str
    seconds: float
    greedy_peak: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def optimal(self) -> bool:
        return self.peak == self.lower_bound


# --------------------------------------------------------------------------- bounds


def lower_bound(buffers) -> int:
    """The most bytes live at any one instant: no placement can have a smaller peak.

    Ends sort before starts at the same time because lifetimes are half-open, so a buffer
    freed at t and one allocated at t are never counted together.
    """
    if not buffers:
        return 0
    lower, upper, size, active = columns(buffers)
    lower, upper, size = lower[active], upper[active], size[active]
    if size.size == 0:
        return 0
    times = np.concatenate([upper, lower])
    deltas = np.concatenate([-size, size])
    order = np.lexsort((deltas, times))  # by time, then negative deltas (ends) first
    return int(max(0, np.cumsum(deltas[order]).max()))


# --------------------------------------------------------------------------- verification


def verify(buffers, offsets, *, capacity=None, alignment=1, chunk_pairs=4_000_000) -> list[str]:
    """Every broken rule, as readable lines; an empty list means the placement is valid.

    Pairs are enumerated in chunks so that a dense instance (everything live at once) costs
    time but not quadratic memory.
    """
    problems = []
    missing = [b.id for b in buffers if b.id not in offsets]
    if missing:
        problems.append(f"no offset for {len(missing)} buffer(s): {', '.join(missing[:5])}")
        return problems
    off = np.fromiter((offsets[b.id] for b in buffers), dtype=np.int64, count=len(buffers))
    lower, upper, size, active = columns(buffers)
    for i in np.flatnonzero(off < 0)[:20]:
        problems.append(f"buffer {buffers[i].id!r}: negative offset {int(off[i])}")
    if alignment > 1:
        for i in np.flatnonzero(off % alignment)[:20]:
            problems.append(f"buffer {buffers[i].id!r}: offset {int(off[i])} "
                            f"is not a multiple of {alignment}")
    if capacity is not None:
        for i in np.flatnonzero(off + size > capacity)[:20]:
            problems.append(f"buffer {buffers[i].id!r}: ends at {int(off[i] + size[i])} "
                            f"> capacity {capacity}")
    if count_pairs(lower, upper, active) > MAX_PAIRS:
        offs = off.tolist()
        problems.extend(f"buffers {buffers[i].id!r} and {buffers[j].id!r} overlap in time and "
                        "in space" for i, j in sweep_conflicts(lower, upper, size, active, offs))
    else:
        problems.extend(_space_conflicts(buffers, off, lower, upper, size, active, chunk_pairs))
    return problems


def _space_conflicts(buffers, off, lower, upper, size, active, chunk_pairs):
    """Time-overlapping pairs that also overlap in address space (first 20 reported)."""
    idx = np.flatnonzero(active)
    order = idx[np.argsort(lower[idx], kind="stable")]
    starts = lower[order]
    end = np.searchsorted(starts, upper[order], side="left")
    counts = np.maximum(end - np.arange(order.size) - 1, 0)
    found = []
    lo = 0
    while lo < order.size and len(found) < 20:
        cum = np.cumsum(counts[lo:])
        hi = lo + max(1, int(np.searchsorted(cum, chunk_pairs, side="right")))
        c = counts[lo:hi]
        first = np.repeat(np.arange(lo, hi), c)
        second = first + 1 + (np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c))
        a, b = order[first], order[second]
        bad = (off[a] < off[b] + size[b]) & (off[b] < off[a] + size[a])
        for i, j in zip(a[bad][:20].tolist(), b[bad][:20].tolist()):
            found.append(f"buffers {buffers[i].id!r} [{off[i]}, {off[i] + size[i]}) and "
                         f"{buffers[j].id!r} [{off[j]}, {off[j] + size[j]}) overlap in time "
                         f"and space")
        lo = hi
    return found[:20]


# --------------------------------------------------------------------------- the planner


def plan_offsets(buffers, capacity=None, time_limit=5.0, *, search=True, alignment=1,
                 max_passes=None) -> PackResult:
    """Offsets for every buffer, as low a peak as the time limit allows.

    Greedy always runs. The search runs only when `search` is true, `time_limit > 0`, and the
    greedy peak is above the target: `capacity` when given (then any fitting placement is
    accepted), otherwise the lower bound (then it bisects on the peak between the lower bound
    and the best found so far).
    """
    t0 = time.perf_counter()
    buffers = list(buffers)
    _check_ids(buffers)
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    if max_passes is None and len(buffers) > 20_000:
        max_passes = 2  # keep the greedy-only path of huge graphs to a couple of passes
    lower, upper, size, active = columns(buffers)
    pairs = count_pairs(lower, upper, active)
    notes = []
    if pairs > MAX_PAIRS:     # the greedy passes' neighbour lists would be quadratic
        offs, peak = online_plan(lower, upper, size, active, alignment)
        method = "online best-fit"
        notes.append(f"{FALLBACK_PREFIX}{pairs:,} overlapping lifetimes > {MAX_PAIRS:,}, so "
                     "ggml's online best-fit instead of the greedy passes and the search")
        search = False
    else:
        offs, peak, method = plan_greedy(buffers, alignment, max_passes)
    lb = lower_bound(buffers)
    greedy_peak = peak
    target = lb if capacity is None else capacity
    if search and len(buffers) > SEARCH_MAX_BUFFERS:
        notes.append(f"search skipped: {len(buffers)} buffers > {SEARCH_MAX_BUFFERS}")
        search = False
    if search and time_limit and time_limit > 0 and peak > max(target, lb):

        found = minimise_peak(buffers, lb, peak, capacity, alignment,
                              deadline=t0 + time_limit)
        notes.extend(found.notes)
        if found.offsets is not None and found.peak < peak:
            offs, peak, method = found.offsets, found.peak, found.method
    offsets = {b.id: int(o) for b, o in zip(buffers, offs)}
    return PackResult(offsets, int(peak), int(lb), method, time.perf_counter() - t0,
                      greedy_peak=int(greedy_peak), notes=notes)


def _check_ids(buffers):
    seen = set()
    for b in buffers:
        if b.id in seen:
            raise ValueError(f"duplicate buffer id {b.id!r}")
        seen.add(b.id)
