"""Checks of a run made from what the executor actually did, not from the plan's own records.

`copy_problems` counts the copies a schedule must make from the graph alone (a compute node
reading a tensor that lives on another backend needs it copied there, once per compute) and
compares them with what the executor moved. `lifetime_problems` takes the executed step list,
finds each arena tensor's first and last use in it, and checks that no two tensors whose
bytes overlap (as bound: the arrays the kernels really wrote) are ever live at once; the
allocator's own free times are never read.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.run.exec import Executor, byte_span
from ggmlrun.core.sched.schedule import COPY


def home(sched, tensor) -> int:
    """The backend whose memory holds a tensor's bytes."""
    root = tensor.view_src or tensor
    if root.role == "weight":
        return sched.backend_of[root]
    return sched.backend_of.get(tensor, sched.backend_of.get(root))


def needed_copies(sched) -> tuple[Counter, Counter]:
    """(tensors, bytes) that must be copied into each backend per compute, from the graph."""
    pairs = set()
    for node in sched.graph.nodes:
        if get_op(node.op).view_op:
            continue
        here = sched.backend_of[node]
        for src in node.src:
            if home(sched, src) != here:
                pairs.add((src, here))
    count, nbytes = Counter(), Counter()
    for src, here in pairs:
        count[here] += 1
        nbytes[here] += src.nbytes
    return count, nbytes


def copy_problems(sched, result) -> list[str]:
    count, nbytes = needed_copies(sched)
    problems = []
    for b, timing in enumerate(result.timings):
        want = (count[b], nbytes[b])
        got = (timing.copy_count, timing.copy_bytes)
        if got != want:
            problems.append(f"{timing.name}: moved {got[0]} tensors / {got[1]} bytes per "
                            f"compute, the graph needs {want[0]} / {want[1]}")
    return problems


def step_lifetimes(executor: Executor) -> dict:
    """root tensor -> [first, last] step index using it; -1 is the input write before step 0,
    len(steps) the output read after the last."""
    sched = executor.schedule
    steps = [s.planned for s in executor.steps]
    span: dict = {}

    def use(tensor, i):
        root = tensor.view_src or tensor
        if root.role == "weight":
            return
        first, last = span.get(root, (i, i))
        span[root] = (min(first, i), max(last, i))

    for t in sched.graph.inputs:
        use(t, -1)
    for i, step in enumerate(steps):
        use(step.tensor, i)
        reads = ([sched.copy_source[step.tensor]] if step.kind == COPY
                 else sched.srcs_of[step.tensor])
        for src in reads:
            use(src, i)
    for t in sched.graph.outputs:
        use(t, len(steps))
    return span


def _written_reads(executor: Executor, i: int) -> tuple:
    sched = executor.schedule
    step = executor.steps[i].planned
    reads = [sched.copy_source[step.tensor]] if step.kind == COPY else sched.srcs_of[step.tensor]
    root = lambda t: t.view_src or t   # noqa: E731
    return root(step.tensor), {root(t) for t in reads}


def lifetime_problems(executor: Executor) -> list[str]:
    """Pairs of arena tensors live at the same step whose bound bytes overlap. Touching at one
    step is allowed only in place: that step writes the one and reads the other."""
    span = step_lifetimes(executor)
    ranges = {}
    for root in span:
        view = executor.views[root]
        low = np.lib.array_utils.byte_bounds(view)[0]
        ranges[root] = (low, low + byte_span(view))
    roots = sorted(span, key=lambda t: ranges[t][0])
    problems = []
    for i, a in enumerate(roots):
        for b in roots[i + 1:]:
            if ranges[b][0] >= ranges[a][1]:
                break
            if ranges[a][0] == ranges[a][1] or ranges[b][0] == ranges[b][1]:
                continue
            (a0, a1), (b0, b1) = span[a], span[b]
            if a1 < b0 or b1 < a0:
                continue
            if a1 == b0 or b1 == a0:
                early, late = (a, b) if a1 == b0 else (b, a)
                at = span[late][0]
                if at >= 0:
                    written, read = _written_reads(executor, at)
                    if written is late and early in read:
                        continue
            problems.append(f"'{a.name}' (steps {a0}..{a1}) and '{b.name}' (steps {b0}..{b1}) "
                            f"share bytes")
    return problems
