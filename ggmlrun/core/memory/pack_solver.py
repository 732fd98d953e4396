"""Exact offset search in the style of MiniMalloc (Moffitt, ASPLOS 2023), written anew.

The decision problem "do these buffers fit under `capacity`?" is answered by a depth-first
search that only ever places a buffer at a *canonical* offset: the lowest offset its already
placed time-neighbours allow (0 or the top of one of them). Any packing can be slid down into
one made of canonical offsets, and placing buffers in non-decreasing (offset, preorder index)
order names each canonical packing once, so the search is complete and non-redundant.

From MiniMalloc:

* sections: the sweep cuts time into cross sections (the buffers live just before some buffer
  ends). Each keeps a floor (no unplaced buffer of it can go lower) and its unplaced bytes;
  floor + unplaced > capacity prunes. Since offsets only grow along a branch, every floor is
  at least the offset just placed ("monotonic floor"), and at least the lowest minimum offset
  among the section's unplaced buffers ("unallocated floor").
* dominance: placing a buffer at or above the top that another unplaced buffer would have at
  its own minimum offset leaves a gap that buffer could fill, so such children are skipped.
* dynamic ordering: children are tried lowest minimum offset first, ties by a static preorder
  (largest section total, lifetime width, area, in some order); one preorder can be lost for
  a long time where another finds a packing at once.
* dynamic decomposition: once no unplaced buffer spans the boundary between two sections, the
  sides are independent and are solved one after the other.

Added here, because Python pays ~100x more per node than MiniMalloc's C++:

* twin symmetry: two buffers with the same lifetime stacked directly on each other can swap
  places without changing anything else, so only one order is allowed (the one the search
  tries first anyway). Swapping keeps sum(size * offset) and fixes an inversion, so a packing
  minimising (that sum, inversions) is both canonical, undominated and twin-ordered: the
  search stays complete.
* regional probes (pack_probes), and a portfolio of preorders run side by side, taking
  turns (pack_turns).

The smallest peak (bisection over this decision search) is pack_search's.
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np

from ggmlrun.core.memory.pack_probes import ProbeAbort, Probes
from ggmlrun.core.memory.pack_sections import BIG, Part, Sweep
from ggmlrun.core.memory.pack_turns import SLICE, Portfolio, Stopped

# Preorder keys: T largest section total, W lifetime width, A area; "+probe" adds probing.
# Together they cover what differs between instances: which preorder is lucky, and whether
# thrashing needs probes (which cost more per node than they save where it does not).
HEURISTICS = ("TWA", "TAW", "TWA+probe", "WAT")


class _Timeout(Exception):
    """The wall-clock deadline passed."""


class Solver(Probes, Portfolio):
    """The decision procedure: find a packing under a capacity, or prove there is none."""

    def __init__(self, lower, upper, size, nbrs, alignment=1, probes=True):
        self.n = len(size)
        self.size = np.asarray(size, dtype=np.int64)
        self.size_list = self.size.tolist()
        self.lower = np.asarray(lower, dtype=np.int64)
        self.upper = np.asarray(upper, dtype=np.int64)
        self.width = self.upper - self.lower
        self.nbrs = [np.asarray(x, dtype=np.int64) for x in nbrs]
        self.alignment = alignment
        self.allow_probes = self.probes = probes
        self.sweep = Sweep(self.lower.tolist(), self.upper.tolist(), self.size_list)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, key in enumerate(zip(self.lower.tolist(), self.upper.tolist())):
            groups.setdefault(key, []).append(i)
        self.twins = [[j for j in groups[k] if j != i]
                      for i, k in enumerate(zip(self.lower.tolist(), self.upper.tolist()))]
        self.nodes = 0
        self.capacity = None
        self.baton = None

    # ---- driver

    def solve(self, capacity, deadline, heuristics=HEURISTICS):
        """("found" | "infeasible" | "timeout", offsets list or None, preorders used).

        Top-level partitions are independent, so each gets its own round of preorders.
        """
        self._reset(capacity, deadline)
        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, 8 * self.n + 2000))
        used = []
        try:
            for buffers, lo, hi in self.sweep.partitions:
                status, h = self._solve_partition(buffers, lo, hi, heuristics)
                used.append(h)
                if status != "found":
                    return status, None, used
            return "found", self.solution.tolist(), used
        finally:
            sys.setrecursionlimit(old_limit)

    def _reset(self, capacity, deadline):
        sw = self.sweep
        self.deadline = deadline
        self.assigned = np.zeros(self.n, dtype=bool)
        self.offset = np.full(self.n, -1, dtype=np.int64)
        self.solution = np.full(self.n, -1, dtype=np.int64)
        self.min_off = np.zeros(self.n, dtype=np.int64)
        self.floor = np.zeros(sw.n_sections, dtype=np.int64)
        self.total = sw.sec_total.copy()
        self.cuts = sw.cuts.copy()
        self.probing = False
        self.fixed = None
        if capacity != self.capacity:  # probe results only hold for one capacity
            self.capacity = capacity
            self.margin = max(capacity // 64, 1)
            self.probe_ok: list[np.ndarray] = []
            self.probe_fail: list[tuple[np.ndarray, np.ndarray]] = []

    def _run(self, buffers, lo, hi, config):
        """One preorder's search of one partition: found / infeasible / timeout / stopped."""
        heuristic, _, extra = config.partition("+")
        self.probes = self.allow_probes and extra == "probe"
        self._rank(heuristic)
        self.slice_left = SLICE
        try:
            return "found" if self._subsolve(Part(buffers, lo, hi), heuristic) else "infeasible"
        except _Timeout:
            return "timeout"
        except Stopped:
            return "stopped"

    # ---- ordering

    def _rank(self, heuristic):
        """Global preorder rank, used to orient twin symmetry the way the search leans."""
        self.rank = np.empty(self.n, dtype=np.int64)
        self.rank[self._preorder(np.arange(self.n), heuristic)] = np.arange(self.n)
        self.rank_list = self.rank.tolist()

    def _preorder(self, buffers, heuristic):
        """Static order of a sub-problem's buffers, biggest in the heuristic's sense first."""
        sw = self.sweep
        pairs = np.empty(2 * buffers.size, dtype=np.int64)
        pairs[0::2], pairs[1::2] = sw.s0[buffers], sw.s1[buffers]
        totals = np.maximum.reduceat(np.append(self.total, 0), pairs)[0::2]
        keys = {"W": -self.width[buffers], "A": -self.width[buffers] * self.size[buffers],
                "T": -totals, "Z": -self.size[buffers]}
        order = np.lexsort([buffers] + [keys[c] for c in reversed(heuristic)])
        return buffers[order]

    # ---- search

    def _subsolve(self, part, heuristic):
        part.buffers = self._preorder(part.buffers, heuristic)
        return self._search(part, heuristic, 0, 0)

    def _tick(self):
        self.nodes += 1
        if self.probing:
            self.probe_left -= 1
            if self.probe_left < 0:
                raise ProbeAbort
        if not self.nodes & 63 and time.perf_counter() > self.deadline:
            raise _Timeout
        if self.baton is not None:
            self.slice_left -= 1
            if self.slice_left <= 0:
                self.slice_left = SLICE
                self.baton.pass_on(self.index)
                self.baton.wait(self.index)
                if self.baton.stop:
                    raise Stopped

    def _search(self, part, heuristic, min_offset, min_pidx):
        self._tick()
        bufs = part.buffers
        pos = np.flatnonzero(~self.assigned[bufs])
        if pos.size == 0:
            self.solution[bufs] = self.offset[bufs]
            return True
        for b, off, p in self._children(part, bufs[pos], pos, min_offset, min_pidx):
            if self._twin_below(b, off):
                continue
            if self._place_and_recurse(part, heuristic, b, off, p):
                return True
        return False

    def _children(self, part, un, pos, min_offset, min_pidx):
        """Canonical, undominated, monotone-feasible children, lowest offset first."""
        offs = self.min_off[un]
        min_height = int((offs + self.size[un]).min())
        keep = (offs < min_height) & ((offs > min_offset)
                                      | ((offs == min_offset) & (pos >= min_pidx)))
        if keep.any():
            un, offs, pos = un[keep], offs[keep], pos[keep]
            keep = self._rises_ok(part, un, offs)
        if not keep.any():
            return []
        un, offs, pos = un[keep], offs[keep], pos[keep]
        order = np.argsort(offs, kind="stable")
        return zip(un[order].tolist(), offs[order].tolist(), pos[order].tolist())

    def _rises_ok(self, part, cand, offs):
        """The monotonic-floor test for every candidate at once, before any is placed.

        Placing c at `off` lifts every section's floor to `off`, so each must hold its unplaced
        bytes, less c's own in c's sections, above it. The largest such total comes from the
        prefix/suffix maxima outside c's sections and one segmented max inside them.
        """
        sw = self.sweep
        lo, hi = part.lo, part.hi
        tot = self.total[lo:hi]
        top = int(tot.max())
        ok = offs + top <= self.capacity
        if ok.all():
            return ok
        sizes = self.size[cand]
        unsure = ~ok & (offs + top - sizes <= self.capacity)
        if not unsure.any():
            return ok
        c = cand[unsure]
        a0 = np.clip(sw.s0[c] - lo, 0, hi - lo)
        a1 = np.clip(sw.s1[c] - lo, 0, hi - lo)
        pairs = np.empty(2 * c.size, dtype=np.int64)
        pairs[0::2], pairs[1::2] = a0, a1
        inside = np.maximum.reduceat(np.append(tot, 0), pairs)[0::2] - sizes[unsure]
        prefix = np.concatenate(([0], np.maximum.accumulate(tot)))
        suffix = np.concatenate((np.maximum.accumulate(tot[::-1])[::-1], [0]))
        after = np.maximum(inside, np.maximum(prefix[a0], suffix[a1]))
        ok[unsure] = offs[unsure] + after <= self.capacity
        return ok

    def _twin_below(self, b, off):
        """Is b about to sit directly on a same-lifetime buffer that should be above it?

        Inside a probe, buffers placed by the main search are fixed, not swappable.
        """
        rank_b = self.rank_list[b]
        for x in self.twins[b]:
            if (self.assigned[x] and rank_b < self.rank_list[x]
                    and self.offset[x] + self.size_list[x] == off
                    and not (self.probing and self.fixed[x])):
                return True
        return False

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
        try:
            if changed.size:
                self._raise_floors(lo, hi)
            return self._check(part, off) and self._decompose(part, heuristic, b, off, p)
        finally:
            self.total[a0:a1] += size
            self.floor[lo:hi] = saved_floor
            self.min_off[changed] = saved_min
            self.assigned[b] = False
            self.offset[b] = -1

    def _raise_floors(self, lo, hi):
        """A section's floor is at least the lowest minimum offset among its unplaced buffers."""
        sw = self.sweep
        base = sw.sec_ptr[lo]
        seg = sw.sec_members[base:sw.sec_ptr[hi]]
        vals = np.where(self.assigned[seg], BIG, self.min_off[seg])
        mins = np.minimum.reduceat(vals, sw.sec_ptr[lo:hi] - base)
        np.maximum(self.floor[lo:hi], np.where(mins < BIG, mins, 0), out=self.floor[lo:hi])

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
        try:
            zeros = [z for z in (np.flatnonzero(cuts == 0) + a0 + 1).tolist()
                     if part.lo < z < part.hi]
            if zeros:  # the pieces restart at offset 0, so no probe (it assumes >= off)
                return self._solve_pieces(part, heuristic, [part.lo, *zeros, part.hi])
            if self.probes and not self.probing and not self._probe(part, heuristic, off):
                return False
            return self._search(part, heuristic, off, p)
        finally:
            cuts += 1

    def _solve_pieces(self, part, heuristic, points):
        sw = self.sweep
        bufs = part.buffers[~self.assigned[part.buffers]]
        s0, s1 = sw.s0[bufs], sw.s1[bufs]
        for lo, hi in itertools.pairwise(points):
            inside = bufs[(s0 < hi) & (s1 > lo)]
            if inside.size and not self._subsolve(Part(inside, lo, hi), heuristic):
                return False
        return True
