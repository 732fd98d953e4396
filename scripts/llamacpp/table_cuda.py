"""llama.cpp on a real GPU beside ggmlrun, as a Markdown table.

Runs ggmlrun's CLI in-process exactly as tests/test_llamacpp_cuda_figures.py does (same helpers)
on every configuration of tests/data/llamacpp/figures_cuda.json, twice: with
graphs/backends/llamacpp_cuda.yaml (the `cuda` device profile) and with
graphs/backends/llamacpp_cuda_sim.yaml (a plain sim device with ggml-cuda's alignment and op
offload only, what ggmlrun could say before the profile):

    python3 scripts/llamacpp/table_cuda.py

Columns: llama.cpp's nodes and splits; CUDA0's model / KV bytes; each backend's compute buffer;
"profile" says "equal" when every figure (nodes, splits, model, KV and compute bytes on both
backends) is ggmlrun's with the profile, else lists the differences; the plain sim device's
splits and compute buffers as differences from llama.cpp's (ggmlrun minus llama.cpp, "=" when
equal), its CUDA0 model bytes likewise, and the profile rule it lacks.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.test_llamacpp_cuda_figures import (  # noqa: E402
    CONFIGS, CUDA, CUDA_BACKENDS, differences, gaps, sim_measure)


def delta(have: int, want: int) -> str:
    return "=" if have == want else f"{have - want:+d}"


def main() -> int:
    started = time.monotonic()
    print(f"llama.cpp on {CUDA['gpu']} (driver {CUDA['driver']}, CUDA runtime {CUDA['cuda_runtime']}, "
          f"compute capability {CUDA['compute_capability']}): llama-cpp-python {CUDA['llama_cpp_python']}, "
          f"ggml {CUDA['ggml']}\n")
    print("| configuration | nodes | splits | CUDA0 model / KV | CUDA0 compute | CPU compute "
          "| profile: cuda | plain sim: splits, CUDA0 model, CUDA0 / CPU compute | plain sim lacks |")
    print("|---|---|---|---|---|---|---|---|---|")
    exact = exact_sim = 0
    for cfg in CONFIGS:
        diffs = differences(cfg, sim_measure(cfg, CUDA_BACKENDS))
        exact += not diffs
        sim = sim_measure(cfg)
        exact_sim += not differences(cfg, sim)
        cuda, cpu = cfg["backends"]["CUDA0"], cfg["backends"]["CPU"]
        sim_cuda, sim_cpu = sim["backends"]["CUDA0"], sim["backends"]["CPU"]
        plain = ", ".join([delta(sim["n_splits"], cfg["n_splits"]),
                           delta(sim_cuda["weights_bytes"], cuda["weights_bytes"]),
                           delta(sim_cuda["arena_bytes"], cuda["arena_bytes"]) + " / "
                           + delta(sim_cpu["arena_bytes"], cpu["arena_bytes"])])
        print(f"| {cfg['id']} | {cfg['n_nodes']} | {cfg['n_splits']} "
              f"| {cuda['weights_bytes']} / {cuda['kv_bytes']} | {cuda['arena_bytes']} | {cpu['arena_bytes']} "
              f"| {'equal' if not diffs else '; '.join(diffs)} | {plain} | {', '.join(gaps(cfg)) or '-'} |")
    print(f"\nevery figure equal in {exact}/{len(CONFIGS)} configurations with the cuda profile, "
          f"{exact_sim}/{len(CONFIGS)} with the plain sim device ({time.monotonic() - started:.1f} s)")
    return 0 if exact == len(CONFIGS) else 1


if __name__ == "__main__":
    sys.exit(main())
