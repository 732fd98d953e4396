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
* regional probes: plain DFS thrashes when one tight time window has become unpackable but the
  section bounds cannot see it yet; the search then re-enumerates unrelated choices elsewhere.
  After each placement the window around the section with the least slack is solved on its
  own (its unplaced buffers only, every offset at least the current one), with a small node
  budget. No packing for the window means none for the whole, so the branch is cut. Probe
  results are cached: a found window packing stays valid while its buffers' minimum offsets
  stay below it, and a failure stays a failure while they stay above.
* a portfolio run side by side: where MiniMalloc restarts its preorders round robin under a
  doubling node budget, here one search per configuration (preorder, with or without probes)
  runs in turns of a few hundred nodes and none restarts, so the total is about (number of
  configurations) x (the luckiest one's work).
"""

from __future__ import annotations

import copy
import itertools
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ggmlrun.core.memory.intervals import columns, neighbours

_BIG = np.iinfo(np.int64).max // 4
# Preorder keys: T largest section total, W lifetime width, A area; "+probe" adds probing.
# Together they cover what differs between instances: which preorder is lucky, and whether
# thrashing needs probes (which cost more per node than they save where it does not).
HEURISTICS = ("TWA", "TAW", "TWA+probe", "WAT")
_RECENT_PROBES = 32
_SLICE = 256  # nodes per turn when preorders take turns


class _Stopped(Exception):
    """Another preorder's search settled the question; this one unwinds."""


class _ProbeAbort(Exception):
    """A probe ran out of nodes: it proves nothing, so the branch is kept."""


class _Timeout(Exception):
    """The wall-clock deadline passed."""


class _Baton:
    """Lets exactly one search thread run at a time, in a fixed rotation."""

    def __init__(self, n):
        self.cond = threading.Condition()
        self.turn = -1
        self.n = n
        self.done = [False] * n
        self.stop = False

    def begin(self):
        with self.cond:
            self.turn = 0
            self.cond.notify_all()

    def wait(self, i):
        with self.cond:
            while self.turn != i:
                self.cond.wait()

    def pass_on(self, i):
        with self.cond:
            self._advance(i)

    def finish(self, i):
        with self.cond:
            self.done[i] = True
            self._advance(i)

    def _advance(self, i):
        for step in range(1, self.n + 1):
            j = (i + step) % self.n
            if not self.done[j]:
                self.turn = j
                break
        self.cond.notify_all()


@dataclass
class SearchOutcome:
    """What a bounded search reached: offsets (list aligned with the input) or None."""

    offsets: list[int] | None
    peak: int
    method: str
    notes: list[str] = field(default_factory=list)


@dataclass
class _Part:
    """A sub-problem: its buffers (in preorder once searched) and its section range [lo, hi)."""

    buffers: np.ndarray
    lo: int
    hi: int
    mask: np.ndarray | None = None

    def members(self, n):
        if self.mask is None:
            self.mask = np.zeros(n, dtype=bool)
            self.mask[self.buffers] = True
        return self.mask


class Sweep:
    """Sections, partitions and cut counts of the buffers' lifetimes."""

    def __init__(self, lower, upper, size):
        n = len(size)
        points = sorted([(upper[i], 0, i) for i in range(n)] + [(lower[i], 1, i) for i in range(n)])
        live: set[int] = set()
        sections: list[list[int]] = []
        start = [0] * n
        self.s0 = np.zeros(n, dtype=np.int64)
        self.s1 = np.zeros(n, dtype=np.int64)
        groups: list[list[int]] = []
        part_lo = 0
        self.partitions: list[tuple[np.ndarray, int, int]] = []
        last_time = points[0][0] if points else 0
        for t, kind, i in points:
            if kind == 0:  # an end: the live set just before it is a cross section
                if last_time < t:
                    last_time = t
                    sections.append(sorted(live))
                live.discard(i)
                self.s0[i], self.s1[i] = start[i], len(sections)
                if not live:
                    self.partitions.append((np.array(groups[-1], dtype=np.int64), part_lo,
                                            len(sections)))
                    part_lo = len(sections)
            else:
                if not live:
                    groups.append([])
                groups[-1].append(i)
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

    def _solve_partition(self, buffers, lo, hi, heuristics):
        """Run one search per preorder side by side, taking turns of `_SLICE` nodes.

        One preorder can be lost for a long time where another finds a packing at once, and
        which one wins differs by instance. MiniMalloc restarts the preorders round robin
        under a doubling budget; taking turns instead keeps every search's progress, so the
        whole costs about (number of preorders) x (the luckiest one's nodes). The searches
        run in threads only to keep their recursion alive between turns: exactly one runs at
        any moment, handing over in a fixed rotation, so results are deterministic.
        """
        if len(heuristics) == 1:
            return self._run(buffers, lo, hi, heuristics[0]), heuristics[0]
        baton = _Baton(len(heuristics))
        workers = [self._worker(baton, i) for i in range(len(heuristics))]
        results: list[str | None] = [None] * len(heuristics)
        errors: list[BaseException] = []

        def body(i):
            baton.wait(i)
            try:
                if not baton.stop:
                    results[i] = workers[i]._run(buffers, lo, hi, heuristics[i])
                    baton.stop = baton.stop or results[i] != "stopped"
            except BaseException as error:  # re-raised below, in the caller's thread
                errors.append(error)
                baton.stop = True
            finally:
                baton.finish(i)

        old = threading.stack_size(64 << 20)
        try:
            threads = [threading.Thread(target=body, args=(i,), daemon=True)
                       for i in range(len(heuristics))]
        finally:
            threading.stack_size(old)
        for t in threads:
            t.start()
        baton.begin()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        for i, status in enumerate(results):
            if status in ("found", "infeasible", "timeout"):
                if status == "found":
                    self.solution[buffers] = workers[i].solution[buffers]
                return status, heuristics[i]
        return "timeout", heuristics[0]

    def _worker(self, baton, index):
        """A copy that shares the problem and the probe caches but has its own search state."""
        worker = copy.copy(self)
        worker.assigned = self.assigned.copy()
        worker.offset = self.offset.copy()
        worker.solution = self.solution.copy()
        worker.min_off = self.min_off.copy()
        worker.floor = self.floor.copy()
        worker.total = self.total.copy()
        worker.cuts = self.cuts.copy()
        worker.baton, worker.index = baton, index
        return worker

    def _run(self, buffers, lo, hi, config):
        """One preorder's search of one partition: found / infeasible / timeout / stopped."""
        heuristic, _, extra = config.partition("+")
        self.probes = self.allow_probes and extra == "probe"
        self._rank(heuristic)
        self.slice_left = _SLICE
        try:
            return "found" if self._subsolve(_Part(buffers, lo, hi), heuristic) else "infeasible"
        except _Timeout:
            return "timeout"
        except _Stopped:
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
                raise _ProbeAbort
        if not self.nodes & 63 and time.perf_counter() > self.deadline:
            raise _Timeout
        if self.baton is not None:
            self.slice_left -= 1
            if self.slice_left <= 0:
                self.slice_left = _SLICE
                self.baton.pass_on(self.index)
                self.baton.wait(self.index)
                if self.baton.stop:
                    raise _Stopped

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
        vals = np.where(self.assigned[seg], _BIG, self.min_off[seg])
        mins = np.minimum.reduceat(vals, sw.sec_ptr[lo:hi] - base)
        np.maximum(self.floor[lo:hi], np.where(mins < _BIG, mins, 0), out=self.floor[lo:hi])

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
            if inside.size and not self._subsolve(_Part(inside, lo, hi), heuristic):
                return False
        return True

    # ---- regional probes

    def _probe(self, part, heuristic, off):
        """False when the tightest window of this sub-problem provably cannot be packed."""
        lo, hi = part.lo, part.hi
        total = self.total[lo:hi]
        if not total.any():
            return True
        slack = self.capacity - np.maximum(self.floor[lo:hi], off) - total
        slack = np.where(total > 0, slack, _BIG)
        a, b = self._window(slack, int(slack.argmin()))
        a, b = a + lo, b + lo
        sw = self.sweep
        bufs = part.buffers
        window = bufs[~self.assigned[bufs] & (sw.s0[bufs] < b) & (sw.s1[bufs] > a)]
        lifted = np.maximum(self.min_off[window], off)
        known = self._probe_known(part, window, lifted, off)
        return known if known is not None else self._probe_run(heuristic, window, lifted, a, b)

    def _window(self, slack, k):
        """The run of sections around k within `margin` of its slack, plus two either side."""
        limit = int(slack[k]) + self.margin
        a, b = k, k + 1
        while a > 0 and slack[a - 1] <= limit:
            a -= 1
        while b < slack.size and slack[b] <= limit:
            b += 1
        return max(0, a - 2), min(slack.size, b + 2)

    def _probe_known(self, part, window, lifted, off):
        """A cached answer: a stored failure still applies, or a stored packing still fits."""
        members = part.members(self.n)
        for group, bound in self.probe_fail[-_RECENT_PROBES:]:
            if (members[group].all() and not self.assigned[group].any()
                    and (np.maximum(self.min_off[group], off) >= bound).all()):
                return False
        for packing in self.probe_ok[-_RECENT_PROBES:]:
            if (lifted <= packing[window]).all():
                return True
        return None

    def _probe_run(self, heuristic, window, lifted, a, b):
        saved_min = self.min_off[window]
        saved_floor = self.floor[a:b].copy()
        self.min_off[window] = lifted
        self._raise_floors(a, b)
        self.probing = True
        self.fixed = self.assigned.copy()
        self.probe_left = max(30, 4 * window.size)
        try:
            ok = self._subsolve(_Part(window.copy(), a, b), heuristic)
        except _ProbeAbort:
            return True
        finally:
            self.probing = False
            self.min_off[window] = saved_min
            self.floor[a:b] = saved_floor
        if ok:
            packing = np.full(self.n, -1, dtype=np.int64)
            packing[window] = self.solution[window]
            self.probe_ok.append(packing)
        else:
            self.probe_fail.append((window, lifted))
        return ok


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
