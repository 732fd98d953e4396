"""The cost model: modeled seconds for a compute on a backend and for a copy between two.

A compute is a roofline, max(FLOPs / flops, bytes touched / mem_bw). A copy crosses the host
link of every sim device it touches (sim to sim goes through the host): link_latency +
bytes / link_bw per link. The CPU has no link; its compute model is ggmlrun's own estimate.
"""

from __future__ import annotations

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


def modeled_time(sched) -> tuple[float, float]:
    """(compute seconds, copy seconds) of one compute of a schedule, run serially as ggml does."""
    compute = copy = 0.0
    for split in sched.splits:
        dst = sched.backends[split.backend]
        for original, copied in zip(split.inputs, split.copies):
            copy += copy_s(sched.backends[sched.backend_of[original]], dst, copied.nbytes)
        for node in split.nodes:
            compute += compute_s(sched.backends[sched.backend_of[node]], node)
    return compute, copy
