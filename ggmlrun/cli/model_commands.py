"""What validate, measure and run do when GRAPH is a GGUF file or a model card (SPEC section
5): the model's summary, llama.cpp's figures with whether they fit and the llama.cpp command
line, and a run's top tokens. The options that make a model input are model_options'.
"""

from __future__ import annotations

import click

from ggmlrun import report
from ggmlrun.core.util.errors import InputError
from ggmlrun.cli.common import stdout, emit_json
from ggmlrun.cli.model_options import (draft_of, host_growth, planned_for_dict,
                                       print_model_figures, print_planned_for)


def _validate_model(model, backends, opts, as_json):
    summary = report.model_summary(model)
    if as_json:
        emit_json({"model": model.name, "valid": True, **summary})
    else:
        import shutil

        items = [f"({summary['architecture']},", f"{summary['n_layer']} layers,",
                 f"{summary['tensors']} tensors,", f"{summary['weights_bytes']:,} bytes of weights)"]
        width = shutil.get_terminal_size((160, 24)).columns
        for line in report.pack_line(f"{report.plain(model.label)}: ok", items, width):
            click.echo(line)


def _model_schedule(model, backends, opts):
    from ggmlrun.models.reserve import measure_model

    return measure_model(model, backends, opts).schedule


def measure_answer(model_input):
    """measure MODEL's figures, memory plan, fit and the line to paste, with the record
    `--json` prints (the Python API returns the same record)."""
    from ggmlrun.core import engine
    from ggmlrun.models.options.command_line import llama_cpp_line, program
    from ggmlrun.models.options.table import options_json
    from ggmlrun.models.reserve import measure_model

    model, backends, opts = model_input
    figures = measure_model(model, backends, opts)
    if figures.mmproj_note:
        click.echo(f"ggmlrun: note: {figures.mmproj_note}", err=True)
    _, memory = engine.plan_memory(figures.schedule, "ggml")
    draft = draft_of(model_input)
    extra = {}
    if draft is not None:       # both models' buffers on each backend (models/draft.py)
        from ggmlrun.models.draft import main_backend, measure_draft, with_draft

        figures = with_draft(figures, measure_draft(draft, backends, opts, model.hparams))
        extra["draft"] = report.draft_dict(draft.name, figures.draft,
                                           main_backend(figures.draft))
    fit = model_fit(figures)
    command = llama_cpp_line(opts, backends, ngl=figures.ngl, ctx=figures.ctx)
    host = next((b for b in fit.backends if b.kind == "cpu"), None)
    growth = host_growth(model_input, opts, figures.ctx,
                         host.memory_bytes - host.need_bytes if host else 0)
    record = {**report.model_measure_dict(model, figures, memory), **report.fits_dict(fit),
              **extra, "host_growth": growth, "command": command, "program": program(opts),
              "options": options_json(opts, figures.flash_attn),
              **planned_for_dict(model_input)}
    return figures, memory, fit, command, record


def _measure_model(model_input, as_json, cmd=None):
    from ggmlrun.core import engine

    if cmd is not None:
        model_input = _command_input(model_input, cmd)
    from ggmlrun.cli.model_options import llama_model_words
    from ggmlrun.models.options.command_line import paste_line

    model, backends, opts = model_input
    figures, memory, fit, command, record = measure_answer(model_input)
    if cmd is not None:
        record["unmodelled"] = list(cmd.unmodelled)
    if as_json:
        emit_json(record)
    else:
        print_model_figures(model_input, report.model_measure_table(model, figures),
                            figures.backends, opts.no_mmap,
                            paste_line(opts, command, llama_model_words(model)),
                            draft=figures.draft, growth=record["host_growth"])
    # as plan does: the figures first, then exit 1 naming what does not fit (README)
    engine.check_capacity(figures.schedule, memory, fit=fit)


def _command_input(model_input, cmd):
    """measure's options for a llama.cpp command (`-- llama-server ...`): -c absent or 0 is
    the training context, as llama.cpp allocates it; its --fit (on unless --fit off) would
    choose the context and -ngl the command leaves to it, which `fit -- ...` answers."""
    from ggmlrun.cli import llama_tail

    model = model_input[0]
    llama_tail.check_rpc(cmd, model_input[1])
    llama_tail.warn_unmodelled(cmd)
    ctx_given = "ctx" in cmd.fields or llama_tail._given("ctx_size")
    if not ctx_given:
        model_input = llama_tail.with_options(model_input, ctx=model.hparams.n_ctx_train)
    left = [w for w, left in (("-c at the training context", not ctx_given),
                             ("-ngl at every layer",
                              cmd.ngl_auto and not llama_tail._given("ngl"))) if left]
    if cmd.fit and left:
        click.echo(f"ggmlrun: note: measured with {' and '.join(left)}, as the command leaves "
                   f"them; llama.cpp's --fit (on) may lower them: `ggmlrun fit -- {cmd.tool} "
                   f"...` answers what it would need", err=True)
    return model_input


