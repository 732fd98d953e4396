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
from ggmlrun.core.sched.scheduler import Schedule
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


@dataclass(eq=False)
class Slot:
    """One allocation: a tensor's bytes, shared by the nodes that reuse it in place."""

    buffer: int
    offset: int
    size: int                      # aligned
    born: int                      # event index of the allocation
    died: int | None = None        # event index of the free; None: lives to the end
    tensors: list[Tensor] = field(default_factory=list)


@dataclass
class PlanEntry:
    """One node of the sequence the allocator walks (ggml's graph copy)."""

    tensor: Tensor
    srcs: list[Tensor]             # as the node sees them: copies already substituted
    buffer: int
    dependency: bool = False       # ggml's op-NONE helper: keeps `srcs` alive up to here


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
    """ggml_gallocr over several arenas (one per backend), measure mode only."""

    def __init__(self, alignments: list[int], ggml: GgmlVersion | str | None = None):
        self.alignments = alignments
        self.ggml = ggml_version(ggml)

    def plan(self, leafs: list[tuple[Tensor, int]], entries: list[PlanEntry]) -> MemoryPlan:
        with gc_paused():
            return self._plan(leafs, entries)

    def _plan(self, leafs: list[tuple[Tensor, int]], entries: list[PlanEntry]) -> MemoryPlan:
        self.arenas = [FreeBlocks(a) for a in self.alignments]
        self.slot_of: dict[Tensor, Slot] = {}
        self.slots: list[Slot] = []
        self.inplace: list[tuple[Tensor, Tensor]] = []
        self.children: dict[Tensor, int] = {}
        self.views: dict[Tensor, int] = {}
        self.event = 0
        self._owner: dict[Slot, Tensor | None] = {}   # ggml's `allocated` flag, per slot
        self.pinned = self._never_freed(entries, leafs)
        self._inplace_ops = frozenset(name for name, spec in OPS.items()
                                      if spec.inplace and name not in self.ggml.not_inplace)

        # 1. leafs first, so graph inputs never overlap one another or anything else
        for leaf, buffer in leafs:
            self._allocate(leaf, buffer)
        # 2. count each tensor's consumers and views (ggml's n_children / n_views)
        views, children = self.views, self.children
        for entry in entries:
            node = entry.tensor
            if node.view_src is not None and not entry.dependency:
                views[node.view_src] = views.get(node.view_src, 0) + 1
            for src in entry.srcs:
                children[src] = children.get(src, 0) + 1
        # 3. per node: sources, the node (maybe in a parent's slot), then free finished sources
        slot_of, allocate, release = self.slot_of, self._allocate, self._release
        for entry in entries:
            srcs = entry.srcs
            for src in srcs:
                if src not in slot_of:            # (most are placed already)
                    allocate(src, entry.buffer)
            if not entry.dependency:
                allocate(entry.tensor, entry.buffer, srcs)
            for src in srcs:
                release(src)
        return MemoryPlan(arena_bytes=[a.high_water for a in self.arenas],
                          alignments=list(self.alignments), slots=self.slots,
                          slot_of=self.slot_of, inplace=self.inplace, n_events=self.event)

    # --- the rules ------------------------------------------------------------------------
    @staticmethod
    def _never_freed(entries: list[PlanEntry], leafs) -> set[Tensor]:
        """Outputs (ggml's OUTPUT flag) and, unlike ggml, the view source of an output view."""
        pinned = set()
        for tensor in [e.tensor for e in entries] + [t for t, _ in leafs]:
            if tensor.is_output:
                pinned.add(tensor)
                if tensor.view_src is not None:
                    pinned.add(tensor.view_src)
        return pinned

    def _allocate(self, node: Tensor, buffer: int, srcs: list[Tensor] = ()) -> None:
        if node in self.slot_of or node.view_src is not None or node.role == "weight":
            return                                # placed already, or owns no memory
        if node.op in self._inplace_ops:
            for parent in srcs:
                if self._can_take_slot_of(node, parent):
                    slot = self.slot_of[parent]
                    slot.tensors.append(node)
                    self.slot_of[node] = slot
                    self._owner[slot] = node
                    self.inplace.append((node, parent))
                    return
        nbytes = node.nbytes
        offset = self.arenas[buffer].alloc(nbytes)
        slot = Slot(buffer=buffer, offset=offset, size=align_up(nbytes, self.alignments[buffer]),
                    born=self._tick(), tensors=[node])
        self.slots.append(slot)
        self.slot_of[node] = slot
        self._owner[slot] = node

    def _can_take_slot_of(self, node: Tensor, parent: Tensor) -> bool:
        """ggml's in-place conditions (ggml_gallocr_allocate_node).

        The parent must hold its own slot right now (ggml's is_own: a view never does, so a
        view parent is never reused in 0.15.3), not be an output nor a view of one, have the
        node's exact layout, and have this node as its only remaining consumer and no views.
        """
        slot = self.slot_of.get(parent)
        if slot is None or self._owner.get(slot) is not parent or parent.is_view:
            return False
        if parent in self.pinned or parent.is_output:
            return False
        if not node.same_layout(parent):
            return False
        return self.children.get(parent, 0) == 1 and self.views.get(parent, 0) == 0

    def _release(self, parent: Tensor) -> None:
        left = self.children[parent] - 1
        self.children[parent] = left
        if left != 0 or self.views.get(parent, 0) != 0:
            return
        if parent.view_src is not None:
            root = parent.view_src
            self.views[root] -= 1
            if self.views[root] == 0 and self.children.get(root, 0) == 0:
                self._free(root)
        else:
            self._free(parent)

    def _free(self, tensor: Tensor) -> None:
        slot = self.slot_of.get(tensor)
        if slot is None or self._owner.get(slot) is not tensor or tensor in self.pinned:
            return
        # slot.size is tensor.nbytes aligned: the owner is the slot's first tensor or an
        # in-place node of the very same layout
        self.arenas[slot.buffer].free(slot.offset, slot.size)
        slot.died = self._tick()
        self._owner[slot] = None

    def _tick(self) -> int:
        self.event += 1
        return self.event


@dataclass(frozen=True)
class WeightLayout:
    offsets: dict[Tensor, int]     # weight -> bytes into its backend's weights buffer
    bytes: list[int]               # per backend: its weights buffer's size


def layout_weights(sched: Schedule) -> WeightLayout:
    """Weights packed one after another per backend, each aligned (ggml_backend_alloc_ctx_tensors)."""
    offsets: dict[Tensor, int] = {}
    used = [0] * len(sched.backends)
    for weight in sched.graph.weights:
        b = sched.backend_of[weight]
        offsets[weight] = used[b]
        used[b] += align_up(weight.nbytes, sched.backends[b].alignment)
    return WeightLayout(offsets, used)


def allocation_sequence(sched: Schedule) -> tuple[list[tuple[Tensor, int]], list[PlanEntry]]:
    """ggml's graph copy: per split, each input's keep-alive dependency and its copy, then the
    split's nodes; and the leafs, which the allocator places first."""
    backend_of = sched.backend_of
    with gc_paused():
        entries: list[PlanEntry] = []
        for split in sched.splits:
            for original, copy in split.copy_of.items():
                entries.append(PlanEntry(original, [original], backend_of[original],
                                         dependency=True))
                entries.append(PlanEntry(copy, [], split.backend))
            for node in split.nodes:
                entries.append(PlanEntry(node, sched.srcs_of[node], backend_of[node]))
        leafs = [(leaf, backend_of[leaf]) for leaf in sched.leaf_order]
    return leafs, entries
