"""Reports of a model (a GGUF file or a card): its summary, `measure`, `run` and `fit`."""

from __future__ import annotations

import shlex

from typing import TYPE_CHECKING

from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.report.table import Bytes, Table, pack_line, plain, seconds_text

if TYPE_CHECKING:
    from ggmlrun.core.engine import BackendMemory
    from ggmlrun.core.run.exec import RunResult


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


def planned_for_dict(backends, sources: dict[str, str], machine=None) -> dict:
    """`planned_for` [{name, kind, memory_bytes, source}], a GPU found here with its
    `device` name and `total_bytes` (memory_bytes: its free memory then); and when this
    machine's GPUs were read, `gpus_read`: what each reader said."""
    found = {f"GPU{i}": d for i, d in enumerate(machine.devices)} if machine else {}
    planned = [{"name": b.name, "kind": b.kind, "memory_bytes": b.memory,
                "source": sources.get(b.name, "default"),
                **({"device": found[b.name].name, "total_bytes": found[b.name].total}
                   if b.name in found else {})} for b in backends]
    return {"planned_for": planned, **({"gpus_read": machine.said} if machine else {})}


def planned_for_lines(backends, sources: dict[str, str], width: int = 80,
                      machine=None) -> list[str]:
    """`planned for: GPU0 24.00 GiB (--gpu), ...; host CPU 32.00 GiB (--ram)`, folded between
    items (never inside one) to the width. A GPU found here reads `GPU0 20.50 GiB free of
    24.00 GiB (NVIDIA GeForce RTX 4090, NVML)`; none found, `no GPU found (what each reader
    said): the CPU alone`."""
    found = {f"GPU{i}": d for i, d in enumerate(machine.devices)} if machine else {}

    def device(b) -> list[str]:
        d = found.get(b.name)
        if d is None or b.memory != d.free:          # (--memory resized it)
            return [f"{plain(b.name)} {human_bytes(b.memory)} ({sources.get(b.name, 'default')})"]
        return [f"{plain(b.name)} {human_bytes(d.free)} free", f"of {human_bytes(d.total)}",
                f"({plain(d.name)}, {d.source})"]

    groups = [device(b) for b in backends if b.kind != "cpu"]
    host = [f"host {plain(b.name)} {human_bytes(b.memory)} ({sources.get(b.name, 'default')})"
            for b in backends if b.kind == "cpu"]
    items = []
    for i, group in enumerate(groups):
        items += group[:-1] + [group[-1] + ("," if i < len(groups) - 1 else ";" if host else "")]
    if not groups and machine is not None:
        why = _why_none(machine.said)
        items = ["no GPU found"] + why
        items[-1] += ":"
        items.append("the CPU alone;")
    elif not groups:
        items = ["no device;"]
    return pack_line("planned for:", items + host, width)


def _why_none(said: list[str]) -> list[str]:
    """`(NVML: not installed, AMD SMI: not installed; pip install ... reads them):` as items."""
    hint = (["pip", "install", "'ggmlrun[gpu]'", "reads", "them"]
            if any(s.endswith("not installed") for s in said) else [])
    words = [s + ("," if i < len(said) - 1 else ";" if hint else "")
             for i, s in enumerate(said)] + hint
    if words:
        words[0] = "(" + words[0]
        words[-1] += ")"
    return words


def mmproj_dict(p) -> dict:
    """SPEC section 5's `mmproj`: name, backend, weights_bytes, kv_bytes (none: an encoder
    keeps no cache), arena_bytes (its compute buffer on its backend); then what libmtmd logs
    beside them: its compute buffer per backend (the raw image is a CPU input), nodes,
    splits, flash attention as resolved, the warm-up image."""
    return {"name": p.name, "backend": p.backend, "weights_bytes": p.weights_bytes,
            "kv_bytes": 0, "arena_bytes": p.arena_bytes, "projector_type": p.projector_type,
            "arena_by_backend": dict(p.arena), "n_nodes": p.n_nodes, "n_splits": p.n_splits,
            "flash_attn": p.flash_attn, "image_size": p.image_size}


