"""The executor: binds every tensor to its bytes, then runs the splits, timing copies and computes.

One `run_node` loop in the spirit of torch.fx's Interpreter: a failing kernel is reported as
"while executing node 'x' (op) on BACKEND". Copies really move bytes from one backend's memory
into another's arena, once per compute, exactly the copies the schedule lists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from ggmlrun.core.memory.alloc import MemoryPlan, layout_weights
from ggmlrun.core.backends import costs
from ggmlrun.core.backends.runtime import Backend, strided_view
from ggmlrun.core.util.errors import RunError
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.sched.scheduler import COMPUTE, COPY, Schedule


@dataclass
class BackendTiming:
    name: str
    kind: str
    copy_count: int = 0          # per compute
    copy_bytes: int = 0          # per compute
    copy_s: float = 0.0          # measured, all runs
    copy_modeled_s: float | None = None
    compute_count: int = 0       # nodes computed per compute
    compute_s: float = 0.0       # measured, all runs
    compute_modeled_s: float | None = None


@dataclass
class NodeTiming:
    node: Tensor
    backend: str
    seconds: float = 0.0         # all runs
    calls: int = 0


@dataclass
class StepEvent:
    """One copy or op of one run, in seconds since the run started (for traces)."""

    run: int
    kind: str                    # "copy" | "compute"
    tensor: Tensor               # the node, or the copy tensor
    backend: str
    start: float
    end: float


@dataclass
class RunResult:
    outputs: dict[str, np.ndarray]
    timings: list[BackendTiming]
    node_timings: list[NodeTiming]
    repeat: int
    copied_count: int            # tensors moved per compute, as executed
    copied_bytes: int
    events: list[StepEvent] = field(default_factory=list)
    run_seconds: list[float] = field(default_factory=list)   # wall time of each run


class Executor:
    def __init__(self, schedule: Schedule, plan: MemoryPlan, leaf_values: dict[Tensor, np.ndarray]):
        self.schedule = schedule
        self.plan = plan
        specs = schedule.backends
        alignments = [b.alignment for b in specs]
        location = {w: schedule.backend_of[w] for w in schedule.graph.weights}
        self.weight_offsets, weight_bytes = layout_weights(schedule.graph.weights, location, alignments)
        self.backends = [Backend(spec, plan.arena_bytes[i], weight_bytes[i])
                         for i, spec in enumerate(specs)]
        self.leaf_values = leaf_values
        self.views: dict[Tensor, np.ndarray] = {}
        self._bind()
        self._steps: list[tuple] | None = None             # compiled on the first run
        self._modeled: list[BackendTiming] | None = None   # the schedule's counts, once

    # --- binding: every tensor an ndarray at its planned bytes -------------------------------
    def _root_location(self, root: Tensor) -> tuple[np.ndarray, int]:
        if root.role == "weight":
            backend = self.backends[self.schedule.backend_of[root]]
            return backend.weights, self.weight_offsets[root]
        buffer, offset = self.plan.offset(root)
        return self.backends[buffer].arena, offset

    def _bind(self) -> None:
        graph = self.schedule.graph
        tensors = list(graph.leafs) + list(graph.nodes) + list(self.schedule.copy_source)
        for tensor in tensors:
            if tensor.role == "weight" or tensor in self.plan.slot_of:
                buffer, offset = self._root_location(tensor)
                self.views[tensor] = strided_view(buffer, offset, tensor)
        for tensor in graph.nodes:
            if tensor.is_view:
                buffer, offset = self._root_location(tensor.view_src)
                self.views[tensor] = strided_view(buffer, offset + tensor.view_offset, tensor)
        for weight in graph.weights:
            np.copyto(self.views[weight], self.leaf_values[weight])

    # --- running ---------------------------------------------------------------------------
    def _compile(self) -> list[tuple]:
        """The run as a flat list of steps, resolved once: per-node work in the loop is a call.

        Each step is (kind, backend, tensor, fn, args): running it is `fn(*args)`. A kernel
        with a fast path binds its arrays here (ops/common.py `fast_path`); any other is
        called unwrapped (the loop already ignores float errors) with its params bound.
        """
        steps = []
        sched = self.schedule
        for step in sched.execution_steps():
            tensor = step.tensor
            if step.kind == COPY:
                steps.append((COPY, step.backend, tensor, np.copyto,
                              (self.views[tensor], self.views[sched.copy_source[tensor]])))
                continue
            spec = get_op(tensor.op)
            args = (self.views[tensor], *(self.views[s] for s in sched.srcs_of[tensor]))
            kernel = spec.kernel
            bind = getattr(kernel, "bind", None)
            call = bind(*args, **tensor.params) if bind is not None else None
            if call is None:
                raw = getattr(kernel, "raw", kernel)
                call = (partial(raw, **tensor.params) if tensor.params else raw), args
            steps.append((COMPUTE, step.backend, tensor, *call))
        return steps

    def run(self, inputs: dict[Tensor, np.ndarray], repeat: int = 1, progress=None,
            record_events: bool = False) -> RunResult:
        if self._steps is None:          # views are fixed at bind, so steps are too
            self._steps = self._compile()
            self._calls = [(fn, args) for *_, fn, args in self._steps]
        steps, calls = self._steps, self._calls
        n = len(steps)
        seconds = np.zeros(n)
        events: list[tuple[int, int, float, float]] = []   # (run, step, start, end)
        clock = time.perf_counter
        input_views = [(self.views[t], inputs[t]) for t in self.schedule.graph.inputs]
        origin = clock()
        for run_index in range(repeat):
            for view, value in input_views:
                np.copyto(view, value)
            # one clock read per step: a step's time runs from the previous step's end to its own
            stamps = [clock()]
            stamp = stamps.append
            with np.errstate(all="ignore"):
                try:
                    for fn, args in calls:
                        fn(*args)
                        stamp(clock())
                except Exception as err:  # noqa: BLE001 - reported with the node that raised
                    raise self._failure(steps[len(stamps) - 1], err) from err
            if n:
                ends = np.array(stamps)
                seconds += np.diff(ends)
                if record_events:
                    ends = (ends - origin).tolist()
                    events += [(run_index, i, ends[i], ends[i + 1]) for i in range(n)]
            if progress:
                progress(run_index + 1)
        outputs = {t.name: np.array(self.views[t]) for t in self.schedule.graph.outputs}
        return self._result(steps, seconds.tolist(), events, outputs, repeat)

    def _failure(self, step, err: Exception) -> RunError:
        kind, b, tensor, *_ = step
        where = self.backends[b].name
        if kind == COPY:
            source = self.schedule.copy_source[tensor].name
            return RunError(f"while copying '{source}' to {where}: {type(err).__name__}: {err}")
        if isinstance(err, RunError):
            return RunError(f"while executing node '{tensor.name}' ({tensor.op}) on {where}: "
                            f"{err.message}")
        return RunError(f"while executing node '{tensor.name}' ({tensor.op}) on {where}: "
                        f"{type(err).__name__}: {err}")

    def _result(self, steps, seconds, events, outputs, repeat) -> RunResult:
        specs = self.schedule.backends
        if self._modeled is None:
            self._modeled = [BackendTiming(name=s.name, kind=s.kind) for s in specs]
            self._model(self._modeled)
        timings = [replace(t) for t in self._modeled]
        node_timings = []
        copied_count = copied_bytes = 0
        for (kind, b, tensor, *_), spent in zip(steps, seconds):
            if kind == COPY:
                timings[b].copy_s += spent
                copied_count += 1
                copied_bytes += tensor.nbytes
            else:
                timings[b].compute_s += spent
                node_timings.append(NodeTiming(tensor, specs[b].name, spent, repeat))
        trace = [StepEvent(run=r, kind=steps[i][0], tensor=steps[i][2],
                           backend=specs[steps[i][1]].name, start=t0, end=t1)
                 for r, i, t0, t1 in events]
        return RunResult(outputs=outputs, timings=timings, node_timings=node_timings,
                         repeat=repeat, copied_count=copied_count, copied_bytes=copied_bytes,
                         events=trace)

    def _model(self, timings: list[BackendTiming]) -> None:
        """Per-compute counts and modeled seconds, from the schedule alone (see costs.py)."""
        sched = self.schedule
        for split in sched.splits:
            dst = sched.backends[split.backend]
            t = timings[split.backend]
            for original, copy in zip(split.inputs, split.copies):
                t.copy_count += 1
                t.copy_bytes += copy.nbytes
                src = sched.backends[sched.backend_of[original]]
                if src.kind != "cpu" or dst.kind != "cpu":
                    t.copy_modeled_s = (t.copy_modeled_s or 0.0) + costs.copy_s(src, dst, copy.nbytes)
            for node in split.nodes:
                if get_op(node.op).view_op:
                    continue
                t.compute_count += 1
                t.compute_modeled_s = (t.compute_modeled_s or 0.0) + costs.compute_s(dst, node)
