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
supports it (schedule.CAUSES holds the same legend, which `plan` prints).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from itertools import chain

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import OPS
from ggmlrun.core.util.gcpause import gc_paused
from ggmlrun.core.sched.schedule import Schedule, Split, number
from ggmlrun.core.util.ggml_version import GgmlVersion, ggml_version


def support_key(node: Tensor) -> tuple:
    """What a backend's support answer depends on: the op and its sources' types (and for
    FLASH_ATTN_EXT, which a device profile may refuse by head size, K's and V's head sizes)."""
    op, srcs = node.op, node.src
    if op == "flash_attn_ext":
        k, v = srcs[1], srcs[2]
        return (op, *[src.dtype for src in srcs], k.shape[-1], v.shape[-1])
    if len(srcs) == 1:                    # most nodes: asked once per node and schedule
        return (op, srcs[0].dtype)
    if len(srcs) == 2:
        return (op, srcs[0].dtype, srcs[1].dtype)
    return (op, *[src.dtype for src in srcs])


def batch_size(node: Tensor) -> int:
    """How many rows an op works on, for op offload (ggml-cuda's get_op_batch_size)."""
    if node.op == "get_rows":
        return 0
    if node.op == "mul_mat":
        return node.shape[-2] if len(node.shape) >= 2 else 1
    if node.op in ("rope", "mul_mat_id"):        # ggml's ne[2]: tokens
        return node.shape[-3] if len(node.shape) >= 3 else 1
    return math.prod(node.shape[:-1])


WEIGHT_CAUSES = tuple(f"1.wgt{i}" for i in range(16))   # one string each, not one per node


class Scheduler:
    def __init__(self, backends: list[BackendSpec], op_offload: bool = True,
                 ggml: GgmlVersion | str | None = None, n_copies: int = 1):
        """`n_copies` is ggml_backend_sched's: 1, or GGML_SCHED_MAX_COPIES when the scheduler
        was made with `parallel` (llama.cpp's pipeline parallelism, models/reserve.py)."""
        if n_copies < 1:
            raise InputError(f"the scheduler needs at least one copy, got {n_copies}")
        self.n_copies = n_copies
        self.backends = backends
        self.ggml = ggml_version(ggml)
        self.n = len(backends)
        self.cpu = self.n - 1
        self.op_offload = op_offload
        self.index = {b.name: i for i, b in enumerate(backends)}

    def schedule(self, graph: Graph, decided: dict[Tensor, tuple[int, str]] | None = None,
                 placed: Mapping[Tensor, str | None] | None = None) -> Schedule:
        """Run the passes. `decided` holds assignments made elsewhere (a placement policy):
        like user pins, the passes never overwrite them, and the rest follows ggml's rules.
        `placed`: backend names that stand for Tensor.backend (a weight's buffer, a node's pin;
        None: none), so one graph can be scheduled under many placements without being
        written on (models/reserve.py). Each call works on tables of its own (_Scheduling), so
        a scheduler is reusable and holds nothing of a graph between calls."""
        with gc_paused():    # the working tables go before the GC runs again (Schedule.copies)
            return _Scheduling(self, graph, placed or {}).run(decided)


