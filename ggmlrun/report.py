"""Rich tables and JSON objects from result objects. Nothing here computes a result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ggmlrun.core.util.fmt import human_bytes

if TYPE_CHECKING:     # rich and the engine load when a table is drawn, not on every command
    from rich.console import Console
    from rich.table import Table as RichTable

    from ggmlrun.core.engine import BackendMemory
    from ggmlrun.core.run.exec import RunResult
    from ggmlrun.core.sched.schedule import Schedule


# --- JSON --------------------------------------------------------------------------------------
def plan_dict(sched: Schedule) -> dict:
    splits = []
    for split in sched.splits:
        splits.append({
            "backend": sched.backends[split.backend].name,
            "nodes": [n.name for n in split.nodes],
            "inputs": [{"name": src.name, "bytes": copy.nbytes, "from": sched.backend_name(src),
                        "copy": copy.name}
                       for src, copy in zip(split.inputs, split.copies)],
        })
    nodes = []
    for node in sched.graph.nodes:
        nodes.append({
            "name": node.name, "op": node.op, "backend": sched.backend_name(node),
            "cause": sched.cause.get(node, ""),
            **({"reason": sched.reasons[node]} if node in sched.reasons else {}),
            "srcs": [{"name": s.name, "backend": sched.backend_name(s),
                      "cause": sched.cause.get(s, "")} for s in sched.srcs_of[node]],
        })
    data = {"graph": sched.graph.name, "backends": [b.name for b in sched.backends],
            "splits": splits, "nodes": nodes, "n_splits": len(sched.splits),
            "copy_count": sched.copy_count, "copy_bytes": sched.copy_bytes}
    if sched.policy is not None:
        outcome = sched.policy
        data["policy"] = {
            "name": "cost", "kept": outcome.kept, "note": outcome.note,
            "ggml": {"compute_s": outcome.ggml_time[0], "copy_s": outcome.ggml_time[1],
                     "total_s": sum(outcome.ggml_time)},
            "cost": {"compute_s": outcome.cost_time[0], "copy_s": outcome.cost_time[1],
                     "total_s": sum(outcome.cost_time)},
        }
    return data


def measure_dict(memory: list[BackendMemory]) -> dict:
    return {"backends": [{"name": m.name, "kind": m.kind, "arena_bytes": m.arena_bytes,
                          "planner": m.planner, "ggml_arena_bytes": m.ggml_arena_bytes,
                          "weights_bytes": m.weights_bytes,
                          "lower_bound_bytes": m.lower_bound_bytes,
                          "no_reuse_bytes": m.no_reuse_bytes, "memory_bytes": m.memory}
                         for m in memory]}


def run_dict(sched: Schedule, memory: list[BackendMemory], result: RunResult,
             summaries: dict[str, dict]) -> dict:
    data = plan_dict(sched)
    data.update(measure_dict(memory))
    data["outputs"] = summaries
    data["timings"] = timings_dict(result)
    data["copied"] = {"count": result.copied_count, "bytes": result.copied_bytes}
    return data


CONTROL = dict.fromkeys(c for c in range(0x20)) | {0x7f: None} | dict.fromkeys(range(0x80, 0xa0))


def plain(text: str) -> str:
    """Text without control characters: an escape code in a name never reaches the terminal."""
    return str(text).translate(CONTROL)


def clean(text: str) -> str:
    """Text safe for a terminal and for rich: control characters (escape codes) removed, markup
    escaped, so names like `[/]` or `\x1b[2J` print as what they are and never act."""
    from rich.markup import escape

    return escape(plain(text))


@dataclass
class Column:
    header: str
    justify: str = "left"
    number: bool = False     # never wrapped nor cut
    drop: int = 0            # > 0: may be dropped on a narrow terminal, the highest first


class Bytes(int):
    """A byte count cell: exact (1,064,960) when the table fits, else in MiB/GiB (coarsened)."""


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


class Table:
    """A table that never cuts a number or a name, at any terminal width.

    It is laid out when printed, for the console's width: numbers never wrap; when the table is
    too wide, byte counts first go from exact to MiB/GiB, then optional columns go (the highest
    `drop` first), and names fold onto more lines rather than losing characters. Every string
    is cleaned (control characters, markup) before it reaches rich.
    """

    def __init__(self, title: str = ""):
        self.title = title
        self.columns: list[Column] = []
        self.rows: list[list] = []

    def add_column(self, header: str, justify: str = "left", number: bool = False, drop: int = 0):
        self.columns.append(Column(header, justify, number, drop))

    def add_row(self, *cells) -> None:
        self.rows.append(list(cells))

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def __rich_console__(self, console, options):
        yield self.layout(options.max_width)

    def layout(self, width: int) -> RichTable:
        from rich.table import Table as RichTable

        keep = list(range(len(self.columns)))
        exact = True
        if self._width(keep, exact) > width:
            exact = False
        for i in sorted((i for i in keep if self.columns[i].drop),
                        key=lambda i: -self.columns[i].drop):
            if self._width(keep, exact) <= width:
                break
            keep.remove(i)
        title = clean(self.title)
        table = RichTable(title=title or None, min_width=min(len(self.title), width))
        for i in keep:
            col = self.columns[i]
            table.add_column(clean(col.header), justify=col.justify, no_wrap=col.number,
                             overflow="fold")
        for row in self.rows:
            table.add_row(*(self._cell(row[i], exact) for i in keep))
        return table

    @staticmethod
    def _plain(value, exact: bool) -> str:
        if isinstance(value, Bytes):
            return f"{value:,}" if exact else human_bytes(value)
        return plain(value)

    def _cell(self, value, exact: bool) -> str:
        from rich.markup import escape

        return escape(self._plain(value, exact))

    def _width(self, keep: list[int], exact: bool) -> int:
        """Width with nothing wrapped: each column's widest cell, padding 2 and a rule 1."""
        total = 1
        for i in keep:
            cells = [len(self._plain(row[i], exact)) for row in self.rows]
            total += max([len(self.columns[i].header)] + cells) + 3
        return total


