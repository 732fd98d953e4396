"""Models on the command line (SPEC section 5): the model options, defined once, turned into
ModelOptions; and what validate/plan/measure/run do when GRAPH is a GGUF file or a card."""

from __future__ import annotations

from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.core.util.errors import InputError
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
    "swa_full": click.option("--swa-full", is_flag=True, default=False,
                             help="[models] Sliding-window layers get a full-size KV cache "
                                  "(--swa-full); default a window's worth plus one ubatch."),
    "kv_type": click.option("--kv-type", type=click.Choice(["f16", "f32", "q8_0"]), default=None,
                            help="[models] KV cache type (-ctk/-ctv); default f16."),
    "tensor_overrides": click.option("--override-tensor", "tensor_overrides",
                                     type=_OverrideType(), multiple=True,
                                     help="[models] Weights matching REGEX go to BACKEND (-ot), "
                                          "repeatable; the first match wins."),
    "cpu_moe": click.option("--cpu-moe", is_flag=True, default=False,
                            help="[models] Keep every expert tensor of a mixture of experts on "
                                 "the CPU (--cpu-moe)."),
    "n_cpu_moe": click.option("--n-cpu-moe", "n_cpu_moe", type=click.IntRange(min=0, max=2**31 - 1),
                              default=None, metavar="N",
                              help="[models] Keep the expert tensors of the first N layers on "
                                   "the CPU (--n-cpu-moe); default 0 (fit: the fewest it "
                                   "tries)."),
    "tensor_split": click.option("--tensor-split", type=_SplitType(), default=None,
                                 help="[models] Layer proportions over the non-CPU backends in "
                                      "order (-ts); default by device memory."),
    "no_mmap": click.option("--no-mmap", is_flag=True, default=False,
                            help="[models] CPU weights allocated, not memory-mapped (llama.cpp "
                                 "--no-mmap)."),
    "parallel": click.option("--parallel", type=click.IntRange(min=1, max=256), default=None,
                             help="[models] Sequences the context serves (-np, n_seq_max): an "
                                  "output buffer each; with --kv-unified one shared cache; "
                                  "default 1."),
    "kv_unified": click.option("--kv-unified", is_flag=True, default=False,
                               help="[models] One KV cache for all --parallel sequences (-kvu)."),
    "sched_copies": click.option("--sched-copies", type=click.IntRange(min=1, max=64),
                                 default=None,
                                 help="[models] ggml's GGML_SCHED_MAX_COPIES: the copies of "
                                      "every input the scheduler keeps when llama.cpp turns "
                                      "on pipeline parallelism (every layer over 2+ devices); "
                                      "default 4, 1 turns it off."),
    "gpu_sizes": click.option("--gpu", "gpu_sizes", metavar="SIZE[,SIZE...]", default=None,
                              help="[models] The devices, one per size (e.g. 24GiB,12GiB), named "
                                   "GPU0, GPU1, ... with the sim kind's defaults; instead of "
                                   "--backends. Default: SIM0 of 16GiB."),
    "ram_size": click.option("--ram", "ram_size", metavar="SIZE", default=None,
                             help="[models] The host's memory (the CPU backend's), e.g. 32GiB; "
                                  "default the backends file's, else this machine's RAM."),
}
MODEL_FLAGS = {"ctx_size": "--ctx", "ubatch": "--ubatch", "flash_attn": "--flash-attn",
               "ngl": "--ngl", "no_kv_offload": "--no-kv-offload", "kv_type": "--kv-type",
               "swa_full": "--swa-full",
               "tensor_overrides": "--override-tensor", "tensor_split": "--tensor-split",
               "cpu_moe": "--cpu-moe", "n_cpu_moe": "--n-cpu-moe",
               "sched_copies": "--sched-copies", "no_mmap": "--no-mmap",
               "parallel": "--parallel", "kv_unified": "--kv-unified",
               "gpu_sizes": "--gpu", "ram_size": "--ram", "tokens": "--tokens"}


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
    backends, sources = _model_backends(backends_file, model_kw, overrides)
    if overrides is not None:
        if overrides.remap:
            raise InputError("--remap applies to graph files; place a model's weights with "
                             "--ngl or --override-tensor", file=str(path))
        if overrides.offload_min_batch is not None:
            raise InputError("--offload-min-batch applies to graph files; llama.cpp's devices "
                             "offload an op from a batch of 32 (--no-op-offload turns it off)",
                             file=str(path))
        model_kw = {**model_kw, "no_op_offload": not overrides.op_offload}
    return ModelInput((model, *_model_setup(model, backends, {**model_kw, "ggml": ggml})),
                      sources)


