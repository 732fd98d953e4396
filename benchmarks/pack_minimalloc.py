"""MiniMalloc's eleven "challenging" instances through the offset planner.

Usage: python benchmarks/pack_minimalloc.py [--time-limit S] [--data DIR] [--minimise] [NAMES...]

Each instance is known to fit in 1,048,576 bytes. By default the planner is asked to fit that
capacity (MiniMalloc's decision problem); with --minimise it gets no capacity and tries to
reach the lower bound instead. Every placement printed is checked with `verify`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ggmlrun.core.memory.pack import lower_bound, plan_offsets, verify
from ggmlrun.core.memory.pack_csv import read_csv
from ggmlrun.core.memory.pack_greedy import plan_greedy

CAPACITY = 1_048_576
DEFAULT_DATA = Path("/work/shared/data/minimalloc")


def run(name: str, data: Path, time_limit: float, minimise: bool) -> dict:
    bufs = read_csv(data / f"{name}.{CAPACITY}.csv")
    t0 = time.perf_counter()
    _, greedy_peak, _ = plan_greedy(bufs)
    greedy_s = time.perf_counter() - t0
    result = plan_offsets(bufs, capacity=None if minimise else CAPACITY, time_limit=time_limit)
    problems = verify(bufs, result.offsets)
    return {"name": name, "buffers": len(bufs), "lb": lower_bound(bufs), "greedy": greedy_peak,
            "greedy_s": greedy_s, "peak": result.peak, "fits": result.peak <= CAPACITY,
            "seconds": result.seconds, "method": result.method, "valid": not problems}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list("ABCDEFGHIJK"))
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--minimise", action="store_true")
    args = parser.parse_args(argv)
    header = (f"{'inst':4} {'buffers':>7} {'lower bound':>11} {'greedy peak':>11} "
              f"{'search peak':>11} {'fits 1048576':>12} {'seconds':>8}  method")
    print(header)
    print("-" * len(header))
    ok = True
    for name in args.names:
        r = run(name, args.data, args.time_limit, args.minimise)
        ok &= r["valid"] and r["fits"]
        print(f"{r['name']:4} {r['buffers']:>7} {r['lb']:>11} {r['greedy']:>11} {r['peak']:>11} "
              f"{'yes' if r['fits'] else 'NO':>12} {r['seconds']:>8.2f}  {r['method']}"
              + ("" if r["valid"] else "  INVALID"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
