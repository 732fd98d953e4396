"""Regional probes for the exact offset search (pack_solver), added to MiniMalloc because
Python pays ~100x more per node than its C++.

Plain DFS thrashes when one tight time window has become unpackable but the section bounds
cannot see it yet; the search then re-enumerates unrelated choices elsewhere. After each
placement the window around the section with the least slack is solved on its own (its
unplaced buffers only, every offset at least the current one), with a small node budget. No
packing for the window means none for the whole, so the branch is cut. Probe results are
cached: a found window packing stays valid while its buffers' minimum offsets stay below it,
and a failure stays a failure while they stay above.
"""

from __future__ import annotations

import numpy as np

from ggmlrun.core.memory.pack_sections import BIG, Part

_RECENT_PROBES = 32


class ProbeAbort(Exception):
    """A probe ran out of nodes: it proves nothing, so the branch is kept."""


class Probes:
    """The probe half of the Solver: it reads and restores the search's state (floors, minimum
    offsets, the sweep) and runs a bounded sub-search with `_subsolve`."""


    def _probe(self, part, heuristic, off):
        """False when the tightest window of this sub-problem provably cannot be packed."""
        lo, hi = part.lo, part.hi
        total = self.total[lo:hi]
        if not total.any():
            return True
        slack = self.capacity - np.maximum(self.floor[lo:hi], off) - total
        slack = np.where(total > 0, slack, BIG)
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
            ok = self._subsolve(Part(window.copy(), a, b), heuristic)
        except ProbeAbort:
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
