"""Reports of a graph's schedule and memory: `plan`, `measure`, `ops`, `pack` (JSON and tables).

Nothing here computes a result; each function renders one result object the way SPEC's keys
and ggml's own debug dump name it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.report.table import Bytes, Items, Table, seconds_text

if TYPE_CHECKING:     # the engine loads when a report is made, not on every command
    from ggmlrun.core.engine import BackendMemory
    from ggmlrun.core.sched.schedule import Schedule


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
        inputs = Items((src.name, f"({human_bytes(copy.nbytes)} from {sched.backend_name(src)})")
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


def cause_legend(sched: Schedule) -> list[str]:
    """One line per cause code the schedule uses, in the order of the codes."""
    from ggmlrun.core.sched.schedule import cause_meaning

    codes = sorted({c for c in sched.cause.values() if c}, key=lambda c: (c[:1], c))
    lines = [f"  {code:<7} {cause_meaning(code)}" for code in codes if cause_meaning(code)]
    return ["causes:"] + lines if lines else []


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
        table.add_row(name, seconds_text(compute), seconds_text(copy), seconds_text(compute + copy))
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
