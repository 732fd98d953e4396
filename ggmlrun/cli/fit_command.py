"""`ggmlrun fit`: the most layers, and the longest context, that fit the devices."""

from __future__ import annotations

from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.core.util.errors import InputError
from ggmlrun.cli.llama_tail import TailCommand
from ggmlrun.cli.common import (MODEL_ARG, BACKENDS, JSON, DEBUG, GGML, cli, emit_json,
                                placement_options, stdout)
from ggmlrun.cli.model_options import (draft_of, host_growth, llama_model_words, model_options,
                                       _model_input, planned_for_dict, print_model_figures)
from ggmlrun.models.arch import ARCHITECTURES, LLAMA_CPP
from ggmlrun.models.options.params import U32_MAX


def fit_context(value) -> int | str | None:
    """fit's --ctx: 'auto', or a context length as the option table reads one; ValueError."""
    from ggmlrun.models.options.table import BY_NAME

    if value is None or value == "auto":
        return value
    try:
        return BY_NAME["ctx"].kind.check(value)
    except ValueError:
        raise ValueError(f"{value!r} is neither a context length (1 to {U32_MAX}, llama.cpp's "
                         f"uint32) nor 'auto'") from None


class _CtxType(click.ParamType):
    name = "N|auto"

    def convert(self, value, param, ctx):
        try:
            return fit_context(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


FIT_HELP = ("The most layers (-ngl), and with --ctx auto the longest context, that fit in memory."
            "\n\nMODEL is a GGUF file or a model card of a supported architecture: "
            f"{', '.join(ARCHITECTURES)}; each graph as the llama.cpp of {LLAMA_CPP} builds it."
            "\n\nfit [MODEL] [OPTIONS] -- llama-server ARGS... (or llama-cli): the answer for "
            "that command line as you run it (the model from -m/-hf when MODEL is not given; "
            "-ngl and -c it leaves to llama.cpp's --fit are searched); options ggmlrun does not "
            "model are named on stderr.")


@cli.command(help=FIT_HELP, cls=TailCommand)
@click.argument("model_path", metavar="MODEL", type=MODEL_ARG, required=False)
@BACKENDS
@JSON
@click.option("--ctx", "fit_ctx", type=_CtxType(), default=None,
              help="Context length, or 'auto': the largest (a multiple of 256, up to the "
                   "model's) that fits with the most layers; default the model's, at most 4096.")
@click.option("--min-ctx", "--fit-ctx", "min_ctx", type=click.IntRange(min=1, max=U32_MAX),
              default=4096, show_default=True,
              help="With --ctx auto: the context kept while layers are fitted; also llama.cpp's "
                   "own --fit minimum context in `llamacpp_fit` (llama.cpp -fitc/--fit-ctx).")
@click.option("--fit-target", metavar="MiB[,MiB...]", default=None,
              help="For `llamacpp_fit` (llama.cpp's own --fit predicted): the memory its fit "
                   "keeps free per device, in MiB, one for all or one per device "
                   "(llama.cpp -fitt/--fit-target); default 1024.")
@click.option("--margin", metavar="SIZE", default=None,
              help="Memory left free on every device (default 1GiB) and on the CPU (default 0): "
                   "one SIZE for devices, DEVICES,CPU (e.g. 512MiB,2GiB), or per backend "
                   "NAME=SIZE,... (e.g. GPU0=1GiB,GPU1=512MiB; the others keep the default).")
@GGML
@click.option("--ngl", hidden=True, expose_value=False, callback=lambda ctx, param, value:
              _ngl_refused(value))
@model_options(skip=("ctx_size", "ngl"))
@placement_options
@DEBUG
def fit(model_path, backends_file, as_json, fit_ctx, min_ctx, fit_target, margin, ggml,
        overrides, show_progress, **model_kw):
    """The most layers (-ngl), and with --ctx auto the longest context, that fit in memory."""
    from ggmlrun.cli import llama_tail
    from ggmlrun.core.util.errors import RunError
    from ggmlrun.core.util.inputs import open_regular

    cmd = llama_tail.tail_command()
    if cmd is not None:
        model_path, model_kw, overrides = llama_tail.apply_command(
            cmd, model_path, model_kw, overrides,
            own={"ctx": "fit_ctx", "ngl": "ngl", "fit_target": ("margin", "fit_target"),
                 "fit_ctx": "min_ctx"}, backends_file=backends_file)
    elif model_path is None:
        raise click.UsageError("Missing argument 'MODEL'.")
    if isinstance(model_path, Path):
        open_regular(model_path, "model", limit=None).close()   # "no such file", a directory
    model = _model_input(model_path, backends_file, model_kw, ggml, overrides=overrides,
                         this_machine=True)
    if model is None:
        raise InputError("fit takes a model: a GGUF file (by its GGUF magic) or a model card (a "
                         "YAML file with `architecture:`); this is neither", file=str(model_path))
    ngl = None
    if cmd is not None:
        llama_tail.check_rpc(cmd, model[1])
        llama_tail.warn_unmodelled(cmd)
        fit_ctx, min_ctx, margin, fit_target, ngl = command_fit(cmd, model, fit_ctx, min_ctx,
                                                                margin, fit_target)
    result, opts, record = fit_answer(model, fit_ctx, min_ctx, margin, fit_target, ngl=ngl)
    if cmd is not None:
        record["unmodelled"] = list(cmd.unmodelled)
    if as_json:
        emit_json(record)
    else:
        print_model_figures(model, report.fit_table(model[0], result), result.backends,
                            opts.no_mmap, report.fit_line(result, llama_model_words(model[0])),
                            draft=result.measure.draft if result.measure else None,
                            without_draft=result.without_draft,
                            growth=record["host_growth"])
        for line in report.llamacpp_fit_lines(record["llamacpp_fit"], result, stdout().width):
            click.echo(line)
    if not result.fits:
        raise RunError(result.advice)


def command_fit(cmd, model_input, fit_ctx, min_ctx: int, margin: str | None,
                fit_target: str | None):
    """How llama.cpp runs a command's --fit, in fit's terms: the context (-c N; -c 0 or none:
    with --fit on, the longest from --fit-ctx up, else the training context), -ngl pinned
    (given, or every layer with --fit off) or searched, and --fit-target both as the margins
    of ggmlrun's answer and as what llama.cpp's own fit keeps free (`llamacpp_fit`; MiB per
    device, one value for every device; llama.cpp's default 1024 MiB)."""
    from ggmlrun.models.options.llama_command import FIT_DEFAULT_CTX, MiB

    model, backends, _ = model_input
    n_max = model.hparams.n_layer_all + 1
    if "ctx" in cmd.fields:
        fit_ctx = cmd.fields["ctx"]
    elif cmd.fit:
        fit_ctx, min_ctx = "auto", cmd.fit_ctx or FIT_DEFAULT_CTX
    else:
        fit_ctx = model.hparams.n_ctx_train
    ngl = None
    if not cmd.fit or not cmd.ngl_auto:
        ngl = cmd.fields.get("ngl")
        ngl = n_max if ngl is None else ngl
    if cmd.fit_target is not None:
        devices = [b.name for b in backends if b.kind != "cpu"]
        if len(cmd.fit_target) == 1:
            margin = f"{cmd.fit_target[0] // MiB}MiB"
        else:
            margin = ",".join(f"{name}={size // MiB}MiB"
                              for name, size in zip(devices, cmd.fit_target))
        fit_target = ",".join(str(size // MiB) for size in cmd.fit_target[:max(1, len(devices))])
    return fit_ctx, min_ctx, margin, fit_target, ngl


def fit_answer(model_input, fit_ctx, min_ctx: int, margin: str | None,
               fit_target: str | None = None, ngl: int | None = None):
    """fit's answer for a model input: the result, the options it fitted with (--ctx N
    replaces the model's), and the record `--json` prints (the Python API returns it too)."""
    from dataclasses import replace

    from ggmlrun.cli.model_options import warn_past_training
    from ggmlrun.models.fit import fit_model
    from ggmlrun.models.fit.llamacpp import llamacpp_fit
    from ggmlrun.models.options.table import options_json

    margin_device, margin_cpu, by_name = parse_margins(margin)
    model_file, backends, opts = model_input
    names = [b.name for b in backends]
    for name in by_name:
        if name not in names:
            raise InputError(f"--margin {name}=...: no backend '{name}'; backends: "
                             f"{', '.join(names)}")
    if isinstance(fit_ctx, int):
        warn_past_training(model_file, fit_ctx)
        opts = replace(opts, ctx=fit_ctx)
    draft = draft_of(model_input)
    result = fit_model(model_file, backends, opts, margin_device, margin_cpu, fit_ctx == "auto",
                       min_ctx=min_ctx, margins=by_name, draft=draft, ngl=ngl)
    note = getattr(result.measure, "mmproj_note", None)
    if note:
        click.echo(f"ggmlrun: note: {note}", err=True)
    extra = {}
    if draft is not None and result.measure is not None and result.measure.draft is not None:
        from ggmlrun.models.draft import main_backend

        # what keeping the draft costs: the same search without it
        alone = fit_model(model_file, backends, opts, margin_device, margin_cpu,
                          fit_ctx == "auto", min_ctx=min_ctx, margins=by_name, ngl=ngl)
        result.without_draft = alone
        if not result.fits and alone.fits:
            result.advice += (f"; without the draft (-md) it fits: -ngl {alone.ngl}, "
                              f"ctx {alone.ctx}")
        extra["draft"] = {**report.draft_dict(draft.name, result.measure.draft,
                                              main_backend(result.measure.draft)),
                          "without": {"ngl": alone.ngl, "ctx": alone.ctx,
                                      "n_cpu_moe": alone.n_cpu_moe, "fits": alone.fits}}
    llama = llamacpp_fit(model_file, backends, opts, ctx_auto=not isinstance(fit_ctx, int),
                         margins=fit_targets(fit_target, backends), fit_ctx=min_ctx,
                         user_ngl=ngl)
    cpu = next((b for b in result.backends if b.kind == "cpu"), None)
    growth = host_growth(model_input, opts, result.ctx, cpu.free_bytes if cpu else 0)
    record = {**report.model_fit_dict(model_file, result), **extra, "host_growth": growth,
              "options": options_json(opts, result.measure.flash_attn if result.measure else None),
              "llamacpp_fit": llama.as_dict(),
              **planned_for_dict(model_input)}
    return result, opts, record


def fit_targets(text: str | None, backends) -> list[int] | None:
    """--fit-target MiB0,MiB1,...: bytes per device, as common/arg.cpp reads it (one value
    for every device; a device past the list keeps the default 1024)."""
    from ggmlrun.models.options.table import BY_NAME

    if text is None:
        return None
    n = max(1, sum(1 for b in backends if b.kind != "cpu"))
    try:
        values = [v * 2**20 for v in BY_NAME["fit_target"].kind.read(text)]
    except ValueError as err:
        raise InputError(f"--fit-target {err}") from None
    if len(values) > n:
        raise InputError(f"--fit-target {text!r}: one value, or one per device ({n})")
    if len(values) == 1:
        return values * n
    return values + [2**30] * (n - len(values))


def _ngl_refused(value) -> None:
    """`fit --ngl N`: fit chooses -ngl itself; say so rather than suggest --ggml."""
    if value is not None:
        raise InputError(f"fit chooses -ngl itself (the most layers that fit), so it takes no "
                         f"--ngl; for the figures at -ngl {value}: ggmlrun measure MODEL --ngl "
                         f"{value}")


def parse_margins(text: str | None) -> tuple[int, int, dict[str, int]]:
    """Device and CPU margins, and per-backend ones (NAME=SIZE); unlike a memory size, a
    margin may be 0."""
    from ggmlrun.core.frontend.sizes import SIZE_RE, SIZE_UNITS, parse_size
    from ggmlrun.core.backends.spec import GiB

    def size(part: str) -> int:
        try:
            match = SIZE_RE.match(part)
            unit = match.group(2).lower() if match else ""
            zero = match and float(match.group(1)) == 0 and (not unit or unit in SIZE_UNITS)
            return 0 if zero else parse_size(part.strip())
        except ValueError as err:
            raise InputError(f"--margin: {err}") from None

    if text is None:
        return GiB, 0, {}
    parts = text.split(",")
    named = ["=" in part for part in parts]
    if any(named):
        if not all(named):
            raise InputError(f"--margin {text!r}: give every margin as NAME=SIZE "
                             f"(GPU0=1GiB,GPU1=512MiB), or none")
        by_name: dict[str, int] = {}
        for part in parts:
            name, _, value = part.partition("=")
            name = name.strip()
            if not name or name in by_name:
                raise InputError(f"--margin {text!r}: each backend once, as NAME=SIZE")
            by_name[name] = size(value)
        return GiB, 0, by_name
    if len(parts) > 2:
        raise InputError(f"--margin {text!r}: one SIZE, DEVICES,CPU, or NAME=SIZE,...")
    sizes = [size(part) for part in parts]
    return sizes[0], sizes[1] if len(sizes) > 1 else 0, {}
