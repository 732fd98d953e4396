"""The pipeline in one place: backends -> schedule -> memory plan -> capacity -> execution.

`prepare` and `plan_memory` are the first stages every command shares; `run_pipeline` is the
whole of `ggmlrun run`. Each returns plain result objects the report layer renders; the CLI
only parses options and renders what comes back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ggmlrun.core.backends.spec import BackendSpec, default_backends
from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.core.frontend.loader import load_graph
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.sched.schedule import Schedule
from ggmlrun.core.sched.scheduler import Scheduler
from ggmlrun.core.util.errors import CapacityError
from ggmlrun.core.util.gcpause import gc_paused
from ggmlrun.core.util.ggml_version import GgmlVersion
from ggmlrun.core.util.numbers import MAX_BYTES

if TYPE_CHECKING:     # the allocator and the executor load when a command plans or runs
    import numpy as np

    from ggmlrun.core.memory.alloc import MemoryPlan
    from ggmlrun.core.run.exec import RunResult


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
            ggml: GgmlVersion | str | None = None, overrides=None,
            phases=None) -> tuple[Graph, Schedule]:
    """Load a graph file (and a backends file, when given), apply the command line's
    `overrides` (frontend/overrides.py) and schedule it; `phases(name)` times each step."""
    from ggmlrun.core.frontend.overrides import apply

    phase = phases or _no_phase
    with phase("load"):
        graph = load_graph(graph_path)
        override = load_backends(backends_path) if backends_path else None
        backends = resolve_backends(graph, override)
        if overrides is not None:
            backends = apply(graph, backends, overrides)
    with phase("schedule"):
        return graph, schedule(graph, backends, policy, ggml)


def _no_phase(name: str):
    return contextlib.nullcontext()


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
    with gc_paused():        # the whole pass: bounds and weight layout too (util/gcpause.py)
        return _plan_memory(sched, planner)


def _plan_memory(sched: Schedule, planner: str) -> tuple[MemoryPlan, list[BackendMemory]]:
    from ggmlrun.core.memory.alloc import GraphAllocator, layout_weights
    from ggmlrun.core.memory.sequence import allocation_sequence

    alignments = [b.alignment for b in sched.backends]
    leafs, entries = allocation_sequence(sched)
    sizers = [b.alloc_size if b.row_padding else None for b in sched.backends]
    ggml_plan = GraphAllocator(alignments, ggml=sched.ggml, sizers=sizers).plan(leafs, entries)
    plan = ggml_plan
    # the offline planner packs in int64: an arena past 1 EiB (a graph of many 2**60-byte
    # nodes) fits no memory anyway, and is reported on ggml's plan as not fitting (exit 1)
    if planner == "best" and max(ggml_plan.arena_bytes, default=0) <= MAX_BYTES:
        from ggmlrun.core.memory.planner import best_plan

        plan = best_plan(ggml_plan)
    plan.weights = layout_weights(sched)        # the one layout: the executor binds to it
    memory = [BackendMemory(name=spec.name, kind=spec.kind, arena_bytes=plan.arena_bytes[i],
                            weights_bytes=plan.weights.bytes[i], lower_bound_bytes=plan.lower_bound(i),
                            no_reuse_bytes=plan.no_reuse_bytes(i), memory=spec.memory,
                            ggml_arena_bytes=ggml_plan.arena_bytes[i], planner=planner)
              for i, spec in enumerate(sched.backends)]
    return plan, memory


def check_capacity(sched: Schedule, memory: list[BackendMemory], host_memory: int | None = None,
                   fit=None):
    """Fail before allocating anything when weights plus arena exceed a backend's memory, or
    all backends together the machine's RAM (fits.py); returns the figures when it fits.
    `fit`: the figures already worked out for this plan (a report showed them), not redone."""
    from ggmlrun.core.memory.fits import check, failure_message

    fit = fit if fit is not None else check(memory, host_memory)
    problem = failure_message(sched, fit)
    if problem:
        raise CapacityError(problem, file=str(sched.graph.path) if sched.graph.path else None)
    return fit


def measure_graph(graph: Graph, backends: list[BackendSpec], policy: str = "ggml",
                  planner: str = "ggml") -> list[BackendMemory]:
    """Schedule and measure in one step, for searches that try many placements."""
    return plan_memory(schedule(graph, backends, policy), planner)[1]


def leaf_values(graph: Graph) -> dict[Tensor, np.ndarray]:
    """Every leaf's data: generated, given inline, or read from its .npy."""
    from ggmlrun.core.frontend.data import leaf_array

    return {t: leaf_array(t, graph.seed) for t in graph.leafs}


