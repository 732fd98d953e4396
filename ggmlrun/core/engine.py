"""The pipeline in one place: backends -> schedule -> memory plan -> capacity -> execution.

`prepare` and `plan_memory` are the first stages every command shares; `run_pipeline` is the
whole of `ggmlrun run`. Each returns plain result objects the report layer renders; the CLI
only parses options and renders what comes back.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggmlrun.core.backends.spec import BackendSpec, default_backends
from ggmlrun.core.frontend.loader import load_backends, load_graph
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.memory.alloc import GraphAllocator, MemoryPlan, allocation_sequence, layout_weights
from ggmlrun.core.run.exec import Executor, RunResult
from ggmlrun.core.sched.scheduler import Schedule, Scheduler
from ggmlrun.core.util.errors import CapacityError
from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.core.util.ggml_version import GgmlVersion


@dataclass
class BackendMemory:
    name: str
    kind: str
    arena_bytes: int
    weights_bytes: int
    lower_bound_bytes: int
    no_reuse_bytes: int
    memory: int
    ggml_arena_bytes: int        # what ggml's online allocator needs on the same schedule
    planner: str                 # which plan `arena_bytes` is: "ggml" | "best"


def resolve_backends(graph: Graph, override: list[BackendSpec] | None) -> list[BackendSpec]:
    """--backends wins over the file's `backends:`, which wins over the default set."""
    return override or graph.backends or default_backends()


def prepare(graph_path: Path, backends_path: Path | None = None, policy: str = "ggml",
            ggml: GgmlVersion | str | None = None) -> tuple[Graph, Schedule]:
    """Load a graph file (and a backends file, when given) and schedule it."""
    graph = load_graph(graph_path)
    override = load_backends(backends_path) if backends_path else None
    return graph, schedule(graph, resolve_backends(graph, override), policy, ggml)


POLICIES = ("ggml", "cost")


def schedule(graph: Graph, backends: list[BackendSpec], policy: str = "ggml",
             ggml: GgmlVersion | str | None = None) -> Schedule:
    """`ggml`: ggml's passes, faithfully. `cost`: placement by modeled time (policy.py), kept
    only when it is faster than ggml's and fits in memory. `ggml` picks whose rules (0.15 or
    0.25); the schedule carries the choice on to the allocator."""
    if policy == "ggml":
        return Scheduler(backends, ggml=ggml).schedule(graph)
    from ggmlrun.core.sched.policy import CostPolicy

    def fits(sched: Schedule) -> bool:
        _, memory = plan_memory(sched)
        return all(m.weights_bytes + m.arena_bytes <= m.memory for m in memory)

    outcome = CostPolicy(backends, ggml=ggml).place(graph, fits)
    outcome.schedule.policy = outcome
    return outcome.schedule


PLANNERS = ("ggml", "best")


def plan_memory(sched: Schedule, planner: str = "ggml") -> tuple[MemoryPlan, list[BackendMemory]]:
    """The measure pass: every arena sized, with its lower bound and no-reuse size beside it.

    `ggml` is ggml's allocator, faithfully; `best` re-places the same slots offline and keeps,
    per arena, whichever plan is smaller.
    """
    alignments = [b.alignment for b in sched.backends]
    leafs, entries = allocation_sequence(sched)
    ggml_plan = GraphAllocator(alignments, ggml=sched.ggml).plan(leafs, entries)
    plan = ggml_plan
    if planner == "best":
        from ggmlrun.core.memory.planner import best_plan

        plan = best_plan(ggml_plan)
    plan.weights = layout_weights(sched)        # the one layout: the executor binds to it
    memory = [BackendMemory(name=spec.name, kind=spec.kind, arena_bytes=plan.arena_bytes[i],
                            weights_bytes=plan.weights.bytes[i], lower_bound_bytes=plan.lower_bound(i),
                            no_reuse_bytes=plan.no_reuse_bytes(i), memory=spec.memory,
                            ggml_arena_bytes=ggml_plan.arena_bytes[i], planner=planner)
              for i, spec in enumerate(sched.backends)]
    return plan, memory


def check_capacity(sched: Schedule, memory: list[BackendMemory]) -> None:
    """Fail before allocating anything when weights plus arena exceed a backend's memory."""
    for i, mem in enumerate(memory):
        need = mem.weights_bytes + mem.arena_bytes
        if need <= mem.memory:
            continue
        here = [t for t in sched.graph.leafs + sched.graph.nodes
                if sched.backend_of.get(t) == i and not t.is_view]
        largest = sorted(here, key=lambda t: t.nbytes, reverse=True)[:3]
        names = ", ".join(f"{t.name} ({human_bytes(t.nbytes)})" for t in largest)
        raise CapacityError(
            f"backend {mem.name} needs {need} bytes ({human_bytes(need)}: weights "
            f"{human_bytes(mem.weights_bytes)} + arena {human_bytes(mem.arena_bytes)}) but its "
            f"memory is {mem.memory} bytes ({human_bytes(mem.memory)}); largest tensors: {names}; "
            f"raise its `memory` or move weights to another backend",
            file=str(sched.graph.path) if sched.graph.path else None)


