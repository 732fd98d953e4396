"""The executor: binds every tensor to its bytes, then runs the schedule's steps, timing each.

Each schedule step is compiled once into an `ExecStep` (the step, a function and its bound
arrays) and run by `run_node`, in the spirit of torch.fx's Interpreter: a failing kernel is
reported as "while executing node 'x' (op) on BACKEND". Copies really move bytes from one
backend's memory into another's arena, and the executor counts what they moved as they move
it, so the copy figures a run reports are what happened, not what the schedule promised.

A copy of CPU-resident expert weights into a device that computes the mul_mat_id (op offload)
moves only the experts the router picked, as ggml 0.25.3's ggml_backend_sched_compute_splits
does (moe_copy.py): its bytes, and its modeled seconds, follow the ids of each run.

Threads: the CPU backend's `threads` (else every core this process may use) become the
run's `Workers`, which mul_mat shares a big product's panels among (ops/panels.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from ggmlrun.core.backends import costs
from ggmlrun.core.backends.runtime import Backend, strided_view
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.ir.ops.panels import Workers
from ggmlrun.core.memory.alloc import MemoryPlan
from ggmlrun.core.run.moe_copy import expert_copy
from ggmlrun.core.sched.schedule import COPY, Schedule, Step
from ggmlrun.core.util import host
from ggmlrun.core.util.errors import RunError


@dataclass
class BackendTiming:
    name: str
    kind: str
    copy_count: int = 0          # tensors the executor copied into it, per compute
    copy_bytes: int = 0          # bytes it copied into it, per compute
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
    events: list[StepEvent] = field(default_factory=list)
    run_seconds: list[float] = field(default_factory=list)   # wall time of each run
    # bytes a copy moved over the timed runs where that is not its whole tensor times the runs
    # (the expert copies, moe_copy.py)
    copy_moved: dict[Tensor, int] = field(default_factory=dict)

    @property
    def copied_count(self) -> int:
        """Tensors moved per compute, as executed."""
        return sum(t.copy_count for t in self.timings)

    @property
    def copied_bytes(self) -> int:
        return sum(t.copy_bytes for t in self.timings)


@dataclass(frozen=True, slots=True)
class ExecStep:
    """A schedule step bound to its arrays: running it is `fn(*args)`."""

    planned: Step
    fn: Callable
    args: tuple


def byte_span(arr: np.ndarray) -> int:
    """Bytes from an array's first byte to its last (ggml_nbytes of a strided tensor)."""
    if arr.size == 0:
        return 0
    low, high = np.lib.array_utils.byte_bounds(arr)
    return high - low