# --- tables ------------------------------------------------------------------------------------
def _seconds(s: float | None) -> str:
    """Seconds, in the unit that reads best."""
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def split_table(sched: Schedule) -> Table:
    table = Table(title=f"splits of {sched.graph.name}: {len(sched.splits)} splits, "
                        f"{sched.copy_count} copies, {human_bytes(sched.copy_bytes)} per compute")
    table.add_column("#", "right", number=True)
    table.add_column("backend")
    table.add_column("nodes")
    table.add_column("inputs copied in")
    for i, split in enumerate(sched.splits):
        names = [n.name for n in split.nodes]
        span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"
        inputs = ", ".join(f"{src.name} ({human_bytes(copy.nbytes)} from {sched.backend_name(src)})"
                           for src, copy in zip(split.inputs, split.copies))
        table.add_row(str(i), sched.backends[split.backend].name, span, inputs or "-")
    return table


def assignment_table(sched: Schedule) -> Table:
    table = Table(title="node assignments (cause: why each node landed there)")
    table.add_column("split", "right", number=True)
    table.add_column("node")
    table.add_column("op", drop=2)
    table.add_column("bytes", "right", number=True, drop=3)
    table.add_column("backend")
    table.add_column("cause")
    table.add_column("sources", drop=4)
    reasons = sched.reasons
    split_of = {n: i for i, s in enumerate(sched.splits) for n in s.nodes}
    for node in sched.graph.nodes:
        srcs = "  ".join(f"{s.name} [{sched.backend_name(s)} {sched.cause.get(s, '')}]"
                         for s in sched.srcs_of[node])
        cause = sched.cause.get(node, "")
        if node in reasons:
            cause += f": {reasons[node]}"
        table.add_row(str(split_of.get(node, "")), node.name, node.op, Bytes(node.nbytes),
                      sched.backend_name(node), cause, srcs)
    return table


def _ggml_size(n: int) -> str:
    return f"{n // 1024 // 1024}M" if n >= 1024 * 1024 else f"{n // 1024}K"


def ggml_dump(sched: Schedule) -> str:
    """The GGML_SCHED_DEBUG=2 text, causes included (ggml compiles them out by default)."""
    from ggmlrun.core.ir.ops import get_op

    lines = []
    starts = {id(s.nodes[0]): (i, s) for i, s in enumerate(sched.splits) if s.nodes}
    for i, node in enumerate(sched.graph.nodes):
        if id(node) in starts:
            k, split = starts[id(node)]
            head = f"## SPLIT #{k}: {sched.backends[split.backend].name} # {len(split.inputs)} inputs"
            if split.inputs:
                head += ": " + " ".join(f"[{s.name} ({_ggml_size(s.nbytes):>5.5})]" for s in split.inputs)
            lines += ["", head]
        if get_op(node.op).view_op:
            continue
        line = (f"node #{i:3d} ({node.op.upper():>10.10}): {node.name:>20.20} "
                f"({_ggml_size(node.nbytes):>5.5}) [{sched.backend_name(node):>5.5} "
                f"{sched.cause.get(node, ''):>8.8}]:")
        for src in sched.srcs_of[node]:
            line += (f" {src.name:>20.20} ({_ggml_size(src.nbytes):>5.5}) "
                     f"[{sched.backend_name(src):>5.5} {sched.cause.get(src, ''):>8.8}]")
        lines.append(line)
    return "\n".join(lines).lstrip("\n")


