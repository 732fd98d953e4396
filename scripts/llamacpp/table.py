"""ggmlrun beside real llama.cpp for every recorded configuration, as a Markdown table.

Runs ggmlrun's CLI in-process exactly as tests/test_llamacpp_figures.py does (same helpers),
so the table in docs/models.md is what the tests check, measured:

    python3 scripts/llamacpp/table.py [--no-run]

Byte columns are llama.cpp's figures (model / KV / compute buffer per backend, then "+ state N"
for a hybrid model's recurrent state); the ggmlrun
column says "equal" when every byte count, node count and split count is the same, and lists
the differences otherwise. The last column is the largest logit difference relative to
llama.cpp's largest logit, against SPEC's tolerance.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.test_llamacpp_figures import (  # noqa: E402  (the repository root is needed first)
    CONFIGS, FIGURES, compare_logits, compare_measure, logits_tolerance, measured, run_logits)


def bytes_cell(figures: dict | None) -> str:
    if figures is None:   # RPC1 exists only in the -ts configurations
        return "-"
    state = f" + state {figures['state_bytes']}" if figures.get("state_bytes") else ""
    return f"{figures['weights_bytes']} / {figures['kv_bytes']} / {figures['arena_bytes']}{state}"


def logits_cell(cfg: dict, workdir: Path) -> tuple[str, bool]:
    try:
        error = compare_logits(cfg, run_logits(cfg, workdir / "out.npz"))
    except AssertionError as failure:
        return f"run failed: {str(failure).splitlines()[0][:60]}", False
    ok = error <= logits_tolerance(cfg)
    return f"{error:.1e} {'<=' if ok else '>'} {logits_tolerance(cfg):.0e}", ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-run", action="store_true", help="compare bytes and counts only")
    args = parser.parse_args(argv)
    started = time.monotonic()
    print(f"llama.cpp: llama-cpp-python {FIGURES['llama_cpp_python']}, ggml {FIGURES['ggml']}; "
          f"tokens {FIGURES['tokens']}; backends {FIGURES['backends_file']}\n")
    print("| configuration | nodes | splits | RPC0 model / KV / compute | RPC1 model / KV / compute "
          "| CPU model / KV / compute | ggmlrun | logits error |")
    print("|---|---|---|---|---|---|---|---|")
    exact = close = 0
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in CONFIGS:
            try:
                diffs = compare_measure(cfg, measured(cfg))
            except AssertionError as failure:
                diffs = [f"measure failed: {str(failure).splitlines()[0][:60]}"]
            exact += not diffs
            verdict = ("equal" if not diffs else "; ".join(diffs)) + (
                " (pipeline parallel, 4 copies)" if cfg.get("pipeline_parallel") else "")
            logits, ok = ("not run", False) if args.no_run else logits_cell(cfg, Path(tmp))
            close += ok
            print(f"| {cfg['id']} | {cfg['n_nodes']} | {cfg['n_splits']} "
                  f"| {bytes_cell(cfg['backends']['RPC0'])} | {bytes_cell(cfg['backends'].get('RPC1'))} "
                  f"| {bytes_cell(cfg['backends']['CPU'])} "
                  f"| {verdict} | {logits} |")
    n = len(CONFIGS)
    print(f"\nbytes, nodes and splits equal in {exact}/{n} configurations"
          + ("" if args.no_run else f"; logits within tolerance in {close}/{n}")
          + f" ({time.monotonic() - started:.1f} s)")
    return 0 if exact == n and (args.no_run or close == n) else 1


if __name__ == "__main__":
    sys.exit(main())
