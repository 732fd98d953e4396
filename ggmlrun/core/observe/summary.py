"""The figures llama.cpp users read first, per backend: model and compute buffers, copies in and
out, node counts with their causes, and which layers each device holds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ggmlrun.core.memory.fits import layers_by_backend


@dataclass
class BackendSummary:
    name: str
    weights_bytes: int = 0          # llama.cpp's "model buffer"
    arena_bytes: int = 0            # its "compute buffer"
    copy_in_bytes: int = 0          # copied to this backend per compute
    copy_out_bytes: int = 0         # copied from it per compute
    nodes: int = 0
    causes: Counter = field(default_factory=Counter)
    layers: list[int] = field(default_factory=list)


@dataclass
class Summary:
    n_nodes: int
    n_splits: int
    backends: list[BackendSummary]
    offloaded_weights: int          # CPU weights op offload copies to a device, per compute
    offloaded_bytes: int


def summarize(sched, memory=None) -> Summary:
    """`memory`: the measure pass's figures, when they were taken (plan alone has none)."""
    rows = [BackendSummary(b.name) for b in sched.backends]
    for node in sched.graph.nodes:
        b = sched.backend_of.get(node, -1)
        if b >= 0:
            rows[b].nodes += 1
            rows[b].causes[sched.cause.get(node, "")] += 1
    offloaded, offloaded_bytes = 0, 0
    for split in sched.splits:
        for src, copy in zip(split.inputs, split.copies):
            rows[split.backend].copy_in_bytes += copy.nbytes
            source = sched.backend_of.get(src.view_src or src, -1)
            if source >= 0:
                rows[source].copy_out_bytes += copy.nbytes
            if ((src.view_src or src).role == "weight" and source >= 0
                    and sched.backends[source].kind == "cpu"
                    and sched.backends[split.backend].kind != "cpu"):
                offloaded += 1
                offloaded_bytes += copy.nbytes
    for m, row in zip(memory or [], rows):
        row.weights_bytes, row.arena_bytes = m.weights_bytes, m.arena_bytes
    held = layers_by_backend(sched)
    for row in rows:
        row.layers = held.get(row.name, [])
    return Summary(len(sched.graph.nodes), len(sched.splits), rows, offloaded, offloaded_bytes)


def layer_ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts, start = [], None
    for i, n in enumerate(layers):
        if start is None:
            start = n
        if i + 1 == len(layers) or layers[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)