def measure_table(memory: list[BackendMemory], title: str, fit=None) -> Table:
    table = Table(title=title)
    table.add_column("backend")
    table.add_column("kind", drop=5)
    for col, drop in (("arena (ggml)", 2), ("arena (best)", 0), ("lower bound", 3),
                      ("no reuse", 4), ("weights", 0), ("memory", 0)):
        table.add_column(col, "right", number=True, drop=drop)
    if fit is not None:
        table.add_column("fits")
    for i, m in enumerate(memory):
        best = Bytes(m.arena_bytes) if m.planner == "best" else "-"
        row = [m.name, m.kind, Bytes(m.ggml_arena_bytes), best, Bytes(m.lower_bound_bytes),
               Bytes(m.no_reuse_bytes), Bytes(m.weights_bytes), Bytes(m.memory)]
        if fit is not None:
            row.append("yes" if fit.backends[i].fits else "NO")
        table.add_row(*row)
    return table


def host_line(fit) -> str:
    """The whole-machine check, under the per-backend table."""
    verdict = "fits" if fit.host_fits else "does NOT fit"
    return (f"host RAM: {fit.host_bytes:,} bytes ({human_bytes(fit.host_bytes)}) for every "
            f"backend together (simulated devices live in host RAM) of "
            f"{fit.host_memory_bytes:,} ({human_bytes(fit.host_memory_bytes)}): {verdict}")


def layer_fit_line(f, op_offload: bool) -> str:
    """The --fit answer, as a user would ask it: how many layers go on the device."""
    line = (f"{f.layers} of {f.total} layers fit on {f.device} "
            f"(op offload {'on' if op_offload else 'off'})")
    if not f.base_fits:
        line += f": {f.device} is over its memory even with no layer on it"
    return line


def layer_fit_dict(f, op_offload: bool) -> dict:
    return {"device": f.device, "layers": f.layers, "total": f.total, "base_fits": f.base_fits,
            "op_offload": op_offload}


def fits_dict(fit) -> dict:
    """`fits` per backend and for the whole machine, for --json."""
    return {**fit.as_dict(),
            "memory": [{"name": b.name, "weights_bytes": b.weights_bytes,
                        "arena_bytes": b.arena_bytes, "need_bytes": b.need_bytes,
                        "memory_bytes": b.memory_bytes, "fits": b.fits} for b in fit.backends]}


MiB = 1024 * 1024


def summary_table(summary, fit=None) -> Table:
    """llama.cpp's start-up figures: model and compute buffers, graph nodes and splits; with
    `fit`, whether each backend's weights + arena fit its memory."""
    from ggmlrun.core.observe.summary import layer_ranges

    table = Table(title=f"summary (MiB): graph nodes = {summary.n_nodes}, graph splits = "
                        f"{summary.n_splits}")
    table.add_column("backend")
    for col, drop in (("model", 0), ("compute", 0), ("copy in", 1), ("copy out", 1),
                      ("nodes", 0)):
        table.add_column(col, "right", number=True, drop=drop)
    table.add_column("causes")
    layered = any(b.layers for b in summary.backends)
    if layered:
        table.add_column("layers")
    if fit is not None:
        table.add_column("fits")
    for i, b in enumerate(summary.backends):
        causes = ", ".join(f"{cause or '-'} {n}" for cause, n in b.causes.most_common())
        row = [b.name, f"{b.weights_bytes / MiB:.2f}", f"{b.arena_bytes / MiB:.2f}",
               f"{b.copy_in_bytes / MiB:.2f}", f"{b.copy_out_bytes / MiB:.2f}", str(b.nodes),
               causes or "-"]
        row += [layer_ranges(b.layers) or "-"] if layered else []
        row += [("yes" if fit.backends[i].fits else "NO")] if fit is not None else []
        table.add_row(*row)
    return table


def summary_dict(summary) -> dict:
    return {"n_nodes": summary.n_nodes, "n_splits": summary.n_splits,
            "offloaded_weights": {"count": summary.offloaded_weights,
                                  "bytes": summary.offloaded_bytes},
            "backends": [{"name": b.name, "model_bytes": b.weights_bytes,
                          "compute_bytes": b.arena_bytes, "copy_in_bytes": b.copy_in_bytes,
                          "copy_out_bytes": b.copy_out_bytes, "nodes": b.nodes,
                          "causes": dict(b.causes), "layers": b.layers}
                         for b in summary.backends]}


