"""Shared helpers for the benchmark scripts (not part of the ggmlrun package)."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:          # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"NumPy {np.__version__}, load average {os.getloadavg()[0]:.2f}")


def best_of(fn, trials: int) -> float:
    """The fastest of `trials` calls of fn(), in seconds (the least disturbed run)."""
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-markdown table, columns padded so it also reads as plain text."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.3f}"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def verdict(ok: bool) -> str:
    return "meets" if ok else "SHORT"
