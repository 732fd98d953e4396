"""Reports of a `run`: outputs, copy and compute timings (measured beside modeled), JSON and tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.report.graph import measure_dict, plan_dict
from ggmlrun.report.table import Bytes, Table, seconds_text

if TYPE_CHECKING:
    from ggmlrun.core.engine import BackendMemory
    from ggmlrun.core.run.exec import RunResult
    from ggmlrun.core.sched.schedule import Schedule


def run_dict(sched: Schedule, memory: list[BackendMemory], result: RunResult,
             summaries: dict[str, dict]) -> dict:
    data = plan_dict(sched)
    data.update(measure_dict(memory))
    data["outputs"] = summaries
    data["timings"] = timings_dict(result)
    data["copied"] = {"count": result.copied_count, "bytes": result.copied_bytes}
    return data


def timings_dict(result: RunResult) -> dict:
    """SPEC's keys hold totals over all runs; `per_run` holds the same per run (means), beside
    the cost model's per-run figures and the wall time of each run."""
    import statistics

    runs = max(result.repeat, 1)
    backends = []
    for t in result.timings:
        backends.append({
            "name": t.name, "copy_s": t.copy_s, "compute_s": t.compute_s,
            "copy_bytes": t.copy_bytes * runs, "copy_count": t.copy_count * runs,
            "compute_count": t.compute_count * runs,
            "per_run": {"copy_s": t.copy_s / runs, "compute_s": t.compute_s / runs,
                        "copy_bytes": t.copy_bytes, "copy_count": t.copy_count,
                        "compute_count": t.compute_count, "copy_modeled_s": t.copy_modeled_s,
                        "compute_modeled_s": t.compute_modeled_s},
            "copy_modeled_s": t.copy_modeled_s, "compute_modeled_s": t.compute_modeled_s})
    wall = result.run_seconds
    return {"repeat": result.repeat, "backends": backends,
            "per_run": {"mean_s": statistics.fmean(wall) if wall else None,
                        "median_s": statistics.median(wall) if wall else None,
                        "modeled_s": modeled_run_s(result), "runs_s": wall}}


def timing_table(result: RunResult) -> Table:
    """Per run: measured means beside the cost model's figure (totals over all runs: --json)."""
    runs = max(result.repeat, 1)
    table = Table(title=f"copies and computes per run (mean of {runs} run{'s' if runs > 1 else ''})")
    table.add_column("backend")
    for col, drop in (("copies", 2), ("copy bytes", 0), ("copy measured", 0), ("copy modeled", 1),
                      ("nodes", 3), ("compute measured", 0), ("compute modeled", 1)):
        table.add_column(col, "right", number=True, drop=drop)
    for t in result.timings:
        table.add_row(t.name, str(t.copy_count), Bytes(t.copy_bytes), seconds_text(t.copy_s / runs),
                      seconds_text(t.copy_modeled_s), str(t.compute_count),
                      seconds_text(t.compute_s / runs), seconds_text(t.compute_modeled_s))
    return table


def modeled_run_s(result: RunResult) -> float:
    return sum((t.copy_modeled_s or 0.0) + (t.compute_modeled_s or 0.0) for t in result.timings)


def timing_header(result: RunResult, warmup: int, threads: str, load: tuple | None) -> str:
    """How the figures were taken: runs, warm-up, per-run wall time, BLAS threads, load."""
    import statistics

    runs = result.run_seconds
    line = f"{result.repeat} timed run{'s' if result.repeat > 1 else ''}"
    line += f" after {warmup} warm-up" if warmup else " (no warm-up: --warmup N)"
    if runs:
        line += (f"; per run: mean {seconds_text(statistics.fmean(runs))}, median "
                 f"{seconds_text(statistics.median(runs))}, modeled {seconds_text(modeled_run_s(result))}")
    line += f"; BLAS threads {threads}"
    if load is not None:
        line += f"; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    return line


def outputs_table(summaries: dict[str, dict], check: dict[str, float] | None) -> Table:
    table = Table(title="outputs")
    table.add_column("output")
    table.add_column("shape", number=True)
    table.add_column("dtype", drop=1)
    table.add_column("sum", "right", number=True)
    table.add_column("l2", "right", number=True)
    if check:
        table.add_column("max rel err vs reference", "right", number=True)
    for name, s in summaries.items():
        row = [name, str(s["shape"]), s["dtype"], f"{s['sum']:.6g}", f"{s['l2']:.6g}"]
        if check:
            row.append(f"{check[name]:.2e}")
        table.add_row(*row)
    return table
