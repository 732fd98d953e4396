"""The graph allocator: ggml's `ggml_gallocr` measure pass, offsets only, one arena per backend.

It walks the same sequence ggml's allocator walks (inputs first, then per node: its sources,
the node, then frees each source whose last consumer this was) and places every tensor that
owns memory with ggml's free-block allocator (`FreeBlocks`). It records each slot's life so the
lower bound, the no-overlap check and the offline planner all work from the very same schedule.

Faithful to ggml 0.15.3 (vendor/ggml/src/ggml-alloc.c), with one deliberate difference: an
output that is a view keeps its view source alive (SPEC.md section 1; ggml frees it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import OPS
from ggmlrun.core.sched.schedule import Schedule, holds, number, restamp
from ggmlrun.core.util.fmt import align_up
from ggmlrun.core.util.gcpause import gc_paused
from ggmlrun.core.util.ggml_version import GgmlVersion, ggml_version

_HUGE = 2**62  # ggml's SIZE_MAX/2: a measure arena's tail block never runs out


class FreeBlocks:
    """ggml_dyn_tallocr: free blocks sorted by offset, best fit except the tail, merge on free."""

    def __init__(self, alignment: int):
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, _HUGE]]  # [offset, size], sorted by offset
        self.high_water = 0

    def alloc(self, size: int) -> int:
        size = align_up(size, self.alignment)
        best, best_size = -1, None
        # 1. best fit among all blocks but the last; ties go to the later block, as in ggml
        for i in range(len(self.blocks) - 1):
            block_size = self.blocks[i][1]
            if block_size >= size and (best_size is None or block_size <= best_size):
                best, best_size = i, block_size
        # 2. the tail block is the last resort: it grows the arena
        if best == -1:
            best = len(self.blocks) - 1
        block = self.blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.high_water = max(self.high_water, offset + size)
        return offset

    def free(self, offset: int, size: int) -> None:
        size = align_up(size, self.alignment)
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:           # freed bytes follow this block
                block[1] += size
                if i + 1 < len(blocks) and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:               # freed bytes precede this block
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


@dataclass(eq=False, slots=True)
class Slot:
    """One allocation: a tensor's bytes, shared by the nodes that reuse it in place."""

    buffer: int
    offset: int
    size: int                      # aligned
    born: int                      # event index of the allocation
    died: int | None = None        # event index of the free; None: lives to the end
    tensors: list[Tensor] = field(default_factory=list)


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


@dataclass
class MemoryPlan:
    arena_bytes: list[int]                    # per buffer: the measure result
    alignments: list[int]
    slots: list[Slot]
    slot_of: dict[Tensor, Slot]               # every tensor owning (or reusing) arena bytes
    inplace: list[tuple[Tensor, Tensor]]      # (node, parent whose slot it took)
    n_events: int
    weights: "WeightLayout | None" = None      # set once by the engine's measure pass

    def offset(self, tensor: Tensor) -> tuple[int, int]:
        slot = self.slot_of[tensor]
        return slot.buffer, slot.offset

    def lower_bound(self, buffer: int) -> int:
        """Most aligned bytes live at once in this arena over the same schedule."""
        times: list[int] = []      # two flat int lists, not (time, delta) tuples: on a big
        deltas: list[int] = []     # graph those tuples alone set off full GC collections
        for slot in self.slots:
            if slot.buffer == buffer:
                times.append(slot.born)
                deltas.append(slot.size)
                if slot.died is not None:
                    times.append(slot.died)
                    deltas.append(-slot.size)
        live = peak = 0
        for i in sorted(range(len(times)), key=times.__getitem__):   # stable, as before
            live += deltas[i]
            if live > peak:
                peak = live
        return peak

    def no_reuse_bytes(self, buffer: int) -> int:
        """What the arena would need if no tensor ever reused another's bytes.

        A slot is shared only in place, by tensors of its first tensor's exact layout, so each
        of them needs `slot.size` bytes: no tensor is read again (on a big graph that sweep
        over every tensor costs more than the sum)."""
        return sum(slot.size * len(slot.tensors) for slot in self.slots if slot.buffer == buffer)

    def overlaps(self) -> list[tuple[Slot, Slot]]:
        """Pairs of slots alive at the same time whose bytes overlap; empty for a sound plan."""
        bad = []
        by_buffer: dict[int, list[Slot]] = {}
        for slot in self.slots:
            by_buffer.setdefault(slot.buffer, []).append(slot)
        for slots in by_buffer.values():
            slots.sort(key=lambda s: s.born)
            live: list[Slot] = []
            for slot in slots:
                live = [s for s in live if s.died is None or s.died > slot.born]
                for other in live:
                    if slot.offset < other.offset + other.size and other.offset < slot.offset + slot.size:
                        bad.append((other, slot))
                live.append(slot)
        return bad


