"""Models on the command line (SPEC section 5): the model options, defined once, turned into
ModelOptions and the backends a model is planned for (model_backends). What validate, measure
and run then do with a model is model_commands'."""

from __future__ import annotations

from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.core.util.errors import InputError
from ggmlrun.cli.common import stdout
from ggmlrun.cli.model_backends import planned_backends


# --- model options (GGUF files and model cards; SPEC section 5) --------------------------------
class _NglType(click.ParamType):
    name = "N|all"

    def convert(self, value, param, ctx):
        from ggmlrun.models.options.params import I32_MAX

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
        from ggmlrun.models.options.params import split_proportions

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
        from ggmlrun.models.options.params import compile_override

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
    "refresh": click.option("--refresh", is_flag=True, default=False,
                            help="[models] A remote model's headers (URL, hf://) fetched again, "
                                 "not taken from the header cache."),
}
MODEL_FLAGS = {"ctx_size": "--ctx", "ubatch": "--ubatch", "flash_attn": "--flash-attn",
               "ngl": "--ngl", "no_kv_offload": "--no-kv-offload", "kv_type": "--kv-type",
               "swa_full": "--swa-full",
               "tensor_overrides": "--override-tensor", "tensor_split": "--tensor-split",
               "cpu_moe": "--cpu-moe", "n_cpu_moe": "--n-cpu-moe",
               "sched_copies": "--sched-copies", "no_mmap": "--no-mmap",
               "parallel": "--parallel", "kv_unified": "--kv-unified",
               "gpu_sizes": "--gpu", "ram_size": "--ram", "tokens": "--tokens",
               "refresh": "--refresh", "download": "--download"}


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
    from ggmlrun.cli.fetching import load_named_model

    model = load_named_model(path, model_kw)
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
    backends, sources = planned_backends(backends_file, model_kw, overrides)
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

def _model_setup(model, backends, kw: dict):
    from ggmlrun.core.backends.spec import default_backends
    from ggmlrun.models.options.params import ModelOptions

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


def print_planned_for(model_input) -> None:
    """The header of a model command: the devices and host it planned for, and where each
    size came from."""
    _, backends, _ = model_input
    for line in report.planned_for_lines(backends, model_input.sources, stdout().width):
        stdout().print(line, markup=False, highlight=False, soft_wrap=True)


def planned_for_dict(model_input) -> dict:
    _, backends, _ = model_input
    return {"planned_for": report.planned_for_dict(backends, model_input.sources)}


def print_model_figures(model_input, table, backends, no_mmap: bool, last_line: str) -> None:
    """The text report of measure MODEL and fit: where the sizes came from, the figures'
    table, each backend's memory bar, the host's lines, and the command's own last line."""
    from ggmlrun import visual

    print_planned_for(model_input)
    report.print_tables(stdout(), table)
    visual.print_memory_bars(stdout(), report.memory_bars(backends))
    for line in report.host_lines(backends, no_mmap, stdout().width):
        click.echo(line)
    click.echo(last_line)
