"""Several searches of one partition, one per preorder, taking turns: the portfolio of the
exact offset search (pack_solver).

Where MiniMalloc restarts its preorders round robin under a doubling node budget, here one
search per configuration (preorder, with or without probes) runs in turns of a few hundred
nodes and none restarts, so the total is about (number of configurations) x (the luckiest
one's work).
"""

from __future__ import annotations

import copy
import threading

SLICE = 256  # nodes per turn when preorders take turns


class Stopped(Exception):
    """Another preorder's search settled the question; this one unwinds."""


class Baton:
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


class Portfolio:
    """The turn-taking half of the Solver: runs `_run` once per preorder, each in its own
    worker copy of the search state."""

    def _solve_partition(self, buffers, lo, hi, heuristics):
        """Run one search per preorder side by side, taking turns of `SLICE` nodes.

        One preorder can be lost for a long time where another finds a packing at once, and
        which one wins differs by instance. MiniMalloc restarts the preorders round robin
        under a doubling budget; taking turns instead keeps every search's progress, so the
        whole costs about (number of preorders) x (the luckiest one's nodes). The searches
        run in threads only to keep their recursion alive between turns: exactly one runs at
        any moment, handing over in a fixed rotation, so results are deterministic.
        """
        if len(heuristics) == 1:
            return self._run(buffers, lo, hi, heuristics[0]), heuristics[0]
        baton = Baton(len(heuristics))
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
