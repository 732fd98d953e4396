"""Models on the command line (SPEC section 5): the model options, defined once, turned into
ModelOptions; and what validate/plan/measure/run do when GRAPH is a GGUF file or a card."""

from __future__ import annotations

from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.core import engine
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.frontend.loader import load_backends
from ggmlrun.cli.common import stdout, emit_json


# --- model options (GGUF files and model cards; SPEC section 5) --------------------------------
class _NglType(click.ParamType):
    name = "N|all"

    def convert(self, value, param, ctx):
        from ggmlrun.models.options import I32_MAX

        if isinstance(value, int) or value is None:
            return value
        if str(value).lower() == "all":
            return None
        try:
            n = int(value)
        except ValueError:
            n = -1
        if not 0 <= n <= I32_MAX:
            self.fail(f"{value!r} is neither a layer count (0 to {I32_MAX}, llama.cpp's int32) "
                      f"nor 'all'", param, ctx)
        return n


class _SplitType(click.ParamType):
    name = "A,B,..."

    def convert(self, value, param, ctx):
        from ggmlrun.models.options import split_proportions

        if isinstance(value, tuple):
            return value
        try:
            parts = tuple(float(v) for v in str(value).replace("/", ",").split(","))
        except ValueError:
            self.fail(f"{value!r}: give one non-negative number per device, e.g. 3,1", param, ctx)
        try:
            return split_proportions(parts)
        except ValueError as err:
            self.fail(f"{value!r}: {err}", param, ctx)


class _OverrideType(click.ParamType):
    name = "REGEX=BACKEND"

    def convert(self, value, param, ctx):
        from ggmlrun.models.options import compile_override

        if isinstance(value, tuple):
            return value
        pattern, eq, backend = str(value).rpartition("=")
        if not eq or not pattern or not backend:
            self.fail(f"{value!r}: write REGEX=BACKEND, e.g. 'ffn_.*=CPU'", param, ctx)
        try:
            compile_override(pattern)
        except ValueError as err:
            self.fail(f"the pattern '{pattern}' (in {value!r}) is not a regular expression RE2 "
                      f"takes: {err}", param, ctx)
        return (pattern, backend)


_U32 = click.IntRange(min=1, max=2**32 - 1)     # llama.cpp's uint32_t n_ctx, n_ubatch

MODEL_OPTIONS = {
    "ctx_size": click.option("--ctx", "ctx_size", type=_U32, default=None,
                             help="[models] Context length (llama.cpp -c); default the model's, "
                                  "at most 4096."),
    "ubatch": click.option("--ubatch", type=_U32, default=None,
                           help="[models] Tokens the graph is reserved for (-ub); default 512, "
                                "at most --ctx."),
    "flash_attn": click.option("--flash-attn", type=click.Choice(["on", "off"]), default=None,
                               help="[models] Flash attention (-fa); default off."),
    "ngl": click.option("--ngl", type=_NglType(), default=None,
                        help="[models] Layers on the devices (-ngl), or 'all' (the default); "
                             "the output layer counts as one."),
    "no_kv_offload": click.option("--no-kv-offload", is_flag=True, default=False,
                                  help="[models] Keep the KV cache on the CPU (-nkvo)."),
    "kv_type": click.option("--kv-type", type=click.Choice(["f16", "f32", "q8_0"]), default=None,
                            help="[models] KV cache type (-ctk/-ctv); default f16."),
    "tensor_overrides": click.option("--override-tensor", "tensor_overrides",
                                     type=_OverrideType(), multiple=True,
                                     help="[models] Weights matching REGEX go to BACKEND (-ot), "
                                          "repeatable; the first match wins."),
    "tensor_split": click.option("--tensor-split", type=_SplitType(), default=None,
                                 help="[models] Layer proportions over the non-CPU backends in "
                                      "order (-ts); default by device memory."),
}
MODEL_FLAGS = {"ctx_size": "--ctx", "ubatch": "--ubatch", "flash_attn": "--flash-attn",
               "ngl": "--ngl", "no_kv_offload": "--no-kv-offload", "kv_type": "--kv-type",
               "tensor_overrides": "--override-tensor", "tensor_split": "--tensor-split",
               "tokens": "--tokens"}


def model_options(skip=()):
    """Every model option (SPEC section 5), defined once, on any command that takes a model."""
    def apply(func):
        for key, option in reversed(MODEL_OPTIONS.items()):
            if key not in skip:
                func = option(func)
        return func
    return apply


def _model_input(path: Path, backends_file: Path | None, model_kw: dict, ggml: str = "0.25",
                 policy: str = "ggml", overrides=None):
    """(model, backends, options) when GRAPH is a GGUF file or a card; None for a graph file,
    which must then not carry model options. A model is placed as llama.cpp places it, so
    only ggml's policy applies."""
    from ggmlrun.models.load import load_model

    model = load_model(path)
    if model is None:
        given = [flag for key, flag in MODEL_FLAGS.items()
                 if model_kw.get(key) not in (None, (), False)]
        if given:
            raise InputError(f"{given[0]} applies to models (GGUF files and model cards), not "
                             f"to graph files", file=str(path))
        return None
    if policy != "ggml":
        raise InputError(f"--policy {policy} applies to graph files; a model is placed as "
                         f"llama.cpp places it", file=str(path))
    backends = load_backends(backends_file) if backends_file else None
    if overrides is not None:
        if overrides.remap:
            raise InputError("--remap applies to graph files; place a model's weights with "
                             "--ngl or --override-tensor", file=str(path))
        backends = _with_memory(backends, overrides.memory)
        model_kw = {**model_kw, "no_op_offload": not overrides.op_offload}
    return model, *_model_setup(model, backends, {**model_kw, "ggml": ggml})