def offload_note(summary) -> str | None:
    """One line whenever op offload copies CPU weights to a device, with the way to turn it off."""
    if not summary.offloaded_weights:
        return None
    return (f"note: op offload copies {summary.offloaded_weights} CPU weights "
            f"({human_bytes(summary.offloaded_bytes)}) to a device per compute, since the batch "
            f"reaches the device's offload_min_batch; turn it off with --no-op-offload or raise "
            f"--offload-min-batch")


def policy_table(sched: Schedule) -> Table:
    """Modeled time of one compute under both policies, side by side."""
    outcome = sched.policy
    table = Table(title=f"modeled time per compute: ggml policy vs cost policy (kept: {outcome.kept})"
                        + (f"; {outcome.note}" if outcome.note else ""))
    table.add_column("policy")
    for col in ("compute", "copies", "total"):
        table.add_column(col, "right", number=True)
    for name, (compute, copy) in (("ggml", outcome.ggml_time), ("cost", outcome.cost_time)):
        table.add_row(name, _seconds(compute), _seconds(copy), _seconds(compute + copy))
    return table


def timing_table(result: RunResult) -> Table:
    """Per run: measured means beside the cost model's figure (totals over all runs: --json)."""
    runs = max(result.repeat, 1)
    table = Table(title=f"copies and computes per run (mean of {runs} run{'s' if runs > 1 else ''})")
    table.add_column("backend")
    for col, drop in (("copies", 2), ("copy bytes", 0), ("copy measured", 0), ("copy modeled", 1),
                      ("nodes", 3), ("compute measured", 0), ("compute modeled", 1)):
        table.add_column(col, "right", number=True, drop=drop)
    for t in result.timings:
        table.add_row(t.name, str(t.copy_count), Bytes(t.copy_bytes), _seconds(t.copy_s / runs),
                      _seconds(t.copy_modeled_s), str(t.compute_count),
                      _seconds(t.compute_s / runs), _seconds(t.compute_modeled_s))
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
        line += (f"; per run: mean {_seconds(statistics.fmean(runs))}, median "
                 f"{_seconds(statistics.median(runs))}, modeled {_seconds(modeled_run_s(result))}")
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


def ops_table(backends) -> Table:
    from ggmlrun.core.ir.ops import OPS

    table = Table(title="ops")
    table.add_column("op")
    table.add_column("srcs", number=True)
    table.add_column("params", drop=2)
    table.add_column("in-place", drop=3)
    for b in backends:
        table.add_column(b.name)
    table.add_column("summary", drop=1)
    for name, spec in sorted(OPS.items()):
        lo, hi = spec.n_src
        params = ", ".join(spec.params) or "-"
        marks = ["yes" if b.supports_op(name) else "no" for b in backends]
        table.add_row(name, str(lo) if lo == hi else f"{lo}-{hi}", params,
                      "yes" if spec.inplace else "", *marks, spec.summary)
    return table


def ops_dict(backends) -> dict:
    from ggmlrun.core.ir.ops import OPS

    return {"ops": [{"name": name, "n_src": list(spec.n_src), "params": list(spec.params),
                     "inplace": spec.inplace, "view": spec.view_op,
                     "backends": [b.name for b in backends if b.supports_op(name)],
                     "summary": spec.summary} for name, spec in sorted(OPS.items())]}


def print_tables(console: Console, *tables) -> None:
    for table in tables:
        console.print(table)


def pack_table(name: str, n_buffers: int, result, capacity: int | None) -> Table:
    table = Table(title=f"pack {name}: {n_buffers} buffers")
    for col in ("peak", "lower bound", "greedy peak", "capacity"):
        table.add_column(col, "right", number=True, drop=2 if col == "greedy peak" else 0)
    table.add_column("method")
    table.add_column("seconds", "right", number=True, drop=1)
    table.add_row(Bytes(result.peak), Bytes(result.lower_bound), Bytes(result.greedy_peak),
                  "-" if capacity is None else Bytes(capacity),
                  result.method + (" (optimal)" if result.optimal else ""),
                  f"{result.seconds:.2f}")
    return table


