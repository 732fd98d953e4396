"""Exact offset search in the style of MiniMalloc (Moffitt, ASPLOS 2023), written anew.

The decision problem "do these buffers fit under `capacity`?" is answered by a depth-first
search that only ever places a buffer at a *canonical* offset: the lowest offset its already
placed time-neighbours allow (0 or the top of one of them). Any packing can be slid down into
one made of canonical offsets, and placing buffers in non-decreasing (offset, preorder index)
order names each canonical packing exactly once, so the search is complete and
non-redundant. What makes it fast:

* sections: the sweep cuts time into cross sections (the sets of buffers live just before
  some buffer ends). For each section the search keeps a floor (no unplaced buffer of the
  section can go below it) and the bytes still unplaced; floor + unplaced > capacity prunes.
  Because placements come in non-decreasing offset order, the floor is at least the offset
  just placed ("monotonic floor"), and at least the smallest minimum offset of the section's
  unplaced buffers ("unallocated floor").
* dominance: placing a buffer at or above the top some other unplaced buffer would have at
  its own minimum offset leaves a gap that buffer could fill, so such branches are skipped.
* dynamic ordering: children are tried lowest minimum offset first, ties by a static
  preorder (several preorders are tried round-robin with a growing node budget, since one
  preorder can be unlucky while another finds a packing at once).
* dynamic decomposition: once no unplaced buffer spans the boundary between two sections,
  the two sides are independent sub-problems and are solved one after the other, so a
  failure on one side never makes the search re-enumerate the other.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

EXP = {}
_BIG = np.iinfo(np.int64).max // 4
HEURISTICS = ("WAT", "TAW", "TWA")  # W width (lifetime), A area, T largest section total


class _Abort(Exception):
    """The node budget for this preorder ran out; try the next one."""


class _Timeout(Exception):
    """The wall-clock deadline passed."""


@dataclass
class SearchOutcome:
    """What a bounded search reached: offsets (list aligned with the input) or None."""

    offsets: list[int] | None
    peak: int
    method: str
    notes: list[str] = field(default_factory=list)


@dataclass
class _Part:
    """A sub-problem: its unplaced buffers in preorder, and its section range [lo, hi)."""

    buffers: np.ndarray
    lo: int
    hi: int


class Sweep:
    """Sections, partitions and the overlap graph of the active (conflicting) buffers."""

    def __init__(self, lower, upper, size):
        n = len(size)
        points = sorted([(upper[i], 0, i) for i in range(n)] + [(lower[i], 1, i) for i in range(n)])
        live: set[int] = set()
        sections: list[list[int]] = []
        start = [0] * n
        self.s0 = np.zeros(n, dtype=np.int64)
        self.s1 = np.zeros(n, dtype=np.int64)
        parts: list[tuple[list[int], int]] = []
        part_lo = 0
        self.partitions: list[tuple[np.ndarray, int, int]] = []
        last_time = points[0][0] if points else 0
        for t, kind, i in points:
            if kind == 0:
                if last_time < t:
                    last_time = t
                    sections.append(sorted(live))
                live.discard(i)
                self.s0[i], self.s1[i] = start[i], len(sections)
                if not live:
                    self.partitions.append((np.array(parts[-1][0], dtype=np.int64),
                                            part_lo, len(sections)))
                    part_lo = len(sections)
            else:
                if not live:
                    parts.append(([], part_lo))
                parts[-1][0].append(i)
                live.add(i)
                start[i] = len(sections)
        self.n_sections = len(sections)
        lengths = np.array([len(s) for s in sections], dtype=np.int64)
        self.sec_ptr = np.zeros(len(sections) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.sec_ptr[1:])
        self.sec_members = np.array([i for s in sections for i in s], dtype=np.int64)
        self.sec_total = np.zeros(len(sections), dtype=np.int64)
        np.add.at(self.sec_total, np.repeat(np.arange(len(sections)), lengths),
                  np.asarray(size, dtype=np.int64)[self.sec_members])
        self.cuts = np.zeros(max(len(sections), 1), dtype=np.int64)
        for i in range(n):
            self.cuts[self.s0[i]:self.s1[i] - 1] += 1


class Solver:
    """The decision procedure: find a packing under a capacity, or prove there is none."""

    def __init__(self, lower, upper, size, nbrs, alignment=1):
        self.size = np.asarray(size, dtype=np.int64)
        self.size_list = self.size.tolist()
        self.width = np.asarray(upper, dtype=np.int64) - np.asarray(lower, dtype=np.int64)
        self.nbrs = [np.asarray(x, dtype=np.int64) for x in nbrs]
        self.degree = np.array([len(x) for x in nbrs], dtype=np.int64)
        self.lower = np.asarray(lower, dtype=np.int64)
        self.upper = np.asarray(upper, dtype=np.int64)
        self.alignment = alignment
        self.sweep = Sweep(list(lower), list(upper), self.size_list)
        self.n = len(self.size)
        groups = {}
        for i, key in enumerate(zip(np.asarray(lower).tolist(), np.asarray(upper).tolist())):
            groups.setdefault(key, []).append(i)
        self.twins = [[j for j in groups[k] if j != i] for i, k in enumerate(zip(np.asarray(lower).tolist(), np.asarray(upper).tolist()))]
        self.nodes_visited = 0

    # ---- state

    def _reset(self, capacity, deadline, node_budget):
        sw = self.sweep
        self.capacity = capacity
        self.deadline = deadline
        self.nodes_left = node_budget
        self.assigned = np.zeros(self.n, dtype=bool)
        self.offset = np.full(self.n, -1, dtype=np.int64)
        self.solution = np.full(self.n, -1, dtype=np.int64)
        self.min_off = np.zeros(self.n, dtype=np.int64)
        self.floor = np.zeros(sw.n_sections, dtype=np.int64)
        self.total = sw.sec_total.copy()
        self.cuts = sw.cuts.copy()

    # ---- driver

    def solve(self, capacity, deadline, heuristics=HEURISTICS):
        """("found", offsets) / ("infeasible", None) / ("timeout", None).

        Preorders take turns under a node budget that doubles each round, as MiniMalloc
        does: a preorder that is stuck costs a bounded amount before another gets a turn.
        """
        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, 6 * self.n + 2000))
        try:
            budget = max(self.n, 1)
            while True:
                budget *= 2
                for h in heuristics:
                    self._reset(capacity, deadline, budget)
                    try:
                        ok = all(self._subsolve(_Part(b, lo, hi), h)
                                 for b, lo, hi in self.sweep.partitions)
                    except _Abort:
                        continue
                    except _Timeout:
                        return "timeout", None, h
                    return ("found", self.solution.tolist(), h) if ok else ("infeasible", None, h)
        finally:
            sys.setrecursionlimit(old_limit)

    def _preorder(self, buffers, heuristic):
        """Static order of a sub-problem's buffers: biggest-in-some-sense first."""
        sw = self.sweep
        pairs = np.empty(2 * buffers.size, dtype=np.int64)
        pairs[0::2], pairs[1::2] = sw.s0[buffers], sw.s1[buffers]
        totals = np.maximum.reduceat(np.append(self.total, 0), pairs)[0::2]
        keys = {"W": -self.width[buffers], "A": -self.width[buffers] * self.size[buffers],
                "T": -totals, "Z": -self.size[buffers],
                "C": -(sw.s1[buffers] - sw.s0[buffers]), "O": -self.degree[buffers],
                "L": -self.lower[buffers], "U": -self.upper[buffers]}
        order = np.lexsort([buffers] + [keys[c] for c in reversed(heuristic)])
        return buffers[order]

    def _subsolve(self, part, heuristic):
        part.buffers = self._preorder(part.buffers, heuristic)
        return self._search(part, heuristic, 0, 0)

    # ---- search

    def _search(self, part, heuristic, min_offset, min_pidx):
        self.nodes_left -= 1
        self.nodes_visited += 1
        if self.nodes_left < 0:
            raise _Abort
        if not self.nodes_visited & 63 and time.perf_counter() > self.deadline:
            raise _Timeout
        bufs = part.buffers
        pos = np.flatnonzero(~self.assigned[bufs])
        if pos.size == 0:
            self.solution[bufs] = self.offset[bufs]
            return True
        un = bufs[pos]
        offs = self.min_off[un]
        min_height = int((offs + self.size[un]).min())
        keep = (offs < min_height) & ((offs > min_offset) | ((offs == min_offset) & (pos >= min_pidx)))
        if not keep.any():
            return False
        un, offs, pos = un[keep], offs[keep], pos[keep]
        top = int(self.total[part.lo:part.hi].max())
        sizes = self.size[un]
        viable = offs + top - sizes <= self.capacity  # placing b lowers the tallest total by <= its size
        if not viable.all():
            un, offs, pos, sizes = un[viable], offs[viable], pos[viable], sizes[viable]
        order = np.argsort(offs, kind="stable")
        for b, off, p in zip(un[order].tolist(), offs[order].tolist(), pos[order].tolist()):
            if off + top > self.capacity and not self._rises_ok(part, b, off):
                continue
            if self._place_and_recurse(part, heuristic, b, off, p):
                return True
        return False

    def _twin_below(self, b, off):
        for x in self.twins[b]:
            if x > b and self.assigned[x] and self.offset[x] + self.size_list[x] == off:
                return True
        return False

    def _rises_ok(self, part, b, off):
        """The monotonic-floor test for placing `b` at `off`, before paying for the placement."""
        sw = self.sweep
        a0, a1 = int(sw.s0[b]), int(sw.s1[b])
        top = int((self.total[a0:a1] - self.size_list[b]).max())
        if part.lo < a0:
            top = max(top, int(self.total[part.lo:a0].max()))
        if a1 < part.hi:
            top = max(top, int(self.total[a1:part.hi].max()))
        return off + top <= self.capacity

    def _place_and_recurse(self, part, heuristic, b, off, p):
        sw = self.sweep
        size = self.size_list[b]
        height = off + size
        raised = -(-height // self.alignment) * self.alignment
        self.assigned[b] = True
        self.offset[b] = off
        nb = self.nbrs[b]
        changed = nb[~self.assigned[nb] & (self.min_off[nb] < raised)]
        saved_min = self.min_off[changed]
        self.min_off[changed] = raised
        a0, a1 = int(sw.s0[b]), int(sw.s1[b])
        lo, hi = a0, a1
        if changed.size:
            lo = min(lo, int(sw.s0[changed].min()))
            hi = max(hi, int(sw.s1[changed].max()))
        saved_floor = self.floor[lo:hi].copy()
        self.floor[a0:a1] = height
        self.total[a0:a1] -= size
        if changed.size:
            self._raise_floors(lo, hi)
        ok = False
        if (not changed.size or not EXP.get('single') or int((self.size[changed]).max()) + raised <= self.capacity) and (not EXP.get('thresh') or self._thresh(lo, hi)) and self._check(part, off):
            ok = self._decompose(part, heuristic, b, off, p)
        self.total[a0:a1] += size
        self.floor[lo:hi] = saved_floor
        self.min_off[changed] = saved_min
        self.assigned[b] = False
        self.offset[b] = -1
        return ok

    def _raise_floors(self, lo, hi):
        """A section's floor is at least the lowest minimum offset among its unplaced buffers."""
        sw = self.sweep
        base = sw.sec_ptr[lo]
        seg = sw.sec_members[base:sw.sec_ptr[hi]]
        vals = np.where(self.assigned[seg], _BIG, self.min_off[seg])
        mins = np.minimum.reduceat(vals, sw.sec_ptr[lo:hi] - base)
        np.maximum(self.floor[lo:hi], np.where(mins < _BIG, mins, 0), out=self.floor[lo:hi])

    def _thresh(self, lo, hi):
        sw = self.sweep
        base = sw.sec_ptr[lo]
        seg = sw.sec_members[base:sw.sec_ptr[hi]]
        secid = np.repeat(np.arange(lo, hi), np.diff(sw.sec_ptr[lo:hi+1]))
        un = ~self.assigned[seg]
        seg = seg[un]; secid = secid[un]
        if not seg.size: return True
        m = self.min_off[seg]
        o = np.lexsort((-m, secid))
        m = m[o]; sid = secid[o]; sz = self.size[seg[o]]
        cs = np.cumsum(sz)
        starts = np.flatnonzero(np.r_[True, sid[1:] != sid[:-1]])
        base_cs = np.repeat(cs[starts] - sz[starts], np.diff(np.r_[starts, sid.size]))
        return not bool(np.any(m + cs - base_cs > self.capacity))

    def _check(self, part, off):
        """Every section must still hold its unplaced bytes above its floor."""
        floor = self.floor[part.lo:part.hi]
        total = self.total[part.lo:part.hi]
        return not bool(np.any(np.maximum(floor, off) + total > self.capacity))

    def _decompose(self, part, heuristic, b, off, p):
        """Continue in this sub-problem, or split it where no unplaced buffer crosses."""
        sw = self.sweep
        self.solution[b] = off
        a0, a1 = int(sw.s0[b]), int(sw.s1[b])
        cuts = self.cuts[a0:a1 - 1]
        cuts -= 1
        zeros = (np.flatnonzero(cuts == 0) + a0 + 1).tolist()
        try:
            if not zeros:
                return self._search(part, heuristic, off, p)
            return self._solve_pieces(part, heuristic, [part.lo, *zeros, part.hi])
        finally:
            cuts += 1

    def _solve_pieces(self, part, heuristic, points):
        sw = self.sweep
        bufs = part.buffers[~self.assigned[part.buffers]]
        s0, s1 = sw.s0[bufs], sw.s1[bufs]
        for lo, hi in zip(points, points[1:]):
            inside = bufs[(s0 < hi) & (s1 > lo)]
            if inside.size and not self._subsolve(_Part(inside, lo, hi), heuristic):
                return False
        return True


def minimise_peak(buffers, lb, best_peak, capacity, alignment, deadline) -> SearchOutcome:
    """Search for the smallest peak reachable before `deadline`.

    With a capacity, one decision search under it. Without, first the lower bound (usually
    the optimum on real instances), then bisection between what is proven impossible or timed
    out and the best found. Offsets come back for every buffer; buffers that can never
    conflict (empty lifetime or size 0) sit at 0.
    """
    from ggmlrun.core.pack import _arrays, neighbours

    lower, upper, size, active = _arrays(buffers)
    idx = np.flatnonzero(active)
    if idx.size == 0:
        return SearchOutcome([0] * len(buffers), 0, "trivial")
    all_nbrs = neighbours(lower, upper, active)
    remap = {int(g): k for k, g in enumerate(idx.tolist())}
    nbrs = [[remap[j] for j in all_nbrs[g]] for g in idx.tolist()]
    solver = Solver(lower[idx], upper[idx], size[idx], nbrs, alignment)
    notes: list[str] = []
    best: SearchOutcome | None = None
    targets_done = 0

    def attempt(cap, share):
        now = time.perf_counter()
        status, offs, h = solver.solve(cap, min(deadline, now + share * (deadline - now)))
        notes.append(f"search cap={cap}: {status} ({h}, {time.perf_counter() - now:.2f}s)")
        if status != "found":
            return status, None
        full = [0] * len(buffers)
        for k, g in enumerate(idx.tolist()):
            full[g] = offs[k]
        peak = int(max(o + s for o, s in zip(full, size.tolist())))
        return status, SearchOutcome(full, peak, f"search:{h}")

    if capacity is not None:
        _, best = attempt(capacity, 1.0)
        return _finish(best, notes)
    lo, hi = lb, best_peak - 1
    while lo <= hi and time.perf_counter() < deadline:
        cap = lo if targets_done == 0 else (lo + hi) // 2
        targets_done += 1
        status, found = attempt(cap, 0.6 if targets_done == 1 else 0.5)
        if found is not None:
            best = found
            hi = found.peak - 1
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
