"""Print ggmlrun's and real ggml's sizes and split counts side by side, for every bundled graph.

    python -m tests.conformance.table
"""

from pathlib import Path

from ggmlrun.core import engine
from ggmlrun.core.frontend.loader import load_graph
from tests.conformance import ggml_bridge as gb
from tests.conformance.test_conformance import cpu_only, device_backends, ggml_bytes, our_cpu_bytes

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    print("| graph | ours, CPU only (B) | ggml gallocr (B) | ours: splits | ggml: splits "
          "| ours SIM0 / CPU (B) | ggml RPC / CPU (B) |")
    print("|---|---:|---:|---:|---:|---|---|")
    for path in sorted((ROOT / "graphs").glob("*.yaml")):
        graph = load_graph(path)
        flat = cpu_only(graph)
        sched = engine.schedule(graph, device_backends(graph), ggml="0.15")
        _, memory = engine.plan_memory(sched, "ggml")
        row = [path.stem, f"{our_cpu_bytes(flat):,}", f"{ggml_bytes(flat):,}", str(len(sched.splits))]
        if gb.HAS_RPC:
            theirs = gb.isolated(gb.sched_stats, graph, device="rpc")
            sizes = theirs["buffer_sizes"]
            row += [str(theirs["n_splits"]),
                    f"{memory[0].arena_bytes:,} / {memory[1].arena_bytes:,}",
                    f"{sizes['SIM0']:,} / {sizes['CPU']:,}"]
        else:
            row += ["(no RPC build)", f"{memory[0].arena_bytes:,} / {memory[1].arena_bytes:,}", "-"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