def leaf_values(graph: Graph) -> dict[Tensor, np.ndarray]:
    """Every leaf's data: generated, given inline, or read from its .npy."""
    from ggmlrun.core.frontend.data import leaf_array

    return {t: leaf_array(t, graph.seed) for t in graph.leafs}


def execute(sched: Schedule, plan: MemoryPlan, leaf_values: dict[Tensor, np.ndarray],
            inputs: dict[Tensor, np.ndarray] | None = None, repeat: int = 1,
            progress=None, record_events: bool = False) -> RunResult:
    executor = Executor(sched, plan, leaf_values)
    feed = {t: leaf_values[t] for t in sched.graph.inputs}
    feed.update(inputs or {})
    with blas_threads(sched.backends[-1].threads):
        return executor.run(feed, repeat=repeat, progress=progress, record_events=record_events)


def blas_threads(threads: int | None):
    """The CPU backend's `threads` caps BLAS threads for the run (one BLAS serves every
    backend here, since sim devices compute with the same kernels)."""
    if threads is None:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")


# --- `ggmlrun run`: the whole pipeline ------------------------------------------------------
@dataclass
class RunRequest:
    """What `ggmlrun run` was asked to do, options parsed, nothing yet read."""

    graph_path: Path
    backends_path: Path | None = None
    input_specs: tuple[str, ...] = ()        # NAME=FILE.npy
    repeat: int = 1
    check: bool = False
    policy: str = "ggml"
    planner: str = "best"
    trace_path: Path | None = None
    out_path: Path | None = None
    profile: bool = False
    ggml: str | None = None                  # whose rules: "0.15" | "0.25"


@dataclass
class RunOutcome:
    graph: Graph
    schedule: Schedule
    plan: MemoryPlan
    memory: list[BackendMemory]
    result: RunResult
    summaries: dict[str, dict]               # per output: shape, dtype, sum, l2
    errors: dict[str, float] | None = None   # per output, with `check`: relative error
    profile: object | None = None            # observe.profile.Profile, with `profile`

    @property
    def check_failure(self) -> str | None:
        """Why `--check` fails (the worst output), or None when it passes or was not asked."""
        from ggmlrun.core.run.results import check_passed

        if self.errors is None or check_passed(self.graph, self.errors):
            return None
        worst = max(self.errors, key=self.errors.get)
        return (f"output '{worst}' differs from the reference evaluator by "
                f"{self.errors[worst]:.3e} (relative)")


def run_pipeline(request: RunRequest, planning=contextlib.nullcontext,
                 progress=lambda: contextlib.nullcontext()) -> RunOutcome:
    """Load, schedule, measure, check capacity, compute, then summarise and write outputs.

    `planning()` wraps the steps before any memory is taken (a spinner); `progress()` wraps the
    compute and yields a `progress(done)` callback or None (a bar): the caller owns the screen.
    """
    from ggmlrun.core.frontend.data import load_input_override
    from ggmlrun.core.run import results

    with planning():
        graph, sched = prepare(request.graph_path, request.backends_path, request.policy,
                               request.ggml)
        inputs = dict(load_input_override(graph, spec) for spec in request.input_specs)
        plan, memory = plan_memory(sched, request.planner)
    check_capacity(sched, memory)
    values = leaf_values(graph)
    with progress() as report_progress:
        result = execute(sched, plan, values, inputs=inputs, repeat=request.repeat,
                         progress=report_progress,
                         record_events=bool(request.trace_path or request.profile))
    outcome = RunOutcome(graph=graph, schedule=sched, plan=plan, memory=memory, result=result,
                         summaries={name: results.summarize(arr)
                                    for name, arr in result.outputs.items()})
    if request.profile:
        from ggmlrun.core.observe.profile import profile

        outcome.profile = profile(sched, result)
    if request.trace_path:
        from ggmlrun.core.observe.trace import build_trace

        results.write_text(request.trace_path, json.dumps(build_trace(sched, plan, result),
                                                          default=results.json_default))
    if request.check:
        outcome.errors = results.compare_with_reference(graph, values, inputs, result.outputs)
    if request.out_path:
        results.write_npz(request.out_path, result.outputs)
    return outcome
