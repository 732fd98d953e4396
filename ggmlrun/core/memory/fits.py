"""Does the plan fit? Each backend against its own `memory`, and all of them against the host.

Every backend of ggmlrun lives in host RAM: the CPU's buffers, and the simulated devices' too
(a sim arena is a NumPy buffer). So a plan can pass every per-backend check and still not fit
the machine; both checks are made before anything is allocated or generated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ggmlrun.core.util import host
from ggmlrun.core.util.fmt import human_bytes

MEMINFO = Path(host.MEMINFO)     # kept for callers that point it elsewhere (prefer the env)


def machine_memory(meminfo: Path | None = None) -> int:
    """The host's RAM (core/util/host.py: GGMLRUN_HOST_RAM plays another machine); `meminfo`
    (or MEMINFO pointed at another file) reads that file's MemTotal instead."""
    if meminfo is None and str(MEMINFO) != host.MEMINFO:
        meminfo = MEMINFO
    if meminfo is not None:
        total = host.read_meminfo(str(meminfo)).get("MemTotal")
        if total:
            return total
    return host.ram_total()


@dataclass
class BackendFit:
    name: str
    kind: str
    weights_bytes: int
    arena_bytes: int
    memory_bytes: int

    @property
    def need_bytes(self) -> int:
        return self.weights_bytes + self.arena_bytes

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.memory_bytes


@dataclass
class Fit:
    backends: list[BackendFit]
    host_memory_bytes: int

    @property
    def host_bytes(self) -> int:
        return sum(b.need_bytes for b in self.backends)

    @property
    def host_fits(self) -> bool:
        return self.host_bytes <= self.host_memory_bytes

    @property
    def fits(self) -> bool:
        return self.host_fits and all(b.fits for b in self.backends)

    def as_dict(self) -> dict:
        return {"fits": self.fits, "host_bytes": self.host_bytes,
                "host_memory_bytes": self.host_memory_bytes, "host_fits": self.host_fits}


def check(memory, host_memory: int | None = None) -> Fit:
    """`memory`: the measure pass's per-backend figures (engine.BackendMemory)."""
    backends = [BackendFit(m.name, m.kind, m.weights_bytes, m.arena_bytes, m.memory)
                for m in memory]
    return Fit(backends, machine_memory() if host_memory is None else host_memory)


def largest_tensors(sched, backend: int | None, count: int = 3) -> list:
    """The biggest tensors holding memory on one backend (None: on any), the ones to move."""
    tensors = [t for t in sched.graph.leafs + sched.graph.nodes
               if not t.is_view and (backend is None or sched.backend_of.get(t) == backend)]
    return sorted(tensors, key=lambda t: t.nbytes, reverse=True)[:count]


def failure_message(sched, fit: Fit) -> str | None:
    """One line naming what does not fit and the largest tensors there; None when it all fits."""
    for i, b in enumerate(fit.backends):
        if not b.fits:
            return (f"backend {b.name} needs {b.need_bytes} bytes ({human_bytes(b.need_bytes)}: "
                    f"weights {human_bytes(b.weights_bytes)} + arena {human_bytes(b.arena_bytes)})"
                    f" but its memory is {b.memory_bytes} bytes ({human_bytes(b.memory_bytes)});"
                    f" largest tensors: {_largest(sched, i)}; raise its `memory` (--memory "
                    f"{b.name}=SIZE) or move weights to another backend")
    return host_failure_message(sched, fit)


def host_failure_message(sched, fit: Fit) -> str | None:
    """The host's share alone: all backends together against the machine's RAM."""
    if fit.host_fits:
        return None
    return (f"all backends together need {fit.host_bytes} bytes "
            f"({human_bytes(fit.host_bytes)}) of host RAM (memory shared with the simulated devices) "
            f"but this machine has {fit.host_memory_bytes} bytes "
            f"({human_bytes(fit.host_memory_bytes)}); largest tensors: {_largest(sched, None)}")


def _largest(sched, backend: int | None) -> str:
    return ", ".join(f"{t.name} ({human_bytes(t.nbytes)})"
                     for t in largest_tensors(sched, backend))


# --- how many layers fit: a layered graph (`gen llama` names its weights l<N>.*) ---------------
LAYER = re.compile(r"^l(\d+)\.")


def layer_weights(graph) -> dict[int, list]:
    """Each layer's weights (the KV cache included), by layer number."""
    layers: dict[int, list] = {}
    for leaf in graph.weights:
        match = LAYER.match(leaf.name)
        if match:
            layers.setdefault(int(match.group(1)), []).append(leaf)
    return layers


def layers_by_backend(sched) -> dict[str, list[int]]:
    """Which layers' weights each backend holds (a layer split across backends counts on each)."""
    held: dict[str, set[int]] = {}
    for n, leafs in layer_weights(sched.graph).items():
        for leaf in leafs:
            held.setdefault(sched.backend_name(leaf), set()).add(n)
    return {name: sorted(ns) for name, ns in held.items()}


@dataclass
class LayerFit:
    device: str
    layers: int          # how many of the last layers fit with their weights on the device
    total: int
    base_fits: bool      # False: even with no layer on it, the device is over its memory


def layers_that_fit(graph, device: str, cpu: str, measure: Callable) -> LayerFit:
    """Binary search over k, the last k layers' weights on `device` and the rest on `cpu` (as
    llama.cpp's -ngl counts them); `measure(graph)` gives the per-backend figures for a placement.
    Other weights and every node pin stay where the file put them; the graph is restored after.
    More layers on a device never take memory from it, so the search is sound."""
    layers = layer_weights(graph)
    order = sorted(layers)
    saved = {leaf: leaf.backend for leafs in layers.values() for leaf in leafs}

    def fits_with(k: int) -> bool:
        on_device = set(order[len(order) - k:]) if k else set()
        for n, leafs in layers.items():
            for leaf in leafs:
                leaf.backend = device if n in on_device else cpu
        mem = next(m for m in measure(graph) if m.name == device)
        return mem.weights_bytes + mem.arena_bytes <= mem.memory

    try:
        if not fits_with(0):
            return LayerFit(device, 0, len(order), base_fits=False)
        lo, hi = 0, len(order)          # fits_with(lo) holds
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits_with(mid):
                lo = mid
            else:
                hi = mid - 1
        return LayerFit(device, lo, len(order), base_fits=True)
    finally:
        for leaf, backend in saved.items():
            leaf.backend = backend