def model_fit(figures):
    """Does it fit, on llama.cpp's own figures: each backend's model + KV + compute buffers
    against its `memory` (core/memory/fits.py; the KV cache counts with the weights, as plan
    counts its tensors). The host is the CPU backend: a model's devices are the GPUs it is
    planned for (`--gpu`, a backends file), not buffers in this machine's RAM, so the host
    check is the CPU's buffers against its memory (`--ram`, else this machine's)."""
    from ggmlrun.core.memory.fits import BackendFit, Fit

    class ModelFit(Fit):
        @property
        def host_bytes(self) -> int:
            return self.backends[-1].need_bytes

    rows = [BackendFit(b.name, b.kind, b.weights_bytes + b.kv_bytes + b.state_bytes + b.output_bytes
                       + b.mmproj_bytes,
                       b.arena_bytes,
                       b.memory_bytes) for b in figures.backends]
    return ModelFit(rows, rows[-1].memory_bytes)


def _parse_tokens(text: str | None, n_vocab: int) -> list[int]:
    if not text:
        raise InputError("run MODEL needs --tokens, e.g. --tokens 1,15043,3186")
    try:
        tokens = [int(t) for t in text.replace(" ", "").split(",")]
    except ValueError:
        raise InputError(f"--tokens {text!r}: give token ids separated by commas") from None
    bad = [t for t in tokens if not 0 <= t < n_vocab]
    if bad:
        raise InputError(f"--tokens: id {bad[0]} is outside the vocabulary [0, {n_vocab})")
    return tokens


def _run_model(model_input, tokens, as_json, out_file, run_kw: dict):
    """`run MODEL`: the tokens as one batch, `--repeat` timed runs after `--warmup`, with
    `--threads`, `--trace` and `--profile` as for graphs; the top tokens, with their texts from
    the file's vocabulary, and the context, -ngl and splits it ran with."""
    from ggmlrun import visual
    from ggmlrun.core.util import host
    from ggmlrun.cli.common import stderr
    from ggmlrun.core.run import results

    model, backends, opts = model_input
    for key, flag in (("check", "--check"), ("input_specs", "--input"),
                      ("planner", "--planner")):
        if run_kw.get(key):
            raise InputError(f"{flag} applies to graph files, not to run MODEL ("
                             + {"--check": "a model's logits have no NumPy reference here; "
                                           "tests/test_models_oracle.py compares with llama.cpp",
                                "--input": "give the model its input with --tokens",
                                "--planner": "a model's buffers are ggml's allocator's, as "
                                             "llama.cpp's"}[flag] + ")", file=str(model.path))
    ids = _parse_tokens(tokens, model.hparams.n_vocab)
    trace_file = run_kw.get("trace_file")
    from ggmlrun.core.util.outputs import check_output

    if out_file is not None:
        check_output(out_file, "--out", inputs=[model.path], suffixes=(".npz",),
                     others=[("--trace", trace_file)])
    if trace_file is not None:
        check_output(trace_file, "--trace", inputs=[model.path])
    if any(t.offset is None for t in model.tensors.values()):
        raise InputError("a model card has no weights to run; run a GGUF file",
                         file=str(model.path))
    ctx = opts.ctx if opts.ctx is not None else min(model.hparams.n_ctx_train, 4096)
    if len(ids) > ctx:
        raise InputError(f"--tokens: {len(ids)} tokens do not fit the context of {ctx} (--ctx)")
    from ggmlrun.models.run import run_model

    repeat, warmup = run_kw.get("repeat", 1), run_kw.get("warmup", 0)
    profile_on = bool(run_kw.get("show_profile"))
    with visual.run_progress(stderr(), repeat) as progress:
        logits, result = run_model(model, backends, opts, ids, repeat=repeat, warmup=warmup,
                                   record_events=bool(trace_file or profile_on),
                                   progress=progress)
    _refuse_non_finite(model, logits)
    sched = result.schedule
    outputs = {"result_output": logits}
    summaries = {name: results.summarize(arr) for name, arr in outputs.items()}
    if trace_file:
        from ggmlrun.core.observe.trace import build_trace
        from ggmlrun.core.util.strict_json import strict_json

        results.write_text(trace_file, strict_json(
            build_trace(sched, result.memory_plan, result)))
        click.echo(f"wrote {trace_file}", err=True)
    if out_file:
        results.write_npz(out_file, outputs)
        click.echo(f"wrote {out_file}", err=True)
    prof = None
    if profile_on:
        from ggmlrun.core.observe.profile import profile

        prof = profile(sched, result, run_kw.get("profile_by", "op"),
                       run_kw.get("profile_sort", "total"), run_kw.get("profile_top"))
    top = top_tokens(model, logits[0])
    ran = ran_with(model, opts, sched, len(ids))
    cpu_threads = sched.backends[-1].threads
    threads = str(cpu_threads) if cpu_threads else f"default ({host.cores()} cores)"
    load = host.load_average()
    if as_json:
        payload = report.model_run_dict(result, summaries)
        payload["timings"].update({"warmup": warmup, "threads": cpu_threads,
                                   "load_average": list(load) if load else None,
                                   "per_run": report.timings_dict(result)["per_run"]})
        payload.update({"top_tokens": top, **ran, **planned_for_dict(model_input)})
        if prof is not None:
            payload["profile"] = prof.as_dict()
        emit_json(payload)
    else:
        print_planned_for(model_input)
        console = stdout()
        for line in report.ran_with_lines(ran, console.width):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        console.print(report.timing_header(result, warmup, threads, load), markup=False,
                      highlight=False)
        report.print_tables(console, report.timing_table(result), report.top_tokens_table(top),
                            report.outputs_table(summaries, None))
        if prof is not None:
            report.print_tables(console, *visual.profile_tables(prof, run_kw.get("profile_by",
                                                                                 "op")))


