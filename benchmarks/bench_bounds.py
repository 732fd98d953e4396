"""Size bounds of issue 12: the inputs that used to cost minutes and gigabytes, timed end to end.

Each case runs the command line in a fresh process and reports its wall time and peak RSS:
`measure` on a fan-out graph with N tensors live at once (the offline planner past its pair
bound), `pack` on N buffers all live at once, `plan --policy cost` on an N-node chain.

    python benchmarks/bench_bounds.py            # 50k/100k live, 50k buffers, 10k chain
    python benchmarks/bench_bounds.py --quick    # small sizes (CI smoke)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.randgraph import fan_out  # noqa: E402  (the checkout root is needed first)


def chain(n: int) -> str:
    lines = ["tensors:", "  x: {shape: [64], role: input}", "nodes:",
             "  - {name: a0, op: neg, src: [x]}"]
    lines += [f"  - {{name: a{i}, op: neg, src: [a{i - 1}]}}" for i in range(1, n)]
    return "\n".join(lines) + "\n"


def dense_csv(n: int) -> str:
    return "id,lower,upper,size\n" + "".join(f"b{i},0,10,{(i % 7 + 1) * 64}\n" for i in range(n))


def timed(*args) -> tuple[float, float, int]:
    """(seconds, peak RSS in MiB of this child, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ggmlrun", *map(str, args)], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, max(peak, before) / 1024, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    cases = ([("measure", "fan-out, live", 2000), ("pack", "buffers live at once", 5000),
              ("plan --policy cost", "chain nodes", 3000)] if quick else
             [("measure", "fan-out, live", 50_000), ("measure", "fan-out, live", 100_000),
              ("pack", "buffers live at once", 50_000), ("plan --policy cost", "chain nodes", 10_000)])
    print(f"{'command':<20} {'input':<22} {'N':>8} {'seconds':>8} {'peak MiB':>9} exit")
    with tempfile.TemporaryDirectory() as tmp:
        for command, what, n in cases:
            if command == "pack":
                path = Path(tmp) / "b.csv"
                path.write_text(dense_csv(n))
                args = ["pack", path, "--json"]
            else:
                path = Path(tmp) / "g.yaml"
                path.write_text(fan_out(n) if command == "measure" else chain(n))
                args = command.split() + [path, "--json"]
            seconds, peak, code = timed(*args)
            print(f"{command:<20} {what:<22} {n:>8} {seconds:>8.1f} {peak:>9.0f} {code}",
                  flush=True)
    print(f"(peak MiB is the largest child so far: ru_maxrss of RUSAGE_CHILDREN; cores: "
          f"{os.cpu_count()})")


if __name__ == "__main__":
    main()
