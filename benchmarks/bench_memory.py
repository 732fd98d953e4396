"""Arena sizes: ggml's allocator vs the lower bound vs no reuse, per backend, for every graph
in graphs/.

For each graph: its own backends (the file's `backends:`, else the default SIM0 + CPU), then
graphs/backends/cpu.yaml (the CPU alone, ggml's 32-byte alignment) where the graph allows it:
a graph whose weights or pins name SIM0 cannot be scheduled without SIM0, and is marked so.
Columns, in bytes of the compute arena (weights are separate and never counted here):
`ggml` the measure pass (ggml's online allocator, as ggmlrun runs it), `best` the offline
re-placement (`--planner best`), `lower bound` the most bytes live at once on the same schedule,
`no reuse` what the arena would need if no tensor reused another's bytes.

    python benchmarks/bench_memory.py          # every graph, both backend sets
    python benchmarks/bench_memory.py --quick  # the same (it takes a second or two)
"""

from __future__ import annotations

import argparse
import time

import _common
from _common import machine, table

from ggmlrun.core import engine
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.core.frontend.loader import load_graph

GRAPHS = _common.ROOT / "graphs"
CPU_ONLY = GRAPHS / "backends" / "cpu.yaml"


def measure(graph, backends):
    sched = engine.schedule(graph, backends)
    _, memory = engine.plan_memory(sched, planner="best")
    return sched, memory


def fmt(n: int) -> str:
    return f"{n:,}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="same run (already seconds-long)")
    ap.parse_args()
    cpu_only = load_backends(CPU_ONLY)
    rows, skipped = [], []
    t0 = time.perf_counter()
    for path in sorted(GRAPHS.glob("*.yaml")):
        graph = load_graph(path)
        own = engine.resolve_backends(graph, None)
        label = "file's" if graph.backends else "default"
        for set_name, backends in ((f"{label}: " + "+".join(b.name for b in own), own),
                                   ("cpu.yaml: CPU", cpu_only)):
            try:
                sched, memory = measure(graph, backends)
            except InputError as err:
                skipped.append(f"{path.name} with {set_name}: {err.message}")
                continue
            for m in memory:
                if m.no_reuse_bytes == 0 and m.weights_bytes == 0:
                    continue                     # a backend this schedule never uses
                lb = m.lower_bound_bytes
                rows.append([path.name, set_name, m.name, fmt(m.ggml_arena_bytes),
                             fmt(m.arena_bytes), fmt(lb), fmt(m.no_reuse_bytes),
                             f"{m.ggml_arena_bytes / lb:.2f}" if lb else "-",
                             f"{m.no_reuse_bytes / m.ggml_arena_bytes:.2f}"
                             if m.ggml_arena_bytes else "-",
                             fmt(m.weights_bytes)])
    elapsed = time.perf_counter() - t0
    print(f"bench_memory: compute arenas of every graph in graphs/ ({machine()})")
    print(table(["graph", "backends", "backend", "ggml arena", "best arena", "lower bound",
                 "no reuse", "ggml / bound", "no reuse / ggml", "weights"], rows))
    for line in skipped:
        print(f"not run: {line}")
    print(f"({elapsed:.1f} s)")


if __name__ == "__main__":
    main()
