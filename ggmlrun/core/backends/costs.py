"""The cost model: modeled seconds for a compute on a backend and for a copy between two.

A compute is a roofline, max(FLOPs / flops, bytes touched / mem_bw). A copy crosses the host
link of every sim device it touches (sim to sim goes through the host): link_latency +
bytes / link_bw per link. The CPU has no link; its compute model is ggmlrun's own estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op


def compute_s(spec: BackendSpec, node: Tensor) -> float:
    op = get_op(node.op)
    if op.view_op:
        return 0.0
    moved = node.nbytes + sum(s.nbytes for s in node.src)
    return max(op.count_flops(node, node.src) / spec.flops, moved / spec.mem_bw)


def link_s(spec: BackendSpec, nbytes: int) -> float | None:
    if spec.kind == "cpu":
        return None
    return spec.link_latency + nbytes / spec.link_bw


def copy_s(src: BackendSpec, dst: BackendSpec, nbytes: int) -> float:
    legs = [t for t in (link_s(src, nbytes), link_s(dst, nbytes)) if t is not None]
    return sum(legs)


@dataclass
class Modeled:
    """One backend's modeled seconds per compute; None where nothing of that kind happens."""

    copy_s: float | None = None      # copies into it across a link (CPU to CPU has none)
    compute_s: float | None = None   # the nodes it computes


def modeled_by_backend(sched) -> list[Modeled]:
    """Per backend, the modeled seconds of one compute of a schedule (copies charged to the
    backend they go to). The executor's modeled columns and `modeled_time` both read this."""
    out = [Modeled() for _ in sched.backends]
    for split in sched.splits:
        dst = sched.backends[split.backend]
        here = out[split.backend]
        for source, copy in split.copy_of.items():
            src = sched.backends[sched.backend_of[source]]
            if src.kind != "cpu" or dst.kind != "cpu":
                here.copy_s = (here.copy_s or 0.0) + copy_s(src, dst, copy.nbytes)
        for node in split.nodes:
            if not get_op(node.op).view_op:
                here.compute_s = (here.compute_s or 0.0) + compute_s(dst, node)
    return out


def modeled_time(sched) -> tuple[float, float]:
    """(compute seconds, copy seconds) of one compute of a schedule, run serially as ggml does."""
    per_backend = modeled_by_backend(sched)
    return (sum(m.compute_s or 0.0 for m in per_backend),
            sum(m.copy_s or 0.0 for m in per_backend))
