"""Rich tables and JSON objects from result objects. Nothing here computes a result."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from ggmlrun.core.engine import BackendMemory
from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.core.run.exec import RunResult
from ggmlrun.core.ir.ops import OPS, get_op
from ggmlrun.core.sched.scheduler import Schedule


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
    data["timings"] = {
        "repeat": result.repeat,
        "backends": [{"name": t.name, "copy_s": t.copy_s, "compute_s": t.compute_s,
                      "copy_bytes": t.copy_bytes, "copy_count": t.copy_count,
                      "copy_modeled_s": t.copy_modeled_s, "compute_count": t.compute_count,
                      "compute_modeled_s": t.compute_modeled_s} for t in result.timings],
    }
    data["copied"] = {"count": result.copied_count, "bytes": result.copied_bytes}
    return data


class Table(RichTable):
    """A rich table whose cells are plain text: names like `[cpu 1.inp]` are never markup."""

    def add_row(self, *cells, **kwargs):
        super().add_row(*(escape(c) if isinstance(c, str) else c for c in cells), **kwargs)


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
    for col in ("#", "backend", "nodes", "inputs copied in"):
        table.add_column(col)
    for i, split in enumerate(sched.splits):
        names = [n.name for n in split.nodes]
        span = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"
        inputs = ", ".join(f"{src.name} ({human_bytes(copy.nbytes)} from {sched.backend_name(src)})"
                           for src, copy in zip(split.inputs, split.copies))
        table.add_row(str(i), sched.backends[split.backend].name, span, inputs or "-")
    return table


def assignment_table(sched: Schedule) -> Table:
    table = Table(title="node assignments (cause: why the node landed there)")
    for col in ("split", "node", "op", "bytes", "backend", "cause", "sources"):
        table.add_column(col)
    reasons = sched.reasons
    split_of = {n: i for i, s in enumerate(sched.splits) for n in s.nodes}
    for node in sched.graph.nodes:
        srcs = "  ".join(f"{s.name} [{sched.backend_name(s)} {sched.cause.get(s, '')}]"
                         for s in sched.srcs_of[node])
        cause = sched.cause.get(node, "")
        if node in reasons:
            cause += f": {reasons[node]}"
        table.add_row(str(split_of.get(node, "")), node.name, node.op, human_bytes(node.nbytes),
                      sched.backend_name(node), cause, srcs)
    return table


def _ggml_size(n: int) -> str:
    return f"{n // 1024 // 1024}M" if n >= 1024 * 1024 else f"{n // 1024}K"


def ggml_dump(sched: Schedule) -> str:
    """The GGML_SCHED_DEBUG=2 text, causes included (ggml compiles them out by default)."""
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


def measure_table(memory: list[BackendMemory], title: str) -> Table:
    table = Table(title=title)
    for col in ("backend", "kind", "arena (ggml)", "arena (best)", "lower bound", "no reuse",
                "weights", "memory"):
        table.add_column(col, justify="right" if col not in ("backend", "kind") else "left")
    for m in memory:
        best = f"{m.arena_bytes:,}" if m.planner == "best" else "-"
        table.add_row(m.name, m.kind, f"{m.ggml_arena_bytes:,}", best, f"{m.lower_bound_bytes:,}",
                      f"{m.no_reuse_bytes:,}", f"{m.weights_bytes:,}", human_bytes(m.memory))
    return table


def policy_table(sched: Schedule) -> Table:
    """Modeled time of one compute under both policies, side by side."""
    outcome = sched.policy
    table = Table(title=f"modeled time per compute: ggml policy vs cost policy (kept: {outcome.kept})"
                        + (f"; {outcome.note}" if outcome.note else ""))
    for col in ("policy", "compute", "copies", "total"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, (compute, copy) in (("ggml", outcome.ggml_time), ("cost", outcome.cost_time)):
        table.add_row(name, _seconds(compute), _seconds(copy), _seconds(compute + copy))
    return table


def timing_table(result: RunResult) -> Table:
    table = Table(title=f"copies and computes ({result.repeat} run{'s' if result.repeat > 1 else ''};"
                        f" measured totals, modeled per run)")
    for col in ("backend", "copies", "copy bytes", "copy measured", "copy modeled",
                "nodes", "compute measured", "compute modeled"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for t in result.timings:
        table.add_row(t.name, str(t.copy_count), f"{t.copy_bytes:,}", _seconds(t.copy_s),
                      _seconds(t.copy_modeled_s), str(t.compute_count), _seconds(t.compute_s),
                      _seconds(t.compute_modeled_s))
    return table


def outputs_table(summaries: dict[str, dict], check: dict[str, float] | None) -> Table:
    table = Table(title="outputs")
    cols = ["output", "shape", "dtype", "sum", "l2"] + (["max rel err vs reference"] if check else [])
    for col in cols:
        table.add_column(col)
    for name, s in summaries.items():
        row = [name, str(s["shape"]), s["dtype"], f"{s['sum']:.6g}", f"{s['l2']:.6g}"]
        if check:
            row.append(f"{check[name]:.2e}")
        table.add_row(*row)
    return table


def ops_table(backends) -> Table:
    table = Table(title="ops")
    table.add_column("op")
    table.add_column("srcs")
    table.add_column("params")
    table.add_column("in-place")
    for b in backends:
        table.add_column(b.name)
    table.add_column("summary")
    for name, spec in sorted(OPS.items()):
        lo, hi = spec.n_src
        params = ", ".join(spec.params) or "-"
        marks = ["yes" if b.supports_op(name) else "no" for b in backends]
        table.add_row(name, str(lo) if lo == hi else f"{lo}-{hi}", params,
                      "yes" if spec.inplace else "", *marks, spec.summary)
    return table


def ops_dict(backends) -> dict:
    return {"ops": [{"name": name, "n_src": list(spec.n_src), "params": list(spec.params),
                     "inplace": spec.inplace, "view": spec.view_op,
                     "backends": [b.name for b in backends if b.supports_op(name)],
                     "summary": spec.summary} for name, spec in sorted(OPS.items())]}


def print_tables(console: Console, *tables) -> None:
    for table in tables:
        console.print(table)


def pack_table(name: str, n_buffers: int, result, capacity: int | None) -> Table:
    table = Table(title=f"pack {name}: {n_buffers} buffers")
    for col in ("peak", "lower bound", "greedy peak", "capacity", "method", "seconds"):
        table.add_column(col, justify="left" if col == "method" else "right")
    table.add_row(f"{result.peak:,}", f"{result.lower_bound:,}", f"{result.greedy_peak:,}",
                  "-" if capacity is None else f"{capacity:,}",
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
                         no_wrap=True)
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


def fit_dict(model, result) -> dict:
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
                         no_wrap=True)
    for b in result.backends:
        table.add_row(b.name, _mib(b.weights_bytes), _mib(b.kv_bytes), _mib(b.arena_bytes),
                      _mib(b.total_bytes), _mib(b.memory_bytes), _mib(b.margin_bytes),
                      _mib(b.free_bytes), "yes" if b.fits else "NO")
    return table


def fit_line(result) -> str:
    if not result.fits:
        return "llama.cpp: nothing fits (see the error below)"
    return f"llama.cpp: -ngl {result.ngl} -c {result.ctx}"
