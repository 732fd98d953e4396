"""The cross sections of the buffers' lifetimes, as MiniMalloc's search reads them: the sweep
cuts time into sections (the buffers live just before some buffer ends), groups the buffers
into independent partitions, and counts how many buffers cross each section boundary (where
no unplaced buffer crosses, the two sides can be solved one after the other).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BIG = np.iinfo(np.int64).max // 4     # no floor, no slack: above any offset


@dataclass
class Part:
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