def model_measure_dict(model, figures, memory: list[BackendMemory]) -> dict:
    """SPEC section 5's keys; `lower_bound_bytes` is the allocator's lower bound of the last
    reserved graph (a pp graph), so it bounds that graph's arena, not the max over reserves."""
    lower = {m.name: m.lower_bound_bytes for m in memory}
    return {"model": model.name, "n_nodes": figures.n_nodes, "n_splits": figures.n_splits,
            "n_copies": figures.n_copies,
            "ctx": figures.ctx, "ubatch": figures.ubatch, "ngl": figures.ngl,
            "backends": [{"name": b.name, "kind": b.kind, "arena_bytes": b.arena_bytes,
                          "weights_bytes": b.weights_bytes, "kv_bytes": b.kv_bytes,
                          "state_bytes": b.state_bytes,
                          "lower_bound_bytes": lower.get(b.name, 0),
                          "memory_bytes": b.memory_bytes,
                          **({"mapped_bytes": b.mapped_bytes, "repack_bytes": b.repack_bytes,
                              "output_bytes": b.output_bytes}
                             if b.kind == "cpu" else {}),
                          **({"mmproj_bytes": b.mmproj_bytes} if figures.mmproj else {})}
                         for b in figures.backends],
            **({"mmproj": mmproj_dict(figures.mmproj)} if figures.mmproj else {})}


def _unit(values) -> tuple[str, int]:
    """One unit for a whole table (in its title), so cells are bare numbers that never split
    from a unit: GiB when the largest value is a GiB or more, else MiB, else KiB (the caller
    passes the values that matter: a tiny model on a large device reads in MiB)."""
    top = max((abs(v) for v in values), default=0)
    for name, size in (("GiB", 2**30), ("MiB", 2**20)):
        if top >= size:
            return name, size
    return "KiB", 2**10


def _in(n: int, size: int) -> str:
    return f"{n / size:,.2f}"


def model_measure_table(model, figures) -> Table:
    table = Table(title=f"{model.name}: ctx {figures.ctx}, ubatch {figures.ubatch}, "
                        f"ngl {figures.ngl}; graph nodes {figures.n_nodes}, graph splits "
                        f"{figures.n_splits}"
                        + (f"; pipeline parallel ({figures.n_copies} copies of every input)"
                           if getattr(figures, "n_copies", 1) > 1 else ""))
    table.add_column("backend")
    table.add_column("kind", drop=2)
    # a hybrid model's recurrent state sits with its KV cache (both per layer, on its device)
    kv = "KV + state" if any(b.state_bytes for b in figures.backends) else "KV cache"
    # --mmproj: the projector's weights and compute buffer, a column of their own
    mm = getattr(figures, "mmproj", None)
    cols = ("model (weights)", kv, "compute") + ((f"projector ({mm.projector_type})",) if mm else ())
    for col in cols + ("total",):
        table.add_column(col, "right", number=True)
    table.add_column("memory", "right", number=True, drop=1)
    for b in figures.backends:
        total = b.weights_bytes + b.kv_bytes + b.state_bytes + b.arena_bytes + b.mmproj_bytes
        table.add_row(b.name, b.kind, Bytes(b.weights_bytes), Bytes(b.kv_bytes + b.state_bytes),
                      Bytes(b.arena_bytes), *([Bytes(b.mmproj_bytes)] if mm else []),
                      Bytes(total), Bytes(b.memory_bytes))
    return table


def draft_dict(name: str, figures, main: int) -> dict:
    """SPEC section 5's `draft`: the draft's buffers on its main backend (`main`: where most
    of its bytes are, models/draft.py's main_backend), and under `backends` every backend's
    (a draft spread over several: -ts, -ngld below all, the CPU's token embeddings)."""
    rows = figures.backends
    top = rows[main]
    return {"name": name, "backend": top.name, "weights_bytes": top.weights_bytes,
            "kv_bytes": top.kv_bytes, "arena_bytes": top.arena_bytes,
            "ctx": figures.ctx, "ubatch": figures.ubatch, "ngl": figures.ngl,
            "n_nodes": figures.n_nodes, "n_splits": figures.n_splits,
            "backends": [{"name": b.name, "weights_bytes": b.weights_bytes,
                          "kv_bytes": b.kv_bytes, "state_bytes": b.state_bytes,
                          "arena_bytes": b.arena_bytes,
                          **({"mapped_bytes": b.mapped_bytes, "output_bytes": b.output_bytes}
                             if b.kind == "cpu" else {})} for b in rows]}