class GraphAllocator:
    """ggml_gallocr over several arenas (one per backend), measure mode only.

    Its per-tensor state (slot, consumers and views left, never-freed) lives in flat lists
    indexed by `Tensor.index`, not in dicts keyed by Tensor: on a big graph every dict lookup
    is a cache miss."""

    def __init__(self, alignments: list[int], ggml: GgmlVersion | str | None = None,
                 sizers: list | None = None):
        self.alignments = alignments
        self.ggml = ggml_version(ggml)
        # per buffer, its backend's alloc_size (ggml_backend_buft_get_alloc_size); None: nbytes
        self.sizers = sizers if sizers and any(s is not None for s in sizers) else None

    def plan(self, leafs: list[tuple[Tensor, int]], sequence: AllocationSequence) -> MemoryPlan:
        with gc_paused():
            return self._plan(leafs, sequence)

    def _plan(self, leafs: list[tuple[Tensor, int]], seq: AllocationSequence) -> MemoryPlan:
        if not holds(seq.stamp):      # (a numbering since may have given its tensors new rows)
            seq.stamp = number(seq.rows)
        for leaf, _ in leafs:
            seq.row(leaf)
            if leaf.is_output:
                seq.pin(leaf)
        rows, dependencies = seq.rows, seq.dependencies
        self.arenas = [FreeBlocks(a) for a in self.alignments]
        self.slots: list[Slot] = []
        self.slot_at: list[Slot | None] = [None] * len(rows)   # the slot a row's bytes are in
        self.owner: list[bool] = [False] * len(rows)  # ggml's `allocated`: owns its slot now
        self.placed: list[Tensor] = []                # slot_of's keys, in placement order
        self.inplace: list[tuple[Tensor, Tensor]] = []
        self.event = 0
        self._inplace_ops = frozenset(name for name, spec in OPS.items()
                                      if spec.inplace and name not in self.ggml.not_inplace)
        self.pinned, self.children, self.views = seq.pinned, list(seq.children), list(seq.views)

        # 1. leafs first, so graph inputs never overlap one another or anything else
        for leaf, buffer in leafs:
            self._allocate(leaf, buffer)
        # 2. per node: sources, the node (maybe in a parent's slot), then free finished sources
        slot_at, allocate, release = self.slot_at, self._allocate, self._release
        for k, (node, srcs, buffer) in enumerate(zip(seq.tensors, seq.srcs, seq.buffers)):
            for src in srcs:
                if slot_at[src.index] is None:    # (most are placed already)
                    allocate(src, buffer)
            if k not in dependencies:
                allocate(node, buffer, srcs)
            for src in srcs:
                release(src)
        slot_of = {tensor: slot_at[tensor.index] for tensor in self.placed}
        return MemoryPlan(arena_bytes=[a.high_water for a in self.arenas],
                          alignments=list(self.alignments), slots=self.slots,
                          slot_of=slot_of, inplace=self.inplace, n_events=self.event)

    # --- the rules ------------------------------------------------------------------------
    def _allocate(self, node: Tensor, buffer: int, srcs: list[Tensor] = ()) -> None:
        row = node.index
        if self.slot_at[row] is not None or node.view_src is not None or node.role == "weight":
            return                                # placed already, or owns no memory
        if node.op in self._inplace_ops:
            for parent in srcs:
                if self._can_take_slot_of(node, parent):
                    slot = self.slot_at[parent.index]
                    slot.tensors.append(node)
                    self.slot_at[row] = slot
                    self.owner[parent.index] = False
                    self.owner[row] = True
                    self.placed.append(node)
                    self.inplace.append((node, parent))
                    return
        nbytes = node.nbytes
        if self.sizers and self.sizers[buffer] is not None:
            nbytes = self.sizers[buffer](node.dtype, node.shape, nbytes)
        offset = self.arenas[buffer].alloc(nbytes)
        self.event += 1
        slot = Slot(buffer, offset, align_up(nbytes, self.alignments[buffer]), self.event,
                    None, [node])
        self.slots.append(slot)
        self.slot_at[row] = slot
        self.owner[row] = True
        self.placed.append(node)

    def _can_take_slot_of(self, node: Tensor, parent: Tensor) -> bool:
        """ggml's in-place conditions (ggml_gallocr_allocate_node).

        The parent must hold its own slot right now (ggml's is_own: a view never does, so a
        view parent is never reused in 0.15.3), not be an output nor a view of one, have the
        node's exact layout, and have this node as its only remaining consumer and no views.
        """
        row = parent.index
        if not self.owner[row] or parent.view_src is not None:
            return False
        if self.pinned[row] or parent.is_output:
            return False
        if not node.same_layout(parent):
            return False
        return self.children[row] == 1 and self.views[row] == 0

    def _release(self, parent: Tensor) -> None:
        row = parent.index
        left = self.children[row] - 1
        self.children[row] = left
        if left != 0 or self.views[row] != 0:
            return
        if parent.view_src is not None:
            root = parent.view_src.index
            self.views[root] -= 1
            if self.views[root] == 0 and self.children[root] == 0:
                self._free(root)
        else:
            self._free(row)

    def _free(self, row: int) -> None:
        if not self.owner[row] or self.pinned[row]:
            return
        # slot.size is nbytes aligned: the owner is the slot's first tensor or an in-place
        # node of the very same layout
        slot = self.slot_at[row]
        self.arenas[slot.buffer].free(slot.offset, slot.size)
        self.event += 1
        slot.died = self.event
        self.owner[row] = False



@dataclass(frozen=True)
class WeightLayout:
    offsets: dict[Tensor, int]     # weight -> bytes into its backend's weights buffer
    bytes: list[int]               # per backend: its weights buffer's size


def layout_weights(sched: Schedule) -> WeightLayout:
    """Weights packed one after another per backend, each aligned (ggml_backend_alloc_ctx_tensors)."""
    offsets: dict[Tensor, int] = {}
    used = [0] * len(sched.backends)
    sched.renumber()
    where = sched.where
    for weight in sched.graph.weights:
        b = where[weight.index]
        offsets[weight] = used[b]
        spec = sched.backends[b]
        nbytes = spec.alloc_size(weight.dtype, weight.shape, weight.nbytes)
        used[b] += align_up(nbytes, spec.alignment)
    return WeightLayout(offsets, used)


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