class _Scheduling:
    """One call's working tables: per tensor row (graph leafs, nodes, then the copies pass 5
    makes) its backend (-1: none yet), its cause (None: never assigned) and what it can run
    on; `order` keeps the rows in the order of their first assignment, which is backend_of's
    order."""

    def __init__(self, config: Scheduler, graph: Graph, placed: Mapping[Tensor, str | None]):
        self.backends, self.ggml, self.n_copies = config.backends, config.ggml, config.n_copies
        self.n, self.cpu, self.index = config.n, config.cpu, config.index
        self.op_offload = config.op_offload
        self.graph, self.placed = graph, placed
        self._masks: dict[tuple, int] = {}          # support key -> bit b: backend b runs it
        self._all = (1 << self.n) - 1
        self._view_ops = frozenset(name for name, spec in OPS.items() if spec.view_op)
        self.tensors = graph.leafs + graph.nodes
        self.stamp = number(self.tensors)
        self.where = [-1] * len(self.tensors)
        self.why: list[str | None] = [None] * len(self.tensors)
        self.mask = [self._all] * len(self.tensors)
        self.order = array("l")
        self.copies: list[Tensor] = []
        self.location = self._weight_locations(graph)

    def run(self, decided: dict[Tensor, tuple[int, str]] | None) -> Schedule:
        graph = self.graph
        self._user_pins(graph)
        for tensor, (b, cause) in (decided or {}).items():
            if self.where[tensor.index] == -1:
                self._set(tensor.index, b, cause)
        compute, leaf_order, node_choices = self._pass1_nodes(graph)
        self._pass1_leafs(leaf_order)
        for i, b, cause in node_choices:      # ggml's pass 1 takes the leafs first
            self._set(i, b, cause)
        self._pass2_expand(compute)
        self._pass3_best_and_upgrade(compute)
        self._pass4_remaining(graph.nodes)
        splits, replaced = self._pass5_split(graph.nodes)
        parallel = self._pipeline_copies(splits, leaf_order) if self.n_copies > 1 else []
        return Schedule(graph=graph, backends=self.backends, splits=splits, replaced=replaced,
                        leaf_order=leaf_order, copies=self.copies, where=self.where, why=self.why,
                        assigned=self.order, stamp=self.stamp, ggml=self.ggml,
                        n_copies=self.n_copies, parallel_leafs=parallel)

    # --- facts the passes use ---------------------------------------------------------------
    def _backend_index(self, name: str, tensor: Tensor, what: str) -> int:
        if name not in self.index:
            raise InputError(f"unknown backend '{name}' for {what}; {did_you_mean(name, self.index)}",
                             file=_file(self.graph), line=tensor.line, culprit=tensor.describe())
        return self.index[name]

    def _weight_locations(self, graph: Graph) -> list[int]:
        """Per row: the backend whose buffer holds the weight (ggml: tensor->buffer), the CPU
        by default; -1 for every other tensor."""
        where = [-1] * len(self.tensors)
        for leaf in graph.weights:
            name = self.placed.get(leaf, leaf.backend)
            where[leaf.index] = (self.cpu if name is None
                                 else self._backend_index(name, leaf, "its buffer"))
        return where

    def _buffer(self, tensor: Tensor) -> int:
        """The backend whose buffer already holds this tensor's bytes, or -1."""
        return self.location[(tensor.view_src or tensor).index]

    def _mask(self, node: Tensor) -> int:
        """Bit b set when backend b can run this node: the answer depends on the op and its
        sources' types only, so it is asked once per distinct pair."""
        if node.op is None:                  # a leaf: nothing to compute
            return self._all
        key = support_key(node)
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = sum(1 << b for b, spec in enumerate(self.backends)
                                          if spec.supports_node(node))
        return mask

    def _supports(self, b: int, node: Tensor) -> bool:
        return self._mask(node) >> b & 1 == 1

    def _supports_buffer(self, b: int, buffer_backend: int) -> bool:
        # every backend has its own buffer type; none can use another's memory directly
        return b == buffer_backend

    def _buffer_supported(self, tensor: Tensor, b: int) -> bool:
        """ggml_backend_sched_buffer_supported: can backend b use this tensor where it is?"""
        where = self._buffer(tensor)
        if where == -1:
            where = self.where[tensor.index]
            if where == -1 and tensor.view_src is not None:
                where = self.where[tensor.view_src.index]
            if where == -1:
                return False
        return self._supports_buffer(b, where)

    def _from_buffer(self, tensor: Tensor, op_node: Tensor) -> int:
        where = self._buffer(tensor)
        if where == -1:
            return -1
        for b in range(self.n):
            if self._supports_buffer(b, where) and self.mask[op_node.index] >> b & 1:
                return b
        return -1

    def _wants_offload(self, b: int, node: Tensor) -> bool:
        spec = self.backends[b]
        return (spec.kind != "cpu" and batch_size(node) >= spec.offload_min_batch
                and (spec.offload_ops is None or node.op in spec.offload_ops))

    def _set(self, row: int, b: int, cause: str) -> None:
        if self.why[row] is None:
            self.order.append(row)
        self.where[row] = b
        self.why[row] = cause

    # --- pass 0: user assignments, never overwritten -----------------------------------------
    def _user_pins(self, graph: Graph) -> None:
        for tensor in chain(graph.nodes, graph.inputs):
            name = self.placed.get(tensor, tensor.backend)
            if name is None:
                continue
            b = self._backend_index(name, tensor, "its pin")
            if not self._supports(b, tensor):
                what = f"op '{tensor.op}'"
                if self.backends[b].supports_op(tensor.op):      # refused for a source type
                    what += f" on sources of type {', '.join(s.dtype for s in tensor.src)}"
                raise InputError(f"pinned to {name}, which does not support {what}; "
                                 f"pin it elsewhere or drop it from that backend's "
                                 f"unsupported list", file=_file(graph), line=tensor.line,
                                 culprit=tensor.describe())
            self._set(tensor.index, b, "usr")

    # --- pass 1: from pre-allocated tensors, inputs and weights ------------------------------
    def _pass1_nodes(self, graph: Graph) -> tuple[list[int], list[Tensor], list[tuple]]:
        """Pass 1 on the nodes and, in the same walk, each node's support mask, the compute
        nodes' rows and the leafs in the order ggml's graph builder meets them (left-to-right
        source visits; those no node uses last, in file order). ggml allocates graph inputs in
        that discovery order, not the file's, and the planner follows it so sizes compare.
        The nodes' choices (row, backend, cause) are returned, not set: ggml's pass 1 assigns
        the leafs first, and `backend_of` keeps that order. No choice here reads another's."""
        mask, where, view_ops = self.mask, self.where, self._view_ops
        seen = bytearray(len(self.tensors))
        first_use: list[Tensor] = []
        compute: list[int] = []
        choices: list[tuple[int, int, str]] = []
        for node in graph.nodes:
            i = node.index
            for src in node.src:
                if src.op is None and src.role != "copy" and not seen[src.index]:   # a leaf
                    seen[src.index] = 1
                    first_use.append(src)
            if node.op not in view_ops:
                compute.append(i)
            mask[i] = self._mask(node)
            if where[i] == -1:
                b, cause = self._from_current(node)
                if b != -1:
                    choices.append((i, b, cause))
        if self.ggml.leafs_first and graph.ggml_leaf_order:
            leaf_order = list(graph.leafs)      # ggml 0.25.3 allocates leafs in graph order
        else:
            leaf_order = first_use + [t for t in graph.leafs if not seen[t.index]]
        return compute, leaf_order, choices

    def _pass1_leafs(self, leaf_order: list[Tensor]) -> None:
        where = self.where
        for leaf in leaf_order:
            if where[leaf.index] == -1:
                b, cause = self._from_current(leaf)
                if b != -1:
                    self._set(leaf.index, b, cause)

    def _from_current(self, node: Tensor) -> tuple[int, str]:
        where = self._buffer(node)
        if where != -1:           # (with no buffer, neither check below can find a backend)
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
                        if self.mask[node.index] >> b & 1 and self._wants_offload(b, node):
                            return b, "1.off"
                return src_b, WEIGHT_CAUSES[i] if i < len(WEIGHT_CAUSES) else f"1.wgt{i}"
        return -1, ""

    # --- pass 2: spread device assignments to neighbours, then any assignment ----------------
    def _pass2_expand(self, compute: list[int]) -> None:
        # the four sweeps read and write flat lists over the compute nodes' rows
        where, cpu = self.where, self.cpu
        assigned = [where[i] for i in compute]
        masks = [self.mask[i] for i in compute]
        forward, backward = range(len(compute)), range(len(compute) - 1, -1, -1)
        for order, skip_cpu in ((forward, True), (backward, True),
                                (forward, False), (backward, False)):
            current = -1
            for k in order:
                b = assigned[k]
                if b != -1:
                    current = -1 if (skip_cpu and b == cpu) else b
                elif current != -1 and masks[k] >> current & 1:
                    assigned[k] = current
                    self._set(compute[k], current, "2.sup")

    # --- pass 3: unassigned nodes to the backend holding most sources; upgrades -------------
    def _pass3_best_and_upgrade(self, compute: list[int]) -> None:
        where, why, mask, tensors = self.where, self.why, self.mask, self.tensors
        for i in compute:
            current = where[i]
            if current == -1:
                node, best = tensors[i], -1
                for b in range(self.n):
                    if not mask[i] >> b & 1:
                        continue
                    held = sum(1 for s in node.src
                               if (where[s.index] != -1
                                   or (s.view_src is not None and where[s.view_src.index] != -1))
                               and self._buffer_supported(s, b))
                    if held > best:
                        best = held
                        self._set(i, b, "3.best")
            elif why[i].startswith(("1.", "2.")):
                node = tensors[i]
                for b in range(current):
                    if (self._supports_buffer(b, current) and mask[i] >> b & 1
                            and all(self._buffer_supported(s, b) for s in node.src)):
                        self._set(i, b, "3.upg")
                        break

    # --- pass 4: views with their source, sources with their consumer, then a fallback ------
    def _pass4_remaining(self, nodes: list[Tensor]) -> None:
        where, mask, set_ = self.where, self.mask, self._set
        for node in nodes:
            i = node.index
            if node.view_src is not None and where[i] == -1:
                set_(i, where[node.view_src.index], "4.vsrc")
            for src in node.src:
                j = src.index
                if where[j] == -1:
                    if src.view_src is not None:
                        set_(j, where[src.view_src.index], "4.vsrc")
                    else:
                        set_(j, where[i], "4.cur")
            if where[i] != -1:
                continue
            for b in range(self.n):
                if where[i] != -1:
                    break
                if mask[i] >> b & 1:
                    set_(i, b, "4.fb")
            if where[i] == -1:
                raise InputError(f"no backend supports op '{node.op}' (the last backend must be "
                                 f"a CPU)", file=_file(self.graph), line=node.line,
                                 culprit=node.describe())

    # --- pass 5: cut into splits at backend changes; copy in what lives elsewhere -----------
    def _pass5_split(self, nodes: list[Tensor]):
        replaced: dict[Tensor, list[Tensor]] = {}   # nodes whose sources a copy replaces
        copy_of: dict[tuple[Tensor, int], Tensor] = {}
        view_ops, where = self._view_ops, self.where
        first = where[next((n for n in nodes if n.op not in view_ops), nodes[0]).index]
        splits = [Split(backend=first, nodes=[])]
        current = first
        for node in nodes:
            if node.op in view_ops:
                splits[-1].nodes.append(node)
                continue
            b = where[node.index]
            split = splits[-1]
            if b != current or (split.copy_of and self._needs_new_split(node, split, current, copy_of)):
                split = Split(backend=b, nodes=[])
                splits.append(split)
                current = b
            split.nodes.append(node)
            for j, src in enumerate(node.src):
                if where[src.index] != current and not self._buffer_supported(src, current):
                    key = (src, current)
                    if key not in copy_of:
                        copy_of[key] = split.copy_of[src] = self._new_copy(src, current)
                    if node not in replaced:
                        replaced[node] = list(node.src)
                    replaced[node][j] = copy_of[key]
        if splits and not splits[0].nodes and len(splits) > 1:
            splits.pop(0)
        return splits, replaced

    # --- pipeline parallelism: n_copies of every split input and graph input ----------------
    def _pipeline_copies(self, splits: list[Split], leaf_order: list[Tensor]) -> list[Tensor]:
        """ggml_backend_sched with n_copies > 1 (pass 5's copies and pass 6): every split input
        has n_copies copies on its split's backend (`BACKEND#name#c`; the one the nodes read,
        copy 0, is pass 5's `BACKEND#name`), and every graph INPUT leaf n_copies on its own
        backend (copy 0 is the leaf itself), all flagged INPUT and OUTPUT: the allocator places
        them before anything else and never frees or reuses them. Returns them in the order
        ggml's graph copy lists them as leafs: the graph inputs' copies (in graph leaf order),
        then each split's inputs' copies."""
        n, where = self.n_copies, self.where
        leafs: list[Tensor] = []
        for leaf in leaf_order if self.ggml.copies_graph_inputs else ():
            if leaf.role != "input":
                continue
            b = where[leaf.index]
            leafs.append(leaf)
            leafs += [self._spare(leaf, b, c, "6.cpy") for c in range(1, n)]
        for split in splits:
            for src, copy in split.copy_of.items():
                leafs.append(copy)
                leafs += [self._spare(src, split.backend, c, "4.cpy") for c in range(1, n)]
        return leafs

    def _spare(self, src: Tensor, b: int, c: int, cause: str) -> Tensor:
        return self._new_copy(src, b, f"{self.backends[b].name}#{src.name}#{c}", cause)

    def _new_copy(self, src: Tensor, b: int, name: str | None = None,
                  cause: str = "4.cpy") -> Tensor:
        copy = Tensor(name=name or f"{self.backends[b].name}#{src.name}", shape=src.shape,
                      dtype=src.dtype, strides=src.strides, role="copy")
        copy.index = len(self.tensors)
        self.tensors.append(copy)
        self.copies.append(copy)
        self.where.append(-1)
        self.why.append(None)
        self.mask.append(self._all)
        self.location.append(-1)
        self._set(copy.index, b, cause)
        return copy

    def _needs_new_split(self, node: Tensor, split: Split, current: int, copy_of) -> bool:
        where = self.where
        for src in node.src:
            # a weight on an incompatible backend: a new split lets its copy's memory be reused
            if src.role == "weight":
                if where[src.index] != current and not self._buffer_supported(src, current):
                    return True
            if len(split.copy_of) == self.ggml.max_split_inputs:
                if (where[src.index] != current and (src, current) not in copy_of
                        and not self._buffer_supported(src, current)):
                    return True
        return False


def _file(graph: Graph) -> str | None:
    return str(graph.path) if graph.path else None