def draft_lines(name: str, figures, width: int = 80, without=None) -> list[str]:
    """`draft M: ctx 4096, -ngld 29; GPU0 weights 1.2 GiB, KV 448 MiB, compute 300 MiB; ...`
    (the draft's part of the figures above it, which include it); `without`: fit's answer
    without the draft (a FitResult), what keeping it costs."""
    items = [f"ctx {figures.ctx}, -ngld {figures.ngl};"]
    used = [b for b in figures.backends
            if b.weights_bytes or b.kv_bytes or b.arena_bytes or b.state_bytes]
    for i, b in enumerate(used):
        items += [f"{plain(b.name)} weights {human_bytes(b.weights_bytes)},",
                  f"KV {human_bytes(b.kv_bytes + b.state_bytes)},",
                  f"compute {human_bytes(b.arena_bytes)}" + (";" if i < len(used) - 1 else "")]
    lines = pack_line(f"draft {plain(name)} (included above):", items, width)
    if without is not None:
        alone = (f"-ngl {without.ngl}, ctx {without.ctx}" if without.fits
                 else "nothing fits either")
        lines.append(f"without the draft: {alone}")
    return lines


def model_run_dict(result: RunResult, summaries: dict[str, dict]) -> dict:
    return {"outputs": summaries,
            "timings": {"repeat": result.repeat,
                        "backends": [{"name": t.name, "copy_s": t.copy_s,
                                      "compute_s": t.compute_s, "copy_bytes": t.copy_bytes}
                                     for t in result.timings]}}


def model_fit_dict(model, result) -> dict:
    from ggmlrun.models.options.kinds import split_numbers

    mmproj = getattr(result.measure, "mmproj", None)
    return {"model": model.name, "ngl": result.ngl, "n_cpu_moe": result.n_cpu_moe,
            "ctx": result.ctx, "n_layer": result.n_layer, "fits": result.fits, "shown_ngl": result.shown_ngl,
            "backends": [{"name": b.name, "kind": b.kind, "weights_bytes": b.weights_bytes,
                          "kv_bytes": b.kv_bytes, "state_bytes": b.state_bytes,
                          "arena_bytes": b.arena_bytes, "total_bytes": b.total_bytes, "memory_bytes": b.memory_bytes,
                          "margin_bytes": b.margin_bytes, "free_bytes": b.free_bytes,
                          "fits": b.fits,
                          **({"mmproj_bytes": b.mmproj_bytes} if mmproj else {}),
                          **({"mapped_bytes": b.mapped_bytes, "repack_bytes": b.repack_bytes,
                              "output_bytes": b.output_bytes} if b.kind == "cpu" else {})}
                         for b in result.backends],
            "probes": [{"ngl": n, "ctx": c,
                        **({"n_cpu_moe": m} if result.n_cpu_moe is not None else {}),
                        **({"tensor_split": split_numbers(ts)} if ts else {}),
                        "reserved": r}
                       for (n, c), m, ts, r in zip(
                           result.probes, result.probe_moe or [0] * len(result.probes),
                           result.probe_splits or [None] * len(result.probes),
                           result.probe_reserved or ["pp+tg"] * len(result.probes))],
            **({"tensor_split": split_numbers(result.tensor_split)}
               if getattr(result, "tensor_split", None) else {}),
            "one_more_step": [{"option": st.option, "saves_bytes": st.saves_bytes,
                               "on": list(st.where)} for st in getattr(result, "steps", [])],
            "seconds": result.seconds, "command": result.command or None,
            "program": result.program,
            **({"mmproj": mmproj_dict(mmproj)} if mmproj else {}),
            **({"advice": result.advice} if result.advice else {})}


