"""`run --profile`: measured time per op and per copy route, in the spirit of PyTorch's
`key_averages()`.

Computes are grouped by (op, backend): calls (nodes x runs), total and mean seconds, the share
of all compute time, and the FLOP/s achieved (the op table's FLOP counts over measured time).
Copies are listed apart, grouped by route (source backend -> destination backend): count,
bytes (as moved: an expert copy moves only the experts used), seconds and bytes per second. Copy seconds per route need the run's step events
(`Executor.run(record_events=True)`); without them `total_s` is None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ggmlrun.core.run.exec import RunResult
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.sched.schedule import COPY, Schedule


@dataclass
class OpRow:
    op: str
    backend: str
    nodes: int                     # distinct nodes in the group
    calls: int                     # nodes x runs
    total_s: float
    mean_s: float
    share: float                   # of all compute seconds, 0..1
    flops: int                     # all calls
    flops_per_s: float | None      # None for ops that count no FLOPs (copies, cont)
    name: str = ""                 # the group: the op, the node's name, or the op and its shape


@dataclass
class CopyRow:
    src: str
    dst: str
    count: int                     # all runs
    bytes: int                     # all runs
    total_s: float | None
    bytes_per_s: float | None


@dataclass
class Profile:
    repeat: int
    compute_s: float
    copy_s: float | None
    ops: list[OpRow]
    copies: list[CopyRow]

    def as_dict(self) -> dict:
        return asdict(self)


GROUPS = {"op": lambda node: node.op, "node": lambda node: node.name,
          "shape": lambda node: f"{node.op} {list(node.shape)}"}
SORTS = {"total": lambda r: (-r.total_s, r.name, r.backend),
         "mean": lambda r: (-r.mean_s, r.name, r.backend),
         "calls": lambda r: (-r.calls, r.name, r.backend),
         "name": lambda r: (r.name, r.backend)}


def profile(sched: Schedule, result: RunResult, by: str = "op", sort: str = "total",
            top: int | None = None) -> Profile:
    """Computes grouped `by` op, node or op and shape (per backend), ordered by `sort`, the
    first `top` rows kept (the totals still count every row)."""
    group = GROUPS[by]
    ops: dict[tuple[str, str], OpRow] = {}
    for t in result.node_timings:
        key = group(t.node)
        row = ops.setdefault((key, t.backend),
                             OpRow(t.node.op, t.backend, 0, 0, 0.0, 0.0, 0.0, 0, None, key))
        row.nodes += 1
        row.calls += t.calls
        row.total_s += t.seconds
        row.flops += get_op(t.node.op).count_flops(t.node, t.node.src) * t.calls
    compute_s = sum(r.total_s for r in ops.values())
    for row in ops.values():
        row.mean_s = row.total_s / row.calls if row.calls else 0.0
        row.share = row.total_s / compute_s if compute_s > 0 else 0.0
        row.flops_per_s = row.flops / row.total_s if row.total_s > 0 and row.flops else None

    copies: dict[tuple[str, str], CopyRow] = {}
    for split in sched.splits:
        dst = sched.backends[split.backend].name
        for source, copy in zip(split.inputs, split.copies):
            row = copies.setdefault((sched.backend_name(source), dst),
                                    CopyRow(sched.backend_name(source), dst, 0, 0, None, None))
            row.count += result.repeat
            row.bytes += result.copy_moved.get(copy, copy.nbytes * result.repeat)
    timed = [e for e in result.events if e.kind == COPY]
    if timed or not copies:
        for row in copies.values():
            row.total_s = 0.0
        for event in timed:
            key = (sched.backend_name(sched.copy_source[event.tensor]), event.backend)
            copies[key].total_s += event.end - event.start
        for row in copies.values():
            row.bytes_per_s = row.bytes / row.total_s if row.total_s else None
    copy_s = (sum(r.total_s for r in copies.values()) if all(r.total_s is not None
                                                            for r in copies.values()) else None)
    return Profile(repeat=result.repeat, compute_s=compute_s, copy_s=copy_s,
                   ops=sorted(ops.values(), key=SORTS[sort])[:top],
                   copies=sorted(copies.values(), key=lambda r: (-(r.total_s or 0.0), r.src, r.dst)))