class ModelInput(tuple):
    """(model, backends, options), and where each backend's memory size came from."""

    def __new__(cls, items, sources: dict[str, str]):
        self = super().__new__(cls, items)
        self.sources = sources
        return self


def _model_backends(backends_file, model_kw: dict, overrides):
    """The backends a model is planned for, and where each memory size came from: `--gpu`
    (devices GPU0.. of the sim kind), `--backends FILE`, or the default set; then `--memory
    NAME=SIZE` and `--ram` (the CPU's). Sources: the flag, 'file NAME', 'default', 'this
    machine's RAM'."""
    from dataclasses import replace

    from ggmlrun.cli.common import memory_size
    from ggmlrun.core.backends.spec import default_backends, default_cpu, default_sim

    gpu, ram = model_kw.get("gpu_sizes"), model_kw.get("ram_size")
    if gpu is not None and backends_file:
        raise InputError("--gpu describes the devices and --backends lists them: give one of "
                         "the two (or --memory NAME=SIZE to resize a device of the file)")
    if backends_file:
        from ggmlrun.core.frontend.backends_file import load_backends

        backends = load_backends(backends_file)
        given = _file_memory_keys(backends_file)
        sources = {b.name: (f"file {Path(backends_file).name}" if b.name in given
                            else "this machine's RAM" if b.kind == "cpu" else "kind default")
                   for b in backends}
    elif gpu is not None:
        parts = [p for p in str(gpu).split(",")]
        if not all(p.strip() for p in parts):
            raise InputError(f"--gpu {gpu!r}: one SIZE per device, separated by commas, e.g. "
                             f"--gpu 24GiB,12GiB")
        backends = [replace(default_sim(f"GPU{i}"), memory=memory_size(p, "--gpu"))
                    for i, p in enumerate(parts)] + [default_cpu()]
        sources = {b.name: "--gpu" for b in backends[:-1]}
        sources[backends[-1].name] = "this machine's RAM"
    else:
        backends = default_backends()
        sources = {backends[0].name: "default", backends[-1].name: "this machine's RAM"}
    memory = dict(overrides.memory) if overrides is not None else {}
    cpu = backends[-1].name
    if ram is not None:
        if cpu in memory:
            raise InputError(f"--ram and --memory {cpu}=... both set the host's memory: give one")
        memory[cpu] = memory_size(ram, "--ram")
    backends = _with_memory(backends, memory)
    if overrides is not None and overrides.threads is not None:
        backends = backends[:-1] + [replace(backends[-1], threads=overrides.threads)]
    for name in memory:
        sources[name] = "--ram" if name == cpu and ram is not None else "--memory"
    return backends, sources


def _file_memory_keys(backends_file) -> set[str]:
    """The backends a backends file gives a `memory:` (the others take their kind's default)."""
    from ggmlrun.core.frontend.yamlfile import read_yaml

    data, _ = read_yaml(backends_file)
    items = data.get("backends") if isinstance(data, dict) else None
    return {str(item.get("name")) for item in items or () if isinstance(item, dict)
            and "memory" in item}


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
    warn_past_training(model, kw.get("ctx_size"))
    opts = ModelOptions(ctx=kw.get("ctx_size"), ubatch=kw.get("ubatch") or 512,
                        flash_attn=kw.get("flash_attn") == "on", ngl=kw.get("ngl"),
                        no_kv_offload=bool(kw.get("no_kv_offload")),
                        kv_type=kw.get("kv_type") or "f16",
                        overrides=tuple(kw.get("tensor_overrides") or ()), tensor_split=split,
                        op_offload=not kw.get("no_op_offload"),
                        ggml=kw.get("ggml") or "0.25",
                        sched_copies=kw.get("sched_copies") or 4,
                        no_mmap=bool(kw.get("no_mmap")),
                        parallel=kw.get("parallel") or 1,
                        kv_unified=bool(kw.get("kv_unified")),
                        swa_full=bool(kw.get("swa_full")),
                        cpu_moe=bool(kw.get("cpu_moe")), n_cpu_moe=kw.get("n_cpu_moe") or 0)
    return backends, opts


