"""The executor: binds every tensor to its bytes, then runs the splits, timing copies and computes.

One `run_node` loop in the spirit of torch.fx's Interpreter: a failing kernel is reported as
"while executing node 'x' (op) on BACKEND". Copies really move bytes from one backend's memory
into another's arena, once per compute, exactly the copies the schedule lists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ggmlrun.core.alloc import MemoryPlan, layout_weights
from ggmlrun.core.backends.runtime import Backend, modeled_copy_s, strided_view
from ggmlrun.core.errors import RunError
from ggmlrun.core.graph import Tensor
from ggmlrun.core.ops import get_op
from ggmlrun.core.sched import Schedule


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
class RunResult:
    outputs: dict[str, np.ndarray]
    timings: list[BackendTiming]
    node_timings: list[NodeTiming]
    repeat: int
    copied_count: int            # tensors moved per compute, as executed
    copied_bytes: int


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
    def run(self, inputs: dict[Tensor, np.ndarray], repeat: int = 1, progress=None) -> RunResult:
        specs = self.schedule.backends
        timings = [BackendTiming(name=s.name, kind=s.kind) for s in specs]
        per_node = {n: NodeTiming(n, self.schedule.backend_name(n))
                    for n in self.schedule.graph.nodes if not get_op(n.op).view_op}
        self._model(timings)
        copied = [0, 0]
        for run_index in range(repeat):
            for tensor in self.schedule.graph.inputs:
                np.copyto(self.views[tensor], inputs[tensor])
            copied = [0, 0]
            with np.errstate(all="ignore"):
                for split in self.schedule.splits:
                    self._copy_inputs(split, timings[split.backend], copied)
                    for node in split.nodes:
                        self.run_node(node, timings, per_node)
            if progress:
                progress(run_index + 1)
        outputs = {t.name: np.array(self.views[t]) for t in self.schedule.graph.outputs}
        return RunResult(outputs=outputs, timings=timings, node_timings=list(per_node.values()),
                         repeat=repeat, copied_count=copied[0], copied_bytes=copied[1])

    def _copy_inputs(self, split, timing: BackendTiming, copied: list[int]) -> None:
        for original, copy in zip(split.inputs, split.copies):
            start = time.perf_counter()
            np.copyto(self.views[copy], self.views[original])
            timing.copy_s += time.perf_counter() - start
            copied[0] += 1
            copied[1] += copy.nbytes

    def run_node(self, node: Tensor, timings: list[BackendTiming], per_node: dict) -> None:
        spec = get_op(node.op)
        if spec.view_op:
            return
        b = self.schedule.backend_of[node]
        srcs = [self.views[s] for s in self.schedule.srcs_of[node]]
        start = time.perf_counter()
        try:
            spec.kernel(self.views[node], *srcs, **node.params)
        except Exception as err:  # noqa: BLE001 - reported with the node that raised it
            raise RunError(f"while executing node '{node.name}' ({node.op}) on "
                           f"{self.backends[b].name}: {type(err).__name__}: {err}") from err
        elapsed = time.perf_counter() - start
        timings[b].compute_s += elapsed
        entry = per_node[node]
        entry.seconds += elapsed
        entry.calls += 1

    def _model(self, timings: list[BackendTiming]) -> None:
        """Per-compute counts and modeled seconds, from the schedule alone."""
        sched = self.schedule
        for split in sched.splits:
            dst = self.backends[split.backend]
            t = timings[split.backend]
            for original, copy in zip(split.inputs, split.copies):
                src = self.backends[sched.backend_of[original]]
                t.copy_count += 1
                t.copy_bytes += copy.nbytes
                modeled = modeled_copy_s(src, dst, copy.nbytes)
                if modeled is not None:
                    t.copy_modeled_s = (t.copy_modeled_s or 0.0) + modeled
            for node in split.nodes:
                op = get_op(node.op)
                if op.view_op:
                    continue
                t.compute_count += 1
                srcs = sched.srcs_of[node]
                moved = node.nbytes + sum(s.nbytes for s in srcs)
                modeled = dst.modeled_compute_s(op.count_flops(node, node.src), moved)
                if modeled is not None:
                    t.compute_modeled_s = (t.compute_modeled_s or 0.0) + modeled