# --- models (GGUF files and cards) ---------------------------------------------------------------
def model_summary(model) -> dict:
    import math

    from ggmlrun.core.ir.types import TYPES

    weights = sum(TYPES[t.dtype].row_bytes(math.prod(t.shape)) for t in model.tensors.values())
    hp = model.hparams
    return {"architecture": model.arch, "n_layer": hp.n_layer, "n_embd": hp.n_embd,
            "n_head": hp.n_head, "n_head_kv": hp.n_head_kv, "n_ff": hp.n_ff,
            "n_vocab": hp.n_vocab, "n_ctx_train": hp.n_ctx_train,
            "tensors": len(model.tensors), "weights_bytes": weights,
            "tied_embeddings": "output.weight" not in model.tensors}


def model_measure_dict(model, figures, memory: list[BackendMemory]) -> dict:
    """SPEC section 5's keys; `lower_bound_bytes` is the allocator's lower bound of the last
    reserved graph (a pp graph), so it bounds that graph's arena, not the max over reserves."""
    lower = {m.name: m.lower_bound_bytes for m in memory}
    return {"model": model.name, "n_nodes": figures.n_nodes, "n_splits": figures.n_splits,
            "ctx": figures.ctx, "ubatch": figures.ubatch, "ngl": figures.ngl,
            "backends": [{"name": b.name, "kind": b.kind, "arena_bytes": b.arena_bytes,
                          "weights_bytes": b.weights_bytes, "kv_bytes": b.kv_bytes,
                          "lower_bound_bytes": lower.get(b.name, 0),
                          "memory_bytes": b.memory_bytes} for b in figures.backends]}


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def model_measure_table(model, figures) -> Table:
    table = Table(title=f"{model.name}: ctx {figures.ctx}, ubatch {figures.ubatch}, "
                        f"ngl {figures.ngl}; graph nodes {figures.n_nodes}, graph splits "
                        f"{figures.n_splits}")
    for col in ("backend", "kind", "model (weights)", "KV cache", "compute", "total", "memory"):
        table.add_column(col, justify="left" if col in ("backend", "kind") else "right",
                         number=col not in ("backend", "kind"))
    for b in figures.backends:
        total = b.weights_bytes + b.kv_bytes + b.arena_bytes
        table.add_row(b.name, b.kind, f"{b.weights_bytes:,}", f"{b.kv_bytes:,}",
                      f"{b.arena_bytes:,}", f"{total:,} ({human_bytes(total)})",
                      human_bytes(b.memory_bytes))
    return table


def model_run_dict(result: RunResult, summaries: dict[str, dict]) -> dict:
    return {"outputs": summaries,
            "timings": {"repeat": result.repeat,
                        "backends": [{"name": t.name, "copy_s": t.copy_s,
                                      "compute_s": t.compute_s, "copy_bytes": t.copy_bytes}
                                     for t in result.timings]}}


def model_fit_dict(model, result) -> dict:
    return {"model": model.name, "ngl": result.ngl, "ctx": result.ctx,
            "n_layer": result.n_layer, "fits": result.fits, "shown_ngl": result.shown_ngl,
            "backends": [{"name": b.name, "kind": b.kind, "weights_bytes": b.weights_bytes,
                          "kv_bytes": b.kv_bytes, "arena_bytes": b.arena_bytes,
                          "total_bytes": b.total_bytes, "memory_bytes": b.memory_bytes,
                          "margin_bytes": b.margin_bytes, "free_bytes": b.free_bytes,
                          "fits": b.fits} for b in result.backends],
            "probes": [{"ngl": n, "ctx": c} for n, c in result.probes],
            "seconds": result.seconds,
            **({"advice": result.advice} if result.advice else {})}


def fit_table(model, result) -> Table:
    where = (f"-ngl {result.ngl} of {result.n_layer + 1}" if result.fits
             else f"nothing fits; shown: -ngl {result.shown_ngl}")
    table = Table(title=f"fit {model.name}: {where}, ctx {result.ctx} "
                        f"({len(result.probes)} reserves, {_seconds(result.seconds)})")
    for col in ("backend", "model", "KV", "compute", "total", "memory", "margin", "free", "fits"):
        table.add_column(col, justify="left" if col in ("backend", "fits") else "right",
                         number=col not in ("backend", "fits"))
    for b in result.backends:
        table.add_row(b.name, _mib(b.weights_bytes), _mib(b.kv_bytes), _mib(b.arena_bytes),
                      _mib(b.total_bytes), _mib(b.memory_bytes), _mib(b.margin_bytes),
                      _mib(b.free_bytes), "yes" if b.fits else "NO")
    return table


def fit_line(result) -> str:
    if not result.fits:
        return "llama.cpp: nothing fits (see the error below)"
    return f"llama.cpp: -ngl {result.ngl} -c {result.ctx}"