def warn_past_training(model, ctx: int | None) -> None:
    """A context past the model's training length: llama.cpp warns and goes on (it allocates
    the whole cache; positions past n_ctx_train were never trained), and so does ggmlrun."""
    n_train = model.hparams.n_ctx_train
    if ctx is not None and ctx > n_train:
        click.echo(f"ggmlrun: warning: --ctx {ctx} is past the model's training context "
                   f"({n_train} tokens); llama.cpp warns 'n_ctx_per_seq ({ctx}) > n_ctx_train "
                   f"({n_train}) -- possible training context overflow' and goes on, allocating "
                   f"the whole cache (the figures here are for it), but past {n_train} tokens "
                   f"the model's output degrades unless its RoPE is scaled", err=True)


# --- models: GGUF files and model cards (SPEC section 5) -----------------------------------------
def _validate_model(model, backends, opts, as_json):
    summary = report.model_summary(model)
    if as_json:
        emit_json({"model": model.name, "valid": True, **summary})
    else:
        import shutil

        items = [f"({summary['architecture']},", f"{summary['n_layer']} layers,",
                 f"{summary['tensors']} tensors,", f"{summary['weights_bytes']:,} bytes of weights)"]
        width = shutil.get_terminal_size((160, 24)).columns
        for line in report.pack_line(f"{report.plain(model.path)}: ok", items, width):
            click.echo(line)


def _model_schedule(model, backends, opts):
    from ggmlrun.models.reserve import measure_model

    return measure_model(model, backends, opts).schedule


def _measure_model(model_input, as_json):
    from ggmlrun.models.reserve import measure_model

    model, backends, opts = model_input

    figures = measure_model(model, backends, opts)
    from ggmlrun.core import engine

    _, memory = engine.plan_memory(figures.schedule, "ggml")
    fit = model_fit(figures)
    from ggmlrun.models.command_line import llama_cpp_line

    command = llama_cpp_line(opts, backends, ngl=figures.ngl, ctx=figures.ctx)
    if as_json:
        emit_json({**report.model_measure_dict(model, figures, memory), **report.fits_dict(fit),
                   "command": command, **planned_for_dict(model_input)})
    else:
        print_planned_for(model_input)
        from ggmlrun import visual

        report.print_tables(stdout(), report.model_measure_table(model, figures))
        visual.print_memory_bars(stdout(), report.memory_bars(figures.backends))
        for line in report.host_lines(figures.backends, opts.no_mmap, stdout().width):
            click.echo(line)
        click.echo(f"llama.cpp: {command}")
    # as plan does: the figures first, then exit 1 naming what does not fit (README)
    engine.check_capacity(figures.schedule, memory, fit=fit)


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

    rows = [BackendFit(b.name, b.kind, b.weights_bytes + b.kv_bytes + b.state_bytes + b.output_bytes,
                       b.arena_bytes,
                       b.memory_bytes) for b in figures.backends]
    return ModelFit(rows, rows[-1].memory_bytes)


def print_planned_for(model_input) -> None:
    """The header of a model command: the devices and host it planned for, and where each
    size came from."""
    _, backends, _ = model_input
    for line in report.planned_for_lines(backends, model_input.sources, stdout().width):
        stdout().print(line, markup=False, highlight=False, soft_wrap=True)


def planned_for_dict(model_input) -> dict:
    _, backends, _ = model_input
    return {"planned_for": report.planned_for_dict(backends, model_input.sources)}


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


def top_tokens(model, logits, count: int = 5) -> list[dict]:
    """The `count` largest logits: id, logit and the token's text from the file's vocabulary
    (read for those ids only, models/vocab.py)."""
    import numpy as np

    from ggmlrun.models.vocab import token_texts

    count = min(count, len(logits))
    ids = np.argsort(-logits, kind="stable")[:count]
    texts = token_texts(model.path, ids.tolist()) if model.path else {}
    return [{"id": int(i), "logit": float(logits[i]), "text": texts.get(int(i))} for i in ids]


def ran_with(model, opts, sched, n_tokens: int) -> dict:
    """The context, -ngl and splits a run used (JSON keys; the text report reads them)."""
    from ggmlrun.models.options import context_size, gpu_layers

    hp = model.hparams
    splits = [{"backend": sched.backends[s.backend].name, "nodes": len(s.nodes)}
              for s in sched.splits]
    return {"tokens": n_tokens, "ctx": context_size(opts, hp.n_ctx_train),
            "ngl": min(gpu_layers(opts, hp.n_layer_all), hp.n_layer_all + 1),
            "n_layer": hp.n_layer_all,
            "n_splits": len(sched.splits), "splits": splits}
