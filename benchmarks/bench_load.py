"""Loading big graph files: `load_graph` alone, and `ggmlrun validate` end to end (a fresh
interpreter: start-up, imports, load, the scheduler's passes, the one-line answer, exit).

Files are `ggmlrun gen llama` output (dim 64, 32 nodes a layer, the last half of the layers'
weights on SIM0), written to a temporary directory. Beside the fast reader's figures, the full
PyYAML parser's `load_graph` time (yamlfile.FAST off) for the sizes where it is quick enough.

`validate` runs as a user's install runs it: with Python's bytecode caches. A machine that sets
PYTHONDONTWRITEBYTECODE (this project's sandboxes do) would otherwise compile every ggmlrun
module from source on every run (~0.17 s); so the child runs with that variable removed from
its environment, after one untimed run that writes the caches, and the first line printed
says so. `--as-is` keeps the environment as it is. Each `validate` row also shows the child's
CPU time (user + sys: steadier than the wall time on a busy machine) and, from separate
`--progress` runs, its load and schedule phases and the rest of that run's wall time
(interpreter start-up, imports, the answer and exit, plus rich, which `--progress` draws with) (`ggmlrun --version` alone is printed for scale, and
`import numpy` alone, which `validate` of a graph file no longer pays: docs/architecture.md,
"NumPy on first use").

    python benchmarks/bench_load.py            # 1k, 10k, 100k nodes; targets below
    python benchmarks/bench_load.py --quick    # 1k and 10k only (CI smoke)
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import resource
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
PHASE = re.compile(r"(\w+) ([0-9.]+) (s|ms|us)\b")
UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


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


def child_env(as_is: bool) -> dict:
    env = dict(os.environ)
    if not as_is:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed_run(argv: list[str], env: dict) -> tuple[float, float, str]:
    """(wall s, the child's user + sys CPU s, its stderr) of one fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stderr


def timed_validate(path: Path, trials: int, env: dict) -> tuple[float, float, dict]:
    """The fastest plain run's wall and CPU seconds (as a user runs it: `--progress` draws its
    line with rich, which a plain `validate` into a pipe never imports), and the phase times
    (load, schedule, and the rest of its own wall time) of the fastest `--progress` run: the
    rest is taken within one run, as plain and `--progress` runs' walls differ by more than it
    on a busy machine."""
    best: tuple[float, float] = (float("inf"), 0.0)
    phases: tuple[float, dict] = (float("inf"), {})
    for _ in range(trials):
        wall, cpu, _ = timed_run(["-m", "ggmlrun", "validate", str(path)], env)
        best = min(best, (wall, cpu))
        wall, _, err = timed_run(["-m", "ggmlrun", "validate", "--progress", str(path)], env)
        if wall < phases[0]:
            phases = (wall, {name: float(value) * UNIT_S[unit]
                             for name, value, unit in PHASE.findall(err.split("phases:")[-1])})
    wall, found = phases
    found["rest"] = wall - found.get("load", 0.0) - found.get("schedule", 0.0)
    return best[0], best[1], found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1k and 10k nodes only (CI smoke)")
    ap.add_argument("--as-is", action="store_true",
                    help="run `validate` in this environment, PYTHONDONTWRITEBYTECODE included")
    args = ap.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    full_up_to = 1_000 if args.quick else FULL_PARSER_UP_TO
    env = child_env(args.as_is)
    caches = "off" if env.get("PYTHONDONTWRITEBYTECODE") else "on"
    print(f"bench_load: `gen llama` files, dim 64, {NODES_PER_LAYER} nodes a layer "
          f"({machine()})")
    print(f"`validate` runs with bytecode caches {caches}"
          + (" (PYTHONDONTWRITEBYTECODE removed from its environment, as a user's install runs)"
             if "PYTHONDONTWRITEBYTECODE" in os.environ and not args.as_is else ""))
    rows, verdicts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        timed_run(["-m", "ggmlrun", "--version"], env)          # writes the caches, untimed
        bare = min(timed_run(["-c", "pass"], env)[0] for _ in range(3))
        version = min(timed_run(["-m", "ggmlrun", "--version"], env)[0] for _ in range(3))
        numpy = min(timed_run(["-c", "import numpy"], env)[0] for _ in range(3))
        for target in sizes:
            layers = max(1, round(target / NODES_PER_LAYER))
            path = Path(tmp) / f"llama_{target}.yaml"
            path.write_text(llama(LlamaShape(layers=layers, dim=64, heads=4, ffn=172, batch=8,
                                             offload=layers // 2)))
            trials = 3 if target <= 10_000 else 2
            t_load, nodes = timed_load(path, trials)
            t_full = (f"{timed_load(path, 1, fast=False)[0]:.2f}" if target <= full_up_to
                      else "-")
            t_validate, cpu, phases = timed_validate(path, trials, env)
            load_s, schedule_s = phases.get("load", 0.0), phases.get("schedule", 0.0)
            goal = TARGETS_S.get(target)
            if goal is not None:
                verdicts.append(f"target `validate` on {nodes:,} nodes <= {goal} s: "
                                f"{verdict(t_validate <= goal)} ({t_validate:.2f} s)")
            rows.append([f"{nodes:,}", f"{path.stat().st_size / 2**20:.1f}", f"{t_load:.3f}",
                         f"{t_load / nodes * 1e6:.1f}", t_full, f"{t_validate:.2f}",
                         f"{cpu:.2f}", f"{load_s:.2f}", f"{schedule_s:.2f}",
                         f"{phases['rest']:.2f}",
                         f"{goal} s" if goal else "-"])
    print(table(["nodes", "YAML MiB", "load_graph s", "us per node", "full parser s",
                 "validate wall s", "its CPU s", "load s", "schedule s", "the rest s",
                 "target"], rows))
    print(f"(best of 2-3 runs each; phases from as many `--progress` runs, the rest being that "
          f"run's start-up, imports (rich included), answer and exit. A bare "
          f"`python -c pass` takes {bare:.2f} s here, `python -c 'import numpy'` {numpy:.2f} s, "
          f"`ggmlrun --version` {version:.2f} s)")
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