class Executor:
    def __init__(self, schedule: Schedule, plan: MemoryPlan, leaf_values: dict[Tensor, np.ndarray],
                 threads: int | None = None):
        """`threads`: None takes the CPU backend's `threads`, else every usable core."""
        if plan.weights is None:
            raise ValueError("the memory plan has no weight layout: plan it with engine.plan_memory")
        self.schedule = schedule
        self.plan = plan
        self.backends = [Backend(spec, plan.arena_bytes[i], plan.weights.bytes[i])
                         for i, spec in enumerate(schedule.backends)]
        self.leaf_values = leaf_values
        cpu_threads = next((b.threads for b in schedule.backends if b.kind == "cpu"), None)
        self.workers = Workers(threads or cpu_threads or host.cores())
        self.views: dict[Tensor, np.ndarray] = {}
        self._bind()
        self.steps: list[ExecStep] | None = None          # compiled on the first run
        self._modeled: list[costs.Modeled] | None = None
        # what the copy steps moved, per destination backend, over every run so far
        self.moved_count = [0] * len(self.backends)
        self.moved_bytes = [0] * len(self.backends)
        # modeled seconds the expert copies saved against copying the whole tensor, per backend
        self.moved_saved_s = [0.0] * len(self.backends)
        self.moved_by_copy: dict[Tensor, int] = {}       # the expert copies' bytes, all runs

    # --- binding: every tensor an ndarray at its planned bytes -------------------------------
    def _root_location(self, root: Tensor) -> tuple[np.ndarray, int]:
        if root.role == "weight":
            backend = self.backends[self.schedule.backend_of[root]]
            return backend.weights, self.plan.weights.offsets[root]
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

    # --- compiling: each step resolved once, so per-node work in the loop is one call --------
    def _compile(self) -> list[ExecStep]:
        sched = self.schedule
        self._written = {n.view_src for n in sched.graph.nodes
                         if n.is_view and not get_op(n.op).view_op}
        return [self._compile_copy(step) if step.kind == COPY else self._compile_compute(step)
                for step in sched.execution_steps()]

    def _compile_copy(self, step: Step) -> ExecStep:
        experts = expert_copy(self, step)
        if experts is not None:
            return ExecStep(step, experts, ())
        dst = self.views[step.tensor]
        src = self.views[self.schedule.copy_source[step.tensor]]
        span, b = byte_span(dst), step.backend
        count, nbytes = self.moved_count, self.moved_bytes

        def move(dst, src):
            np.copyto(dst, src)
            count[b] += 1
            nbytes[b] += span
        return ExecStep(step, move, (dst, src))

    def _compile_compute(self, step: Step) -> ExecStep:
        """A kernel with a fast path binds its arrays here (ops/common.py `fast_path`); any
        other is called unwrapped (the run loop already ignores float errors), params bound."""
        tensor = step.tensor
        args = (self.views[tensor], *(self.views[s] for s in self.schedule.srcs_of[tensor]))
        kernel = get_op(tensor.op).kernel
        bind = getattr(kernel, "bind", None)
        context = {}
        if getattr(kernel, "binds_run_context", False):
            context = {"workers": self.workers,
                       "constant": tuple(map(self._constant, self.schedule.srcs_of[tensor]))}
        call = bind(*args, **tensor.params, **context) if bind is not None else None
        if call is None:
            raw = getattr(kernel, "raw", kernel)
            call = (partial(raw, **tensor.params) if tensor.params else raw), args
        return ExecStep(step, *call)

    def _constant(self, tensor: Tensor) -> bool:
        """A weight no node writes into (set_rows, cpy): its bytes are fixed once bound."""
        root = tensor.view_src or tensor
        return root.op is None and root.role == "weight" and root not in self._written

    # --- running ---------------------------------------------------------------------------
    def run_node(self, step: ExecStep) -> None:
        """Run one step (to step through a run by hand); any failure comes back as a RunError
        naming the node or the copy. `run` inlines this in its loop, with the same errors."""
        try:
            step.fn(*step.args)
        except Exception as err:  # noqa: BLE001 - reported with the node that raised
            raise self._failure(step.planned, err) from err

    def run(self, inputs: dict[Tensor, np.ndarray], repeat: int = 1, progress=None,
            record_events: bool = False) -> RunResult:
        if self.steps is None:           # views are fixed at bind, so steps are too
            self.steps = self._compile()
        steps = self.steps
        n = len(steps)
        seconds = np.zeros(n)
        events: list[tuple[int, int, float, float]] = []   # (run, step, start, end)
        clock = time.perf_counter
        input_views = [(self.views[t], inputs[t]) for t in self.schedule.graph.inputs]
        moved_before = list(self.moved_count), list(self.moved_bytes), list(self.moved_saved_s)
        by_copy_before = dict(self.moved_by_copy)
        origin = clock()
        for run_index in range(repeat):
            for view, value in input_views:
                np.copyto(view, value)
            # one clock read per step: a step's time runs from the previous step's end to its own
            stamps = [clock()]
            stamp = stamps.append
            with np.errstate(all="ignore"):
                try:
                    for step in steps:         # run_node, inlined: a call per node is 10% here
                        step.fn(*step.args)
                        stamp(clock())
                except Exception as err:  # noqa: BLE001 - reported with the node that raised
                    raise self._failure(steps[len(stamps) - 1].planned, err) from err
            if n:
                ends = np.array(stamps)
                seconds += np.diff(ends)
                if record_events:
                    ends = (ends - origin).tolist()
                    events += [(run_index, i, ends[i], ends[i + 1]) for i in range(n)]
            if progress:
                progress(run_index + 1)
        outputs = {t.name: np.array(self.views[t]) for t in self.schedule.graph.outputs}
        moved = ([c - c0 for c, c0 in zip(self.moved_count, moved_before[0])],
                 [c - c0 for c, c0 in zip(self.moved_bytes, moved_before[1])],
                 [c - c0 for c, c0 in zip(self.moved_saved_s, moved_before[2])])
        result = self._result(seconds.tolist(), events, outputs, repeat, moved)
        result.copy_moved = {c: n - by_copy_before.get(c, 0) for c, n in self.moved_by_copy.items()}
        return result

    def _failure(self, step: Step, err: Exception) -> RunError:
        where = self.backends[step.backend].name
        tensor = step.tensor
        if step.kind == COPY:
            source = self.schedule.copy_source[tensor].name
            return RunError(f"while copying '{source}' to {where}: {type(err).__name__}: {err}")
        detail = err.message if isinstance(err, RunError) else f"{type(err).__name__}: {err}"
        return RunError(f"while executing node '{tensor.name}' ({tensor.op}) on {where}: {detail}")

    def _result(self, seconds, events, outputs, repeat, moved) -> RunResult:
        specs = self.schedule.backends
        if self._modeled is None:        # the schedule's, so the same for every run
            self._modeled = costs.modeled_by_backend(self.schedule)
        modeled = self._modeled
        timings = [BackendTiming(name=s.name, kind=s.kind,
                                 copy_modeled_s=(m.copy_s if m.copy_s is None
                                                 else m.copy_s - moved[2][b] / repeat),
                                 compute_modeled_s=m.compute_s,
                                 copy_count=moved[0][b] // repeat, copy_bytes=moved[1][b] // repeat)
                   for b, (s, m) in enumerate(zip(specs, modeled))]
        node_timings = []
        for step, spent in zip(self.steps, seconds):
            planned = step.planned
            if planned.kind == COPY:
                timings[planned.backend].copy_s += spent
            else:
                timings[planned.backend].compute_s += spent
                timings[planned.backend].compute_count += 1
                node_timings.append(NodeTiming(planned.tensor, specs[planned.backend].name, spent,
                                               repeat))
        trace = [StepEvent(run=r, kind=self.steps[i].planned.kind, tensor=self.steps[i].planned.tensor,
                           backend=specs[self.steps[i].planned.backend].name, start=t0, end=t1)
                 for r, i, t0, t1 in events]
        return RunResult(outputs=outputs, timings=timings, node_timings=node_timings,
                         repeat=repeat, events=trace)
