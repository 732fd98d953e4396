"""The sequence ggml's allocator walks (its graph copy, ggml_backend_sched_split_graph): per
split, each input's keep-alive dependency and its copy, then the split's nodes (with
ggml-cuda's fusion dependencies where a backend has them); the leafs first. Built once from a
schedule and read by every planner (ggml's allocator, the lower bound, the offline packer), so
they all work from the very same order.
"""

from __future__ import annotations

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.sched.schedule import Schedule, restamp
from ggmlrun.core.util.gcpause import gc_paused


class AllocationSequence:
    """The sequence the allocator walks (ggml's graph copy), as parallel lists: one row per
    entry rather than an object per node (a big graph has a hundred thousand).

    Each tensor met gets a row (`Tensor.index`; `rows` from a schedule are numbered already)
    and the facts the allocator counts are counted as entries are added, while the entry's
    tensors are still in the cache: consumers (ggml's n_children), views (n_views) and the
    tensors never freed (outputs and, unlike ggml, an output view's source)."""

    def __init__(self, rows: list[Tensor] | None = None, stamp: int | None = None):
        self.tensors: list[Tensor] = []
        self.srcs: list[list[Tensor]] = []        # copies already substituted
        self.buffers: list[int] = []
        # entries that are ggml's op-NONE helper: keeps its `srcs` alive to there, owns nothing
        self.dependencies: set[int] = set()
        self.rows: list[Tensor] = rows if rows is not None else []
        self.stamp = stamp if stamp is not None else restamp()   # the rows' numbering
        self.children = [0] * len(self.rows)
        self.views = [0] * len(self.rows)
        self.pinned = bytearray(len(self.rows))

    def add(self, tensor: Tensor, srcs: list[Tensor], buffer: int, dependency: bool = False):
        self.extend([tensor], [srcs], [buffer], dependency)

    def extend(self, tensors: list[Tensor], srcs: list[list[Tensor]], buffers: list[int],
               dependency: bool = False) -> None:
        """Entries in order: tensors[k] reads srcs[k] and lives on buffers[k]."""
        if dependency:
            self.dependencies.update(range(len(self.tensors), len(self.tensors) + len(tensors)))
        self.tensors += tensors
        self.srcs += srcs
        self.buffers += buffers
        rows, children, views = self.rows, self.children, self.views
        for tensor, reads in zip(tensors, srcs):
            i = tensor.index
            if not (0 <= i < len(rows) and rows[i] is tensor):
                self.row(tensor)
            if tensor.is_output:
                self.pin(tensor)
            if tensor.view_src is not None and not dependency:
                views[self.row(tensor.view_src)] += 1
            for src in reads:
                i = src.index
                if not (0 <= i < len(rows) and rows[i] is src):
                    i = self.row(src)
                children[i] += 1

    def pin(self, tensor: Tensor) -> None:
        self.pinned[self.row(tensor)] = 1
        if tensor.view_src is not None:
            self.pinned[self.row(tensor.view_src)] = 1

    def row(self, tensor: Tensor) -> int:
        """The tensor's row, given one if it has none here yet."""
        i = tensor.index
        if not (0 <= i < len(self.rows) and self.rows[i] is tensor):
            i = tensor.index = len(self.rows)
            self.stamp = restamp()
            self.rows.append(tensor)
            self.children.append(0)
            self.views.append(0)
            self.pinned.append(0)
        return i


def allocation_sequence(sched: Schedule) -> tuple[list[tuple[Tensor, int]], AllocationSequence]:
    """ggml's graph copy: per split, each input's keep-alive dependency and its copy, then the
    split's nodes; and the leafs, which the allocator places first."""
    with gc_paused():
        sched.renumber()
        seq = AllocationSequence(sched.rows, sched.stamp)
        where, replaced, add = sched.where, sched.replaced, seq.add
        fusing = any(b.fusion_alloc_deps for b in sched.backends)
        use_count = _use_counts(sched.graph.nodes) if fusing else {}
        carried: dict[Tensor, list[Tensor]] = {}    # deps whose `until` opens this split
        for k, split in enumerate(sched.splits):
            for original, copy in split.copy_of.items():
                add(original, [original], where[original.index], dependency=True)
                add(copy, [], split.backend)
            nodes = split.nodes
            srcs = [replaced.get(node, node.src) for node in nodes]
            if fusing and (carried or sched.backends[split.backend].fusion_alloc_deps):
                carried = _extend_with_deps(seq, sched, k, srcs, use_count, carried)
                continue
            seq.extend(nodes, srcs, [where[node.index] for node in nodes])
        leafs = [(leaf, where[leaf.index]) for leaf in sched.leaf_order]
        if sched.parallel_leafs:
            # n_copies > 1: the copies of every graph input and split input come first, flagged
            # INPUT and OUTPUT (never freed, never reused in place); the graph's own leafs after
            for tensor in sched.parallel_leafs:
                seq.pin(tensor)
            leafs = [(t, where[t.index]) for t in sched.parallel_leafs] + leafs
    return leafs, seq


def _use_counts(nodes: list[Tensor]) -> dict[Tensor, int]:
    """ggml's cgraph use_counts: how many src slots of the graph's nodes name each tensor."""
    counts: dict[Tensor, int] = {}
    for node in nodes:
        for s in node.src:
            counts[s] = counts.get(s, 0) + 1
    return counts


def _extend_with_deps(seq: AllocationSequence, sched: Schedule, k: int, srcs, use_count,
                      carried: dict[Tensor, list[Tensor]]) -> dict[Tensor, list[Tensor]]:
    """A split's nodes with ggml-cuda's fusion dependencies after their `until` nodes: one
    GGML_OP_NONE entry per GGML_MAX_SRC kept tensors, on the split's backend
    (ggml_backend_sched_split_graph). `carried`: the previous split's dependencies whose
    `until` is this split's first node (a fused run ending its split: graph_optimize reads the
    node after it through the split's view of the whole graph), placed, as ggml's graph copy
    places them, after that node, so after this split's input copies. Returns this split's
    own such dependencies, for the next split."""
    from ggmlrun.core.sched.fusion_deps import MAX_SRC, alloc_deps

    split = sched.splits[k]
    nodes, where = split.nodes, sched.where
    following = sched.splits[k + 1].nodes if k + 1 < len(sched.splits) else []
    after = following[0] if following else None
    deps = dict(carried)
    if sched.backends[split.backend].fusion_alloc_deps:
        for until, kept in alloc_deps(nodes, srcs, use_count, after).items():
            have = deps.setdefault(until, [])
            have += [t for t in kept if not any(t is h for h in have)]
    if not deps:
        seq.extend(nodes, srcs, [where[node.index] for node in nodes])
        return {}
    for node, reads in zip(nodes, srcs):
        seq.add(node, reads, where[node.index])
        for j in range(0, len(deps.get(node, ())), MAX_SRC):
            kept = deps[node][j:j + MAX_SRC]
            seq.add(kept[0], kept, split.backend, dependency=True)
    return {after: deps[after]} if after is not None and after in deps else {}
