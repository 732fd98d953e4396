"""The scheduler: ggml_backend_sched_split_graph, pass by pass, every decision with its cause.

Backends come in priority order, the last one a CPU. Each backend has its own buffer type here
(a sim device's memory is not host memory), so a tensor can be used only where it lives, and
anything else is copied in at a split boundary, into `BACKEND#name`, once per compute.

Causes, as ggml's debug build names them: `usr` user pin; `1.dst` pre-allocated (a weight, a
view of one, a write into one); `1.vsrc` its view source's buffer; `1.inp` graph input (CPU);
`1.wgtN` the backend holding source N, a weight; `1.off` op offload of a CPU-weight op to a
device; `2.sup` spread from a neighbour that supports it; `3.best` the backend holding most of
its sources; `3.upg` upgraded to a higher priority backend of the same buffer type; `4.vsrc`
its view source's backend; `4.cur` a source placed with its consumer; `4.fb` first backend that
supports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import OPS
from ggmlrun.core.util.gcpause import gc_paused
from ggmlrun.core.util.ggml_version import GgmlVersion, ggml_version

COPY, COMPUTE = "copy", "compute"


@dataclass(frozen=True, eq=False)
class Step:
    """One copy or compute, in the order the executor runs them."""

    index: int
    kind: str                      # COPY | COMPUTE
    tensor: Tensor                 # the node, or the copy tensor (`BACKEND#name`)
    backend: int                   # where it runs: the split's backend
    split: int


@dataclass
class Split:
    backend: int
    nodes: list[Tensor]                       # in order, view ops included (they compute nothing)
    # each tensor living elsewhere -> its `BACKEND#name` copy, in the order they are met: the
    # one record of which copy holds what (inputs, copies and Schedule.copy_source read it)
    copy_of: dict[Tensor, Tensor] = field(default_factory=dict)

    @property
    def inputs(self) -> list[Tensor]:
        return list(self.copy_of)

    @property
    def copies(self) -> list[Tensor]:
        return list(self.copy_of.values())


@dataclass
class Schedule:
    graph: Graph
    backends: list[BackendSpec]
    backend_of: dict[Tensor, int]
    cause: dict[Tensor, str]
    splits: list[Split]
    srcs_of: dict[Tensor, list[Tensor]]       # each node's sources, copies substituted
    leaf_order: list[Tensor]                  # graph.leafs_by_first_use(), once, by pass 1
    reasons: dict[Tensor, str] = field(default_factory=dict)   # why a policy moved a node
    policy: object | None = None              # the PolicyOutcome, under --policy cost
    ggml: GgmlVersion = field(default_factory=lambda: ggml_version(None))   # whose rules

    @cached_property
    def copy_source(self) -> dict[Tensor, Tensor]:
        """copy -> the tensor it copies, read off the splits (splits are final once built)."""
        return {copy: source for split in self.splits for source, copy in split.copy_of.items()}

    @property
    def copy_count(self) -> int:
        return sum(len(s.copy_of) for s in self.splits)

    @property
    def copy_bytes(self) -> int:
        return sum(c.nbytes for s in self.splits for c in s.copies)

    def execution_steps(self) -> list[Step]:
        """Per split: its input copies, then its nodes minus the view ops (they compute nothing).
        The executor runs exactly these, in this order; traces and pictures index them."""
        steps: list[Step] = []
        for k, split in enumerate(self.splits):
            for copy in split.copies:
                steps.append(Step(len(steps), COPY, copy, split.backend, k))
            for node in split.nodes:
                if OPS[node.op].view_op:
                    continue
                steps.append(Step(len(steps), COMPUTE, node, self.backend_of[node], k))
        return steps

    def backend_name(self, tensor: Tensor) -> str:
        return self.backends[self.backend_of[tensor]].name


def support_key(node: Tensor) -> tuple:
    """What a backend's support answer depends on: the op and its sources' types."""
    return (node.op, *(src.dtype for src in node.src))


def batch_size(node: Tensor) -> int:
    """How many rows an op works on, for op offload (ggml-cuda's get_op_batch_size)."""
    if node.op == "get_rows":
        return 0
    if node.op == "mul_mat":
        return node.shape[-2] if len(node.shape) >= 2 else 1
    if node.op == "rope":
        return node.shape[-3] if len(node.shape) >= 3 else 1
    return math.prod(node.shape[:-1])


class Scheduler:
    def __init__(self, backends: list[BackendSpec], op_offload: bool = True,
                 ggml: GgmlVersion | str | None = None):
        self.backends = backends
        self.ggml = ggml_version(ggml)
        self.n = len(backends)
        self.cpu = self.n - 1
        self.op_offload = op_offload
        self.index = {b.name: i for i, b in enumerate(backends)}

    def schedule(self, graph: Graph, decided: dict[Tensor, tuple[int, str]] | None = None) -> Schedule:
        """Run the passes. `decided` holds assignments made elsewhere (a placement policy):
        like user pins, the passes never overwrite them, and the rest follows ggml's rules."""
        with gc_paused():
            return self._schedule(graph, decided)

    def _schedule(self, graph: Graph, decided: dict[Tensor, tuple[int, str]] | None) -> Schedule:
        self.graph = graph
        self._supported: list[dict[tuple, bool]] = [{} for _ in self.backends]   # per support key
        self._view_ops = frozenset(name for name, spec in OPS.items() if spec.view_op)
        self.backend_of: dict[Tensor, int] = {}
        self.cause: dict[Tensor, str] = {}
        self.location = self._weight_locations(graph)
        self._user_pins(graph)
        for tensor, (b, cause) in (decided or {}).items():
            if self._get(tensor) == -1:
                self._set(tensor, b, cause)
        leaf_order = graph.leafs_by_first_use()
        self._pass1_preallocated(leaf_order + graph.nodes)
        self._pass2_expand(graph.nodes)
        self._pass3_best_and_upgrade(graph.nodes)
        self._pass4_remaining(graph.nodes)
        splits, srcs_of = self._pass5_split(graph.nodes)
        return Schedule(graph=graph, backends=self.backends, backend_of=self.backend_of,
                        cause=self.cause, splits=splits, srcs_of=srcs_of,
                        leaf_order=leaf_order, ggml=self.ggml)

    # --- facts the passes use ---------------------------------------------------------------
    def _backend_index(self, name: str, tensor: Tensor, what: str) -> int:
        if name not in self.index:
            raise InputError(f"unknown backend '{name}' for {what}; {did_you_mean(name, self.index)}",
                             file=_file(self.graph), line=tensor.line, culprit=tensor.describe())
        return self.index[name]

    def _weight_locations(self, graph: Graph) -> dict[Tensor, int]:
        """Where each weight's buffer lives (ggml: tensor->buffer); the CPU by default."""
        where = {}
        for leaf in graph.weights:
            where[leaf] = (self.cpu if leaf.backend is None
                           else self._backend_index(leaf.backend, leaf, "its buffer"))
        return where

    def _buffer(self, tensor: Tensor) -> int | None:
        """The backend whose buffer already holds this tensor's bytes, if any."""
        return self.location.get(tensor.view_src or tensor)

    def _supports(self, b: int, node: Tensor) -> bool:
        return self._supports_key(b, support_key(node))

    def _supports_key(self, b: int, key: tuple) -> bool:
        if key[0] is None:                   # a leaf: nothing to compute
            return True
        known = self._supported[b]           # the answer depends on the op and source types
        answer = known.get(key)
        if answer is None:
            answer = known[key] = self.backends[b].supports_op(key[0], key[1:])
        return answer

    def _supports_buffer(self, b: int, buffer_backend: int) -> bool:
        # every backend has its own buffer type; none can use another's memory directly
        return b == buffer_backend

    def _buffer_supported(self, tensor: Tensor, b: int) -> bool:
        """ggml_backend_sched_buffer_supported: can backend b use this tensor where it is?"""
        where = self._buffer(tensor)
        if where is None:
            where = self.backend_of.get(tensor, -1)
            if where == -1 and tensor.view_src is not None:
                where = self.backend_of.get(tensor.view_src, -1)
            if where == -1:
                return False
        return self._supports_buffer(b, where)

    def _from_buffer(self, tensor: Tensor, op_node: Tensor) -> int:
        where = self._buffer(tensor)
        if where is None:
            return -1
        for b in range(self.n):
            if self._supports_buffer(b, where) and self._supports(b, op_node):
                return b
        return -1

    def _wants_offload(self, b: int, node: Tensor) -> bool:
        spec = self.backends[b]
        return spec.kind != "cpu" and batch_size(node) >= spec.offload_min_batch

    def _set(self, tensor: Tensor, b: int, cause: str) -> None:
        self.backend_of[tensor] = b
        self.cause[tensor] = cause

    def _get(self, tensor: Tensor | None) -> int:
        return -1 if tensor is None else self.backend_of.get(tensor, -1)

    # --- pass 0: user assignments, never overwritten -----------------------------------------
    def _user_pins(self, graph: Graph) -> None:
        for tensor in graph.nodes + graph.inputs:
            if tensor.backend is None:
                continue
            b = self._backend_index(tensor.backend, tensor, "its pin")
            if not self._supports(b, tensor):
                what = f"op '{tensor.op}'"
                if self.backends[b].supports_op(tensor.op):      # refused for a source type
                    what += f" on sources of type {', '.join(s.dtype for s in tensor.src)}"
                raise InputError(f"pinned to {tensor.backend}, which does not support {what}; "
                                 f"pin it elsewhere or drop it from that backend's "
                                 f"unsupported list", file=_file(graph), line=tensor.line,
                                 culprit=tensor.describe())
            self._set(tensor, b, "usr")

    # --- pass 1: from pre-allocated tensors, inputs and weights ------------------------------
    def _pass1_preallocated(self, tensors: list[Tensor]) -> None:
        """`tensors`: the leafs in first-use order, then the nodes."""
        get = self.backend_of.get
        for tensor in tensors:
            if get(tensor, -1) == -1:
                b, cause = self._from_current(tensor)
                if b != -1:
                    self._set(tensor, b, cause)

    def _from_current(self, node: Tensor) -> tuple[int, str]:
        where = self._buffer(node)
        if where is not None:     # (with no buffer, neither check below can find a backend)
            b = self._from_buffer(node, node)
            if b != -1:
                return b, "1.dst"
            if node.view_src is not None:
                b = self._from_buffer(node.view_src, node)
                if b != -1:
                    return b, "1.vsrc"
            raise InputError(
                f"writes into '{(node.view_src or node).name}', which lives on "
                f"{self.backends[where].name}, and {self.backends[where].name} does not support "
                f"op '{node.op}'; move that tensor to a backend that does",
                file=_file(self.graph), line=node.line, culprit=node.describe())
        if node.role == "input":
            return self.cpu, "1.inp"
        if node.op in self.ggml.weight_rule_skips:
            return -1, ""
        for i, src in enumerate(node.src):
            if src.role == "weight":
                src_b = self._from_buffer(src, node)
                if self.op_offload and src_b == self.cpu:
                    for b in range(src_b):
                        if self._supports(b, node) and self._wants_offload(b, node):
                            return b, "1.off"
                return src_b, f"1.wgt{i}"
        return -1, ""

    # --- pass 2: spread device assignments to neighbours, then any assignment ----------------
    def _pass2_expand(self, nodes: list[Tensor]) -> None:
        view_ops = self._view_ops
        compute = [n for n in nodes if n.op not in view_ops]
        # the four sweeps read and write a flat list of assignments (a big graph's tensors and
        # dict entries stay out of the cache); every change also goes to backend_of at once
        get, supports, cpu = self.backend_of.get, self._supports_key, self.cpu
        assigned = [get(n, -1) for n in compute]
        keys = [support_key(n) for n in compute]
        forward, backward = range(len(compute)), range(len(compute) - 1, -1, -1)
        for order, skip_cpu in ((forward, True), (backward, True),
                                (forward, False), (backward, False)):
            current = -1
            for i in order:
                b = assigned[i]
                if b != -1:
                    current = -1 if (skip_cpu and b == cpu) else b
                elif current != -1 and supports(current, keys[i]):
                    assigned[i] = current
                    self._set(compute[i], current, "2.sup")

    # --- pass 3: unassigned nodes to the backend holding most sources; upgrades -------------
    def _pass3_best_and_upgrade(self, nodes: list[Tensor]) -> None:
        view_ops, get, cause = self._view_ops, self.backend_of.get, self.cause
        for node in nodes:
            if node.op in view_ops:
                continue
            current = get(node, -1)
            if current == -1:
                best = -1
                for b in range(self.n):
                    if not self._supports(b, node):
                        continue
                    held = sum(1 for s in node.src
                               if (self._get(s) != -1 or self._get(s.view_src) != -1)
                               and self._buffer_supported(s, b))
                    if held > best:
                        best = held
                        self._set(node, b, "3.best")
            elif cause.get(node, "").startswith(("1.", "2.")):
                for b in range(current):
                    if (self._supports_buffer(b, current) and self._supports(b, node)
                            and all(self._buffer_supported(s, b) for s in node.src)):
                        self._set(node, b, "3.upg")
                        break

    # --- pass 4: views with their source, sources with their consumer, then a fallback ------
    def _pass4_remaining(self, nodes: list[Tensor]) -> None:
        get = self.backend_of.get
        for node in nodes:
            if node.view_src is not None and get(node, -1) == -1:
                self._set(node, self._get(node.view_src), "4.vsrc")
            for src in node.src:
                if get(src, -1) == -1:
                    if src.view_src is not None:
                        self._set(src, self._get(src.view_src), "4.vsrc")
                    else:
                        self._set(src, get(node, -1), "4.cur")
            if get(node, -1) != -1:
                continue
            for b in range(self.n):
                if get(node, -1) != -1:
                    break
                if self._supports(b, node):
                    self._set(node, b, "4.fb")
            if get(node, -1) == -1:
                raise InputError(f"no backend supports op '{node.op}' (the last backend must be "
                                 f"a CPU)", file=_file(self.graph), line=node.line,
                                 culprit=node.describe())

    # --- pass 5: cut into splits at backend changes; copy in what lives elsewhere -----------
    def _pass5_split(self, nodes: list[Tensor]):
        srcs_of = {node: list(node.src) for node in nodes}
        copy_of: dict[tuple[Tensor, int], Tensor] = {}
        view_ops, get = self._view_ops, self.backend_of.get
        compute = [n for n in nodes if n.op not in view_ops]
        first = self._get(compute[0]) if compute else self._get(nodes[0])
        splits = [Split(backend=first, nodes=[])]
        current = first
        for node in nodes:
            if node.op in view_ops:
                splits[-1].nodes.append(node)
                continue
            b = get(node, -1)
            split = splits[-1]
            if b != current or (split.copy_of and self._needs_new_split(node, split, current, copy_of)):
                split = Split(backend=b, nodes=[])
                splits.append(split)
                current = b
            split.nodes.append(node)
            for j, src in enumerate(node.src):
                if get(src, -1) != current and not self._buffer_supported(src, current):
                    key = (src, current)
                    if key not in copy_of:
                        copy = Tensor(name=f"{self.backends[current].name}#{src.name}",
                                      shape=src.shape, dtype=src.dtype, strides=src.strides,
                                      role="copy")
                        copy_of[key] = copy
                        self._set(copy, current, "4.cpy")
                        split.copy_of[src] = copy
                    srcs_of[node][j] = copy_of[key]
        if splits and not splits[0].nodes and len(splits) > 1:
            splits.pop(0)
        return splits, srcs_of

    def _needs_new_split(self, node: Tensor, split: Split, current: int, copy_of) -> bool:
        for src in node.src:
            # a weight on an incompatible backend: a new split lets its copy's memory be reused
            if src.role == "weight":
                if self._get(src) != current and not self._buffer_supported(src, current):
                    return True
            if len(split.copy_of) == self.ggml.max_split_inputs:
                if (self._get(src) != current and (src, current) not in copy_of
                        and not self._buffer_supported(src, current)):
                    return True
        return False


def _file(graph: Graph) -> str | None:
    return str(graph.path) if graph.path else None