def _refuse_non_finite(model, logits) -> None:
    """Never a NaN or an infinity printed or written as an answer: exit 1, naming the likely
    cause (a float weight that holds one, else an overflow in the computation)."""
    import numpy as np

    from ggmlrun.core.util.errors import RunError

    bad = ~np.isfinite(logits)
    if not bad.any():
        return
    what = f"{int(np.isnan(logits).sum())} NaN and {int(np.isinf(logits).sum())} infinite"
    weight = _first_non_finite_weight(model)
    cause = (f"the weight '{weight}' holds non-finite values" if weight else
             "no float weight holds one, so the computation overflowed: look for a "
             "hyperparameter or weight scale of extreme magnitude")
    raise RunError(f"the logits have {what} values of {logits.size}; {cause}",
                   file=str(model.path))


def _first_non_finite_weight(model) -> str | None:
    """The first tensor of the file with a NaN or an infinity among its f32/f16/bf16 values or
    its blocks' f16 scales (the types whose blocks start with one: q4_0, q4_1, q5_0, q5_1,
    q8_0; the k-quants' scales are not decoded here)."""
    import numpy as np

    from ggmlrun.core.ir.types import TYPES

    kinds = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
    scaled = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
    try:
        data = np.memmap(model.path, dtype=np.uint8, mode="r")
    except (OSError, ValueError):
        return None
    for info in model.tensors.values():
        kind = kinds.get(info.dtype)
        if info.dtype in scaled and info.offset is not None:
            gtype = TYPES[info.dtype]
            n_blocks = int(np.prod(info.shape)) // gtype.block_size
            blocks = data[info.offset:info.offset + n_blocks * gtype.type_size]
            scales = blocks.reshape(n_blocks, gtype.type_size)[:, :2].copy().view(np.float16)
            if not np.isfinite(scales).all():
                return info.name
            continue
        if kind is None or info.offset is None:
            continue
        count = int(np.prod(info.shape))
        raw = data[info.offset:info.offset + count * np.dtype(kind).itemsize]
        values = raw.view(kind)
        if kind is np.uint16:                     # bf16: exponent all ones
            if ((values & 0x7F80) == 0x7F80).any():
                return info.name
        elif not np.isfinite(values).all():
            return info.name
    return None


def top_tokens(model, logits, count: int = 5) -> list[dict]:
    """The `count` largest logits: id, logit and the token's text from the file's vocabulary
    (read for those ids only, models/gguf/vocab.py)."""
    import numpy as np

    from ggmlrun.models.gguf.vocab import token_texts

    count = min(count, len(logits))
    ids = np.argsort(-logits, kind="stable")[:count]
    texts = token_texts(model.path, ids.tolist()) if model.path else {}
    return [{"id": int(i), "logit": float(logits[i]), "text": texts.get(int(i))} for i in ids]


def ran_with(model, opts, sched, n_tokens: int) -> dict:
    """The context, -ngl and splits a run used (JSON keys; the text report reads them)."""
    from ggmlrun.models.options.params import context_size, gpu_layers

    hp = model.hparams
    splits = [{"backend": sched.backends[s.backend].name, "nodes": len(s.nodes)}
              for s in sched.splits]
    return {"tokens": n_tokens, "ctx": context_size(opts, hp.n_ctx_train),
            "ngl": min(gpu_layers(opts, hp.n_layer_all), hp.n_layer_all + 1),
            "n_layer": hp.n_layer_all,
            "n_splits": len(sched.splits), "splits": splits}
