"""A schedule: the scheduler's answer (splits, copies, each tensor's backend and cause), and the
row numbering its tables and the allocator's share.

Consumers (allocator, executor, traces, pictures, reports) read only this; how the passes reach
it is scheduler.py's business.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from functools import cached_property

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import OPS
from ggmlrun.core.util.ggml_version import GgmlVersion, ggml_version

COPY, COMPUTE = "copy", "compute"

# Why a node landed where it did: the scheduler's causes, as ggml's debug build names them
# (`1.wgtN` for every source N). Reports print the legend of the ones a schedule uses.
CAUSES = {
    "usr": "a user pin",
    "1.dst": "pre-allocated: a weight, a view of one, a write into one",
    "1.vsrc": "its view source's buffer",
    "1.inp": "a graph input (on the CPU)",
    "1.wgt": "the backend holding source N, a weight",
    "1.off": "op offload: a CPU-weight op moved to a device",
    "2.sup": "spread from a neighbour on a backend that supports it",
    "3.best": "the backend holding most of its sources",
    "3.upg": "upgraded to a higher-priority backend of the same buffer type",
    "4.vsrc": "its view source's backend",
    "4.cur": "a source placed with its consumer",
    "4.fb": "the first backend that supports it",
    "cost": "moved by --policy cost (its reason in the policy table)",
    "4.cpy": "a source copied into the split's backend (pass 5; a pipeline copy too)",
}


def cause_meaning(code: str) -> str | None:
    """A cause code's meaning (`1.wgt2`: source 2); None for a code not listed (a placement
    policy's own reasons)."""
    if code.startswith("1.wgt") and code[5:].isdigit():
        return CAUSES["1.wgt"].replace("N", code[5:])
    return CAUSES.get(code)


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
    splits: list[Split]
    replaced: dict[Tensor, list[Tensor]]      # the nodes a copy replaces a source of: sources
    leaf_order: list[Tensor]                  # leafs in first-use order (pass 1 finds it)
    # the passes' tables, one row per tensor (graph leafs, nodes, then copies: `Tensor.index`
    # while `stamp` holds, see `renumber`); `backend_of` and `cause` are built from them when
    # first read. No list of all tensors is kept: after a pass the cyclic GC scans every young
    # container's items, and on a big graph each tensor it touches is a cache miss.
    copies: list[Tensor]                      # the copies pass 5 made, in the order it made them
    where: list[int]                          # per row: its backend, -1 when it has none
    why: list[str | None]                     # per row: its cause, None when never assigned
    assigned: array                           # rows in the order they were first assigned
    stamp: int                                # the rows' numbering (see `number`)
    reasons: dict[Tensor, str] = field(default_factory=dict)   # why a policy moved a node
    policy: object | None = None              # the PolicyOutcome, under --policy cost
    ggml: GgmlVersion = field(default_factory=lambda: ggml_version(None))   # whose rules
    # pipeline parallelism (ggml_backend_sched's n_copies > 1): every graph input and split
    # input copy, n_copies of each, in the order ggml's graph copy lists them as leafs; the
    # allocator places them first and never frees them. Empty when n_copies is 1.
    n_copies: int = 1
    parallel_leafs: list[Tensor] = field(default_factory=list)

    @cached_property
    def srcs_of(self) -> dict[Tensor, list[Tensor]]:
        """Each node's sources, copies substituted (read only: a node's own `src` list when no
        copy replaces one of them)."""
        replaced = self.replaced
        return {node: replaced.get(node, node.src) for node in self.graph.nodes}

    @cached_property
    def backend_of(self) -> dict[Tensor, int]:
        """Each assigned tensor's backend, in the order the passes first assigned them."""
        return dict(zip(self._assigned_tensors, map(self.where.__getitem__, self.assigned)))

    @cached_property
    def cause(self) -> dict[Tensor, str]:
        return dict(zip(self._assigned_tensors, map(self.why.__getitem__, self.assigned)))

    @property
    def _assigned_tensors(self) -> list[Tensor]:
        return list(map(self.rows.__getitem__, self.assigned))

    @property
    def rows(self) -> list[Tensor]:
        """Every tensor in row order: the graph's leafs, its nodes, then the copies."""
        return self.graph.leafs + self.graph.nodes + self.copies

    def renumber(self) -> None:
        """Point each tensor's index at its row again if another numbering ran since (see
        `number`); `rows` is built only then, as a copy of every tensor reference costs."""
        if not holds(self.stamp):
            self.stamp = number(self.rows)

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


_stamp = [0]    # bumped whenever a tensor gets a new row: a numbering holds while its stamp does


def number(tensors: list[Tensor]) -> int:
    """Give each tensor its row in a pass's flat tables (`Tensor.index`); returns the stamp.

    The passes keep per-tensor facts in lists indexed by that row, walked in node order: on a
    big graph, dicts keyed by Tensor cost a cache miss per lookup. A tensor has one index, so
    numbering another graph that shares tensors with this one (a model's weights) makes every
    older numbering stale: the stamp says whether one still holds. (It cannot guard a pass
    against another thread numbering shared tensors in its middle: nothing here runs two
    passes at once.)
    """
    for i, tensor in enumerate(tensors):
        tensor.index = i
    return restamp()


def restamp() -> int:
    """A new stamp, for a pass that gave some tensor a new row."""
    _stamp[0] += 1
    return _stamp[0]


def holds(stamp: int) -> bool:
    """No tensor got a new row since the numbering with this stamp."""
    return stamp == _stamp[0]