def fit_table(model, result) -> Table:
    from ggmlrun.models.options.kinds import split_text

    where = (f"-ngl {result.ngl} of {result.n_layer + 1}" if result.fits
             else f"nothing fits; shown: -ngl {result.shown_ngl}")
    if result.n_cpu_moe:
        where += f", --n-cpu-moe {result.n_cpu_moe}"
    if getattr(result, "tensor_split", None):
        where += f", -ts {split_text(result.tensor_split)}"
    rows = result.backends
    unit, size = _unit([b.total_bytes for b in rows])    # the figures read, not the memory
    table = Table(title=f"fit {model.name}: {where}, ctx {result.ctx} "
                        f"({_probes_text(result)}, {seconds_text(result.seconds)}); "
                        f"sizes in {unit}")
    table.add_column("backend")
    kv = "KV+state" if any(b.state_bytes for b in rows) else "KV"
    mm = getattr(result.measure, "mmproj", None)     # --mmproj: a column of its own
    for col, drop in (("model", 0), (kv, 0), ("compute", 0),
                      *((("projector", 0),) if mm else ()), ("total", 0), ("memory", 0),
                      ("margin", 1), ("free", 0)):
        table.add_column(col, "right", number=True, drop=drop)
    table.add_column("fits")
    for b in rows:
        table.add_row(b.name, _in(b.weights_bytes, size), _in(b.kv_bytes + b.state_bytes, size),
                      _in(b.arena_bytes, size), *([_in(b.mmproj_bytes, size)] if mm else []),
                      _in(b.total_bytes, size),
                      _in(b.memory_bytes, size), _in(b.margin_bytes, size),
                      _in(b.free_bytes, size), "yes" if b.fits else "NO")
    return table


def host_lines(backends, no_mmap: bool = False, width: int = 80) -> list[str]:
    """What the host's share is made of: the model file mapped (page cache: the kernel may
    drop and reread it, and processes mapping the same file share it; --no-mmap: allocated)
    and the memory allocated for good (repacked weights, KV cache, compute and output
    buffers)."""
    cpu = next((b for b in backends if b.kind == "cpu"), None)
    if cpu is None:
        return []
    other = cpu.weights_bytes - cpu.mapped_bytes - cpu.repack_bytes   # (a card: none)
    allocated = (cpu.repack_bytes + cpu.kv_bytes + cpu.state_bytes + cpu.arena_bytes
                 + cpu.output_bytes + other)
    how = "allocated (--no-mmap)," if no_mmap else "mapped (page cache),"
    items = [f"weights {human_bytes(cpu.mapped_bytes)}", how,
             f"{human_bytes(allocated + (cpu.mapped_bytes if no_mmap else 0))} allocated in all:",
             f"repacked {human_bytes(cpu.repack_bytes)},", f"KV {human_bytes(cpu.kv_bytes)},",
             *([f"state {human_bytes(cpu.state_bytes)},"] if cpu.state_bytes else []),
             f"compute {human_bytes(cpu.arena_bytes)},", f"output {human_bytes(cpu.output_bytes)}"]
    return pack_line(f"host {plain(cpu.name)}:", items, width)


def fit_line(result, model: list[str] | tuple = ()) -> str:
    """The line to paste: the program whose defaults it leaves out (--for), the model as
    llama.cpp names it (`model`: -m PATH, -hf OWNER/REPO:QUANT), the options; and what one
    more step would free (the steps are in the error when nothing fits)."""
    from ggmlrun.models.fit.steps import steps_text

    if not result.fits:
        return f"{result.program}: nothing fits (see the error below)"
    more = steps_text(getattr(result, "steps", []))
    line = " ".join([result.program, *map(shlex.quote, model), result.command])
    return line + (f"\n{more}" if more else "")


