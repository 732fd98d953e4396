"""The smallest peak the exact search reaches before a deadline: with a capacity, one decision
search under it; without, the lower bound first (usually the optimum on real instances), then
bisection between what is proven impossible or timed out and the best found. The decision
search itself (MiniMalloc's, written anew) is pack_solver's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ggmlrun.core.memory.intervals import columns, neighbours
from ggmlrun.core.memory.pack_solver import Solver


@dataclass
class SearchOutcome:
    """What a bounded search reached: offsets (list aligned with the input) or None."""

    offsets: list[int] | None
    peak: int
    method: str
    notes: list[str] = field(default_factory=list)


def minimise_peak(buffers, lb, best_peak, capacity, alignment, deadline) -> SearchOutcome:
    """Search for the smallest peak reachable before `deadline`.

    With a capacity, one decision search under it. Without, first the lower bound (usually
    the optimum on real instances), then bisection between what is proven impossible or timed
    out and the best found. Buffers that never conflict (empty lifetime or size 0) sit at 0.
    """
    lower, upper, size, active = columns(buffers)
    idx = np.flatnonzero(active)
    if idx.size == 0:
        return SearchOutcome([0] * len(buffers), 0, "trivial")
    all_nbrs = neighbours(lower, upper, active)
    remap = np.full(len(buffers), -1, dtype=np.int64)
    remap[idx] = np.arange(idx.size)
    nbrs = [remap[all_nbrs[g]] for g in idx.tolist()]
    solver = Solver(lower[idx], upper[idx], size[idx], nbrs, alignment)
    notes: list[str] = []

    def attempt(cap, share):
        now = time.perf_counter()
        status, offs, used = solver.solve(cap, min(deadline, now + share * (deadline - now)))
        notes.append(f"search cap={cap}: {status} ({'/'.join(used)}, "
                     f"{time.perf_counter() - now:.2f}s)")
        if status != "found":
            return status, None
        full = np.zeros(len(buffers), dtype=np.int64)
        full[idx] = offs
        peak = int((full[idx] + size[idx]).max())
        return status, SearchOutcome(full.tolist(), peak, "search:" + "/".join(sorted(set(used))))

    if capacity is not None:
        _, best = attempt(capacity, 1.0)
        return _finish(best, notes)
    best = None
    lo, hi = lb, best_peak - 1
    first = True
    while lo <= hi and time.perf_counter() < deadline:
        cap = lo if first else (lo + hi) // 2
        status, found = attempt(cap, 0.6 if first else 0.5)
        first = False
        if found is not None:
            best, hi = found, found.peak - 1
        else:
            lo = cap + 1
            if status == "timeout":
                notes.append(f"cap={cap} not proven impossible (timed out)")
    return _finish(best, notes)


def _finish(best, notes):
    if best is None:
        return SearchOutcome(None, 0, "search", notes)
    best.notes = notes
    return best
