"""The pipeline in one place: backends -> schedule -> memory plan -> capacity -> execution.

The CLI calls these in order; each returns plain result objects the report layer renders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggmlrun.core.memory.alloc import GraphAllocator, MemoryPlan, allocation_sequence, layout_weights
from ggmlrun.core.backends.spec import BackendSpec, default_backends
from ggmlrun.core.util.errors import CapacityError
from ggmlrun.core.run.exec import Executor, RunResult
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.sched.scheduler import Schedule, Scheduler


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


POLICIES = ("ggml", "cost")


def schedule(graph: Graph, backends: list[BackendSpec], policy: str = "ggml") -> Schedule:
    """`ggml`: ggml's passes, faithfully. `cost`: placement by modeled time (policy.py), kept
    only when it is faster than ggml's and fits in memory."""
    if policy == "ggml":
        return Scheduler(backends).schedule(graph)
    from ggmlrun.core.sched.policy import CostPolicy

    def fits(sched: Schedule) -> bool:
        _, memory = plan_memory(sched)
        return all(m.weights_bytes + m.arena_bytes <= m.memory for m in memory)

    outcome = CostPolicy(backends).place(graph, fits)
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
    ggml_plan = GraphAllocator(alignments).plan(leafs, entries)
    plan = ggml_plan
    if planner == "best":
        from ggmlrun.core.memory.planner import best_plan

        plan = best_plan(ggml_plan)
    location = {w: sched.backend_of[w] for w in sched.graph.weights}
    _, weights_bytes = layout_weights(sched.graph.weights, location, alignments)
    memory = [BackendMemory(name=spec.name, kind=spec.kind, arena_bytes=plan.arena_bytes[i],
                            weights_bytes=weights_bytes[i], lower_bound_bytes=plan.lower_bound(i),
                            no_reuse_bytes=plan.no_reuse_bytes(i), memory=spec.memory,
                            ggml_arena_bytes=ggml_plan.arena_bytes[i], planner=planner)
              for i, spec in enumerate(sched.backends)]
    return plan, memory


def check_capacity(sched: Schedule, memory: list[BackendMemory], host_memory: int | None = None):
    """Fail before allocating anything when weights plus arena exceed a backend's memory, or
    all backends together the machine's RAM (fits.py); returns the figures when it fits."""
    from ggmlrun.core.memory.fits import check, failure_message

    fit = check(memory, host_memory)
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
    import contextlib

    if threads is None:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")
