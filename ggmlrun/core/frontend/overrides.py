"""Command-line changes to a backends list and a graph's placements, applied before scheduling.

They let a user answer "what if" without editing files: another memory size (`--memory`), no
op offload (as llama.cpp's `--no-op-offload`), a CPU-only comparison of a graph whose weights
are pinned to a device (`--remap SIM0=CPU`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ggmlrun.core.util import host
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.frontend.sizes import parse_size

if TYPE_CHECKING:     # every command parses its options here: no graph, op table or YAML parser
    from ggmlrun.core.backends.spec import BackendSpec
    from ggmlrun.core.ir.graph import Graph

NO_OFFLOAD = sys.maxsize   # a batch no op reaches: ggml's op_offload = false


@dataclass
class Overrides:
    memory: dict[str, int] = field(default_factory=dict)
    remap: dict[str, str] = field(default_factory=dict)
    op_offload: bool = True
    offload_min_batch: int | None = None
    threads: int | None = None


def parse_pairs(specs, option: str) -> dict[str, str]:
    """NAME=VALUE pairs of a repeatable option; a NAME given twice is an error."""
    pairs = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InputError(f"{option} {spec!r}: expected NAME=VALUE")
        if name in pairs:
            raise InputError(f"{option}: {name} is given twice")
        pairs[name] = value
    return pairs


def parse(memory_specs=(), remap_specs=(), op_offload: bool = True,
          offload_min_batch: int | None = None, threads: int | None = None) -> Overrides:
    memory = {}
    for name, size in parse_pairs(memory_specs, "--memory").items():
        try:
            memory[name] = parse_size(size)
        except ValueError as err:
            raise InputError(f"--memory {name}={size}: {err}") from None
    return Overrides(memory=memory, remap=parse_pairs(remap_specs, "--remap"),
                     op_offload=op_offload, offload_min_batch=offload_min_batch,
                     threads=None if threads is None else min(threads, host.cores()))


def apply(graph: Graph, backends: list[BackendSpec], ov: Overrides) -> list[BackendSpec]:
    """The backends list to schedule with; `graph`'s pins are remapped in place."""
    backends = _remap(graph, backends, ov.remap)
    names = [b.name for b in backends]
    for name in ov.memory:
        if name not in names:
            raise InputError(f"--memory {name}=...: no backend {name}; {did_you_mean(name, names)}")
    out = []
    for b in backends:
        changes = {}
        if b.name in ov.memory:
            changes["memory"] = ov.memory[b.name]
        if b.kind != "cpu" and not ov.op_offload:
            changes["offload_min_batch"] = NO_OFFLOAD
        elif b.kind != "cpu" and ov.offload_min_batch is not None:
            changes["offload_min_batch"] = ov.offload_min_batch
        if b.kind == "cpu" and ov.threads is not None:
            changes["threads"] = ov.threads
        out.append(replace(b, **changes) if changes else b)
    check_pins(graph, out)
    return out


def _remap(graph: Graph, backends: list[BackendSpec], remap: dict[str, str]) -> list[BackendSpec]:
    """Every tensor placed on a remapped backend moves to its target; the source backend leaves
    the list, so nothing (op offload included) can land on it any more."""
    if not remap:
        return backends
    names = [b.name for b in backends]
    for source, target in remap.items():
        if target not in names or target in remap:
            raise InputError(f"--remap {source}={target}: no backend {target} to move to; "
                             f"{did_you_mean(target, [n for n in names if n not in remap])}")
        if source == names[-1]:
            raise InputError(f"--remap {source}={target}: {source} is the CPU backend, which "
                             f"every backends list keeps last")
    for tensor in graph.leafs + graph.nodes:
        if tensor.backend in remap:
            tensor.backend = remap[tensor.backend]
    return [b for b in backends if b.name not in remap]


def check_pins(graph: Graph, backends: list[BackendSpec]) -> None:
    """A pin to a backend the list lacks, with the way out: --remap it to one that is there."""
    names = {b.name for b in backends}
    for tensor in graph.leafs + graph.nodes:
        if tensor.backend is not None and tensor.backend not in names:
            where = "its buffer" if tensor.role == "weight" else "its pin"
            raise InputError(
                f"unknown backend '{tensor.backend}' for {where}; "
                f"{did_you_mean(tensor.backend, names)}; add it to the backends list or move "
                f"everything on it with --remap {tensor.backend}={backends[-1].name}",
                file=str(graph.path) if graph.path else None, line=tensor.line,
                culprit=tensor.describe())
