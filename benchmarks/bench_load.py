"""Loading big graph files: `load_graph` alone, and `ggmlrun validate` end to end (a fresh
interpreter: start-up, imports, load, the scheduler's passes, the one-line answer).

Files are `ggmlrun gen llama` output (dim 64, 32 nodes a layer, the last half of the layers'
weights on SIM0), written to a temporary directory. Beside the fast reader's figures, the full
PyYAML parser's `load_graph` time (yamlfile.FAST off) for the sizes where it is quick enough.

    python benchmarks/bench_load.py            # 1k, 10k, 100k nodes; targets below
    python benchmarks/bench_load.py --quick    # 1k and 10k only (CI smoke)
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (sys.path)
from _common import ROOT, machine, table, verdict

import ggmlrun.core.frontend.yamlfile as yamlfile
from ggmlrun.core.frontend.gen import LlamaShape, llama
from ggmlrun.core.frontend.loader import load_graph

TARGETS_S = {10_000: 0.5, 100_000: 5.0}     # `validate` wall time (issue 11, target 3)
NODES_PER_LAYER = 32
FULL_PARSER_UP_TO = 10_000                  # 100k nodes take the full parser 20-40 s


def timed_load(path: Path, trials: int, fast: bool = True) -> tuple[float, int]:
    yamlfile.FAST = fast
    try:
        best, nodes = float("inf"), 0
        for _ in range(trials):
            gc.collect()
            t0 = time.perf_counter()
            graph = load_graph(path)
            best = min(best, time.perf_counter() - t0)
            nodes = len(graph.nodes)
            del graph
        return best, nodes
    finally:
        yamlfile.FAST = True


def timed_validate(path: Path, trials: int) -> float:
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ggmlrun", "validate", str(path)],
                              cwd=ROOT, capture_output=True, text=True)
        best = min(best, time.perf_counter() - t0)
        if done.returncode:
            raise SystemExit(f"validate failed: {done.stderr.strip()}")
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1k and 10k nodes only (CI smoke)")
    args = ap.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    full_up_to = 1_000 if args.quick else FULL_PARSER_UP_TO
    print(f"bench_load: `gen llama` files, dim 64, {NODES_PER_LAYER} nodes a layer "
          f"({machine()})")
    rows, verdicts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare = time.perf_counter() - start
        for target in sizes:
            layers = max(1, round(target / NODES_PER_LAYER))
            path = Path(tmp) / f"llama_{target}.yaml"
            path.write_text(llama(LlamaShape(layers=layers, dim=64, heads=4, ffn=172, batch=8,
                                             offload=layers // 2)))
            trials = 3 if target <= 10_000 else 2
            t_load, nodes = timed_load(path, trials)
            t_full = (f"{timed_load(path, 1, fast=False)[0]:.2f}" if target <= full_up_to
                      else "-")
            t_validate = timed_validate(path, trials)
            goal = TARGETS_S.get(target)
            if goal is not None:
                verdicts.append(f"target `validate` on {nodes:,} nodes <= {goal} s: "
                                f"{verdict(t_validate <= goal)} ({t_validate:.2f} s)")
            rows.append([f"{nodes:,}", f"{path.stat().st_size / 2**20:.1f}", f"{t_load:.3f}",
                         f"{t_load / nodes * 1e6:.1f}", t_full, f"{t_validate:.2f}",
                         f"{t_validate / nodes * 1e6:.1f}", f"{goal} s" if goal else "-"])
    print(table(["nodes", "YAML MiB", "load_graph s", "us per node", "full parser s",
                 "validate wall s", "us per node", "target"], rows))
    print(f"(a bare `python -c pass` takes {bare:.2f} s here; best of 2-3 runs each)")
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