def llamacpp_fit_lines(llama: dict, result, width: int = 80) -> list[str]:
    """llama.cpp's own --fit beside ggmlrun's answer, folded to `width` between options:
    `llama-server would pick: -c 16384 -ngl 41 ...; ggmlrun's answer: ctx 32768, -ngl 49 with
    --n-cpu-moe 3`."""
    if llama["refused"]:
        prefix = "llama-server's --fit would refuse"
        items = [f"({llama['refused']})", "and", "run", f"-c {llama['ctx']}"]
    else:
        prefix = "llama-server would pick:"
        items = [f"-c {llama['ctx']}", f"-ngl {llama['ngl']}"]
        if llama["tensor_split"]:
            items.append("-ts " + ",".join(map(str, llama["tensor_split"])))
        if llama["override_tensor"]:
            items.append("-ot \"" + ",".join(llama["override_tensor"]) + "\"")
    if result.fits:
        items[-1] += ";"
        items += ["ggmlrun's answer:", f"ctx {result.ctx},", f"-ngl {result.ngl}"]
        if result.n_cpu_moe:
            items.append(f"with --n-cpu-moe {result.n_cpu_moe}")
    return pack_line(prefix, items, width)


def ran_with_lines(ran: dict, width: int = 80) -> list[str]:
    """`ran 3 tokens: ctx 2048, -ngl 5 of 5; 2 splits: SIM0 148 nodes, CPU 2 nodes`."""
    items = [f"ctx {ran['ctx']},", f"-ngl {ran['ngl']} of {ran['n_layer'] + 1};",
             f"{ran['n_splits']} split{'s' if ran['n_splits'] != 1 else ''}:"]
    splits = ran["splits"]
    items += [f"{plain(s['backend'])} {s['nodes']} nodes" + ("," if i < len(splits) - 1 else "")
              for i, s in enumerate(splits)]
    return pack_line(f"ran {ran['tokens']} token{'s' if ran['tokens'] != 1 else ''}:", items,
                     width)


def top_tokens_table(top: list[dict]) -> Table:
    """The largest logits of the last token, with each token's text from the vocabulary."""
    from ggmlrun.models.gguf.vocab import shown_text

    table = Table(title=f"top {len(top)} tokens (last position)")
    table.add_column("rank", "right", number=True, drop=1)
    table.add_column("id", "right", number=True)
    table.add_column("logit", "right", number=True)
    table.add_column("token")
    for rank, t in enumerate(top, 1):
        table.add_row(str(rank), str(t["id"]), f"{t['logit']:.4f}", shown_text(t["text"]))
    return table


# --- each device's memory as a stacked bar (fit, measure MODEL); visual.py draws it ----------
SEGMENTS = ("weights", "KV", "compute", "margin", "free")


def memory_bars(rows, margins: dict[str, int] | None = None) -> list[dict]:
    """Per backend: its memory and the bytes of each segment (weights, KV, compute, margin,
    free), and `over` (bytes past its memory, 0 when it fits). `rows` are fit rows or measure
    figures (no margin: 0)."""
    bars = []
    for r in rows:
        margin = getattr(r, "margin_bytes", 0) if margins is None else margins.get(r.name, 0)
        used = r.weights_bytes + r.kv_bytes + r.state_bytes + r.arena_bytes
        free = r.memory_bytes - used - margin
        bars.append({"name": r.name, "memory_bytes": r.memory_bytes,
                     "segments": {"weights": r.weights_bytes, "KV": r.kv_bytes + r.state_bytes,
                                  "compute": r.arena_bytes,
                                  "margin": min(margin, max(r.memory_bytes - used, 0)),
                                  "free": max(free, 0)},
                     "over": max(-free, 0)})
    return bars


def _probes_text(result) -> str:
    """How many placements were measured and how far: a miss known from the pp graph alone
    (or the weights alone) is not reserved in full."""
    reserved = result.probe_reserved or ["pp+tg"] * len(result.probes)
    short = len(reserved) - reserved.count("pp+tg")
    text = f"{len(reserved)} reserve{'s' if len(reserved) != 1 else ''}"
    return text + (f", {short} cut short as misses" if short else "")