def _with_memory(backends, memory: dict[str, int]):
    """--memory NAME=SIZE on a model's backends (the default set when no file is given)."""
    from dataclasses import replace

    from ggmlrun.core.backends.spec import default_backends

    backends = backends or default_backends()
    names = [b.name for b in backends]
    for name in memory:
        if name not in names:
            raise InputError(f"--memory {name}=...: no backend '{name}'; backends: {', '.join(names)}")
    return [replace(b, memory=memory[b.name]) if b.name in memory else b for b in backends]


def _model_setup(model, backends, kw: dict):
    from ggmlrun.core.backends.spec import default_backends
    from ggmlrun.models.options import ModelOptions

    backends = backends or default_backends()
    names = [b.name for b in backends]
    devices = [b for b in backends if b.kind != "cpu"]
    for pattern, backend in kw.get("tensor_overrides") or ():
        if backend not in names:
            raise InputError(f"--override-tensor {pattern}={backend}: no backend '{backend}'; "
                             f"backends: {', '.join(names)}")
    split = kw.get("tensor_split")
    if split is not None and len(split) != len(devices):
        raise InputError(f"--tensor-split has {len(split)} proportions, one per device, but "
                         f"there are {len(devices)} devices ({', '.join(d.name for d in devices) or 'none'})")
    opts = ModelOptions(ctx=kw.get("ctx_size"), ubatch=kw.get("ubatch") or 512,
                        flash_attn=kw.get("flash_attn") == "on", ngl=kw.get("ngl"),
                        no_kv_offload=bool(kw.get("no_kv_offload")),
                        kv_type=kw.get("kv_type") or "f16",
                        overrides=tuple(kw.get("tensor_overrides") or ()), tensor_split=split,
                        op_offload=not kw.get("no_op_offload"),
                        ggml=kw.get("ggml") or "0.25")
    return backends, opts


# --- models: GGUF files and model cards (SPEC section 5) -----------------------------------------
def _validate_model(model, backends, opts, as_json):
    summary = report.model_summary(model)
    if as_json:
        emit_json({"model": model.name, "valid": True, **summary})
    else:
        click.echo(f"{model.path}: ok ({summary['architecture']}, {summary['n_layer']} layers, "
                   f"{summary['tensors']} tensors, {summary['weights_bytes']:,} bytes of weights)")


def _model_schedule(model, backends, opts):
    from ggmlrun.models.reserve import measure_model

    return measure_model(model, backends, opts).schedule


def _measure_model(model, backends, opts, as_json):
    from ggmlrun.models.reserve import measure_model

    figures = measure_model(model, backends, opts)
    _, memory = engine.plan_memory(figures.schedule, "ggml")
    fit = model_fit(figures)
    if as_json:
        emit_json({**report.model_measure_dict(model, figures, memory), **report.fits_dict(fit)})
    else:
        report.print_tables(stdout(), report.model_measure_table(model, figures))
    # as plan does: the figures first, then exit 1 naming what does not fit (README)
    engine.check_capacity(figures.schedule, memory, fit=fit)


def model_fit(figures):
    """Does it fit, on llama.cpp's own figures: each backend's model + KV + compute buffers
    against its `memory`, and all of them against the machine's RAM, as plan checks a graph
    (core/memory/fits.py; the KV cache counts with the weights, as plan counts its tensors)."""
    from ggmlrun.core.memory.fits import BackendFit, Fit, machine_memory

    return Fit([BackendFit(b.name, b.kind, b.weights_bytes + b.kv_bytes, b.arena_bytes,
                           b.memory_bytes) for b in figures.backends], machine_memory())


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


def _run_model(model, backends, opts, tokens, as_json, out_file):
    from ggmlrun.core.run import results

    ids = _parse_tokens(tokens, model.hparams.n_vocab)
    if out_file is not None:
        from ggmlrun.core.util.outputs import check_output

        check_output(out_file, "--out", inputs=[model.path], suffixes=(".npz",))
    if any(t.offset is None for t in model.tensors.values()):
        raise InputError("a model card has no weights to run; run a GGUF file",
                         file=str(model.path))
    ctx = opts.ctx if opts.ctx is not None else min(model.hparams.n_ctx_train, 4096)
    if len(ids) > ctx:
        raise InputError(f"--tokens: {len(ids)} tokens do not fit the context of {ctx} (--ctx)")
    from ggmlrun.models.run import run_model

    logits, result = run_model(model, backends, opts, ids)
    outputs = {"result_output": logits}
    summaries = {name: results.summarize(arr) for name, arr in outputs.items()}
    if out_file:
        results.write_npz(out_file, outputs)
        click.echo(f"wrote {out_file}", err=True)
    if as_json:
        emit_json(report.model_run_dict(result, summaries))
    else:
        report.print_tables(stdout(), report.timing_table(result),
                            report.outputs_table(summaries, None))
