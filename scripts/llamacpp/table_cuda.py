"""llama.cpp on a real GPU beside ggmlrun's sim device today, as a Markdown table.

Runs ggmlrun's CLI in-process exactly as tests/test_llamacpp_cuda_figures.py does (same helpers)
on every configuration of tests/data/llamacpp/figures_cuda.json, with
graphs/backends/llamacpp_cuda_sim.yaml (a sim device with ggml-cuda's alignment and op offload):

    python3 scripts/llamacpp/table_cuda.py

Columns: llama.cpp's nodes and splits (ggmlrun's in brackets where they differ); CUDA0's model /
KV bytes; each backend's compute buffer as llama.cpp measured it and ggmlrun's difference from it
(ggmlrun minus llama.cpp, "=" when equal); the cause the tests name for a configuration the sim
device cannot give yet.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.test_llamacpp_cuda_figures import CONFIGS, CUDA, gaps, sim_measure  # noqa: E402

def delta(have: int, want: int) -> str:
    return "=" if have == want else f"{have - want:+d}"


def main() -> int:
    started = time.monotonic()
    print(f"llama.cpp on {CUDA['gpu']} (driver {CUDA['driver']}, CUDA runtime {CUDA['cuda_runtime']}, "
          f"compute capability {CUDA['compute_capability']}): llama-cpp-python {CUDA['llama_cpp_python']}, "
          f"ggml {CUDA['ggml']}; ggmlrun: graphs/backends/llamacpp_cuda_sim.yaml\n")
    print("| configuration | nodes | splits | CUDA0 model / KV | CUDA0 compute | ggmlrun | CPU compute "
          "| ggmlrun | gap |")
    print("|---|---|---|---|---|---|---|---|---|")
    exact = 0
    for cfg in CONFIGS:
        got = sim_measure(cfg)
        cuda, cpu = cfg["backends"]["CUDA0"], cfg["backends"]["CPU"]
        have_cuda, have_cpu = got["backends"]["CUDA0"], got["backends"]["CPU"]
        same = all(got["backends"][name].get(key) == value for name, want in cfg["backends"].items()
                   for key, value in want.items()) and all(got[k] == cfg[k] for k in ("n_nodes", "n_splits"))
        exact += same
        cause = ", ".join(gaps(cfg)) or "-"
        counts = [str(cfg[k]) + ("" if got[k] == cfg[k] else f" ({got[k]})") for k in ("n_nodes", "n_splits")]
        weights = cuda["weights_bytes"] if have_cuda["weights_bytes"] == cuda["weights_bytes"] else \
            f"{cuda['weights_bytes']} ({delta(have_cuda['weights_bytes'], cuda['weights_bytes'])})"
        print(f"| {cfg['id']} | {counts[0]} | {counts[1]} | {weights} / {cuda['kv_bytes']} "
              f"| {cuda['arena_bytes']} | {delta(have_cuda['arena_bytes'], cuda['arena_bytes'])} "
              f"| {cpu['arena_bytes']} | {delta(have_cpu['arena_bytes'], cpu['arena_bytes'])} "
              f"| {cause} |")
    print(f"\nevery figure equal in {exact}/{len(CONFIGS)} configurations "
          f"({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