def execute(sched: Schedule, plan: MemoryPlan, leaf_values: dict[Tensor, np.ndarray],
            inputs: dict[Tensor, np.ndarray] | None = None, repeat: int = 1,
            progress=None, record_events: bool = False, warmup: int = 0) -> RunResult:
    """`warmup` runs first, untimed; each timed run's wall time lands in `run_seconds`."""
    import time

    from ggmlrun.core.run.exec import Executor

    executor = Executor(sched, plan, leaf_values)
    feed = {t: leaf_values[t] for t in sched.graph.inputs}
    feed.update(inputs or {})
    ends = []

    def tick(done: int) -> None:
        ends.append(time.perf_counter())
        if progress:
            progress(done)

    with blas_threads(sched.backends[-1].threads):
        if warmup:
            executor.run(feed, repeat=warmup)
        ends.append(time.perf_counter())
        result = executor.run(feed, repeat=repeat, progress=tick, record_events=record_events)
    result.run_seconds = [b - a for a, b in zip(ends, ends[1:])]
    return result


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
    profile_by: str = "op"                   # op | node | shape
    profile_sort: str = "total"
    profile_top: int | None = None
    ggml: str | None = None                  # whose rules: "0.15" | "0.25"
    overrides: object | None = None          # frontend.overrides.Overrides
    warmup: int = 0


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


def run_pipeline(request: RunRequest, phases=None,
                 progress=lambda: contextlib.nullcontext()) -> RunOutcome:
    """Load, schedule, measure, check capacity, compute, then summarise and write outputs.

    `phases(name)` wraps each step (load, schedule, plan, data, compute: the caller times or
    shows them); the capacity check comes before any data is generated or allocated.
    `progress()` wraps the compute and yields a `progress(done)` callback or None (a bar).
    """
    from ggmlrun.core.frontend.data import load_input_override
    from ggmlrun.core.run import results

    phase = phases or _no_phase
    check_run_outputs(request)
    graph, sched = prepare(request.graph_path, request.backends_path, request.policy,
                           request.ggml, request.overrides, phases)
    check_run_outputs(request, graph)
    with phase("load"):
        inputs = dict(load_input_override(graph, spec) for spec in request.input_specs)
    with phase("plan"):
        plan, memory = plan_memory(sched, request.planner)
    check_capacity(sched, memory)
    check_run_ram(graph, memory, request.check)
    with phase("data"):
        values = leaf_values(graph)
    with phase("compute"), progress() as report_progress:
        result = execute(sched, plan, values, inputs=inputs, repeat=request.repeat,
                         progress=report_progress, warmup=request.warmup,
                         record_events=bool(request.trace_path or request.profile))
    outcome = RunOutcome(graph=graph, schedule=sched, plan=plan, memory=memory, result=result,
                         summaries={name: results.summarize(arr)
                                    for name, arr in result.outputs.items()})
    if request.profile:
        from ggmlrun.core.observe.profile import profile

        outcome.profile = profile(sched, result, request.profile_by, request.profile_sort,
                                  request.profile_top)
    if request.trace_path:
        from ggmlrun.core.observe.trace import build_trace
        from ggmlrun.core.util.strict_json import strict_json

        results.write_text(request.trace_path, strict_json(build_trace(sched, plan, result)))
    if request.check:
        outcome.errors = results.compare_with_reference(graph, values, inputs, result.outputs,
                                                        request.repeat)
    if request.out_path:
        results.write_npz(request.out_path, result.outputs)
    return outcome


def files_read(graph_path, backends_path=None, input_specs=(), graph: Graph | None = None) -> list:
    """Every file a run reads: outputs must never replace one of them."""
    files = [graph_path, backends_path]
    files += [spec.partition("=")[2].strip() for spec in input_specs]
    if graph is not None:
        files += [t.data.file for t in graph.leafs if t.data is not None and t.data.file]
    return [f for f in files if f]


def check_run_outputs(request: RunRequest, graph: Graph | None = None) -> None:
    """`--out` and `--trace` refused before any work (util/outputs.py); again once the graph
    names the .npy files it reads."""
    from ggmlrun.core.util.outputs import check_output

    reads = files_read(request.graph_path, request.backends_path, request.input_specs, graph)
    if request.out_path is not None:
        check_output(request.out_path, "--out", inputs=reads,
                     others=[("--trace", request.trace_path)], suffixes=(".npz",))
    if request.trace_path is not None:
        check_output(request.trace_path, "--trace", inputs=reads)


def check_run_ram(graph: Graph, memory: list[BackendMemory], check: bool) -> None:
    """The whole run's arrays against the machine's free memory, before any is made: every
    backend's weights and arena, and with --check the reference's copy of every node."""
    from ggmlrun.core.util.ram import ensure_memory

    need = sum(m.arena_bytes + m.weights_bytes for m in memory)
    if check:
        need += sum(t.nbytes for t in graph.nodes)
    ensure_memory(need, "this run" + (" with --check's reference" if check else ""))
