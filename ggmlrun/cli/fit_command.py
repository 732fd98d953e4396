"""`ggmlrun fit`: the most layers, and the longest context, that fit the devices."""

from __future__ import annotations

from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.core.util.errors import InputError
from ggmlrun.cli.common import MODEL_ARG, BACKENDS, JSON, DEBUG, GGML, emit_json, placement_options, cli
from ggmlrun.cli.model_options import (model_options, _model_input, planned_for_dict,
                                       print_model_figures)
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
            f"{', '.join(ARCHITECTURES)}; each graph as the llama.cpp of {LLAMA_CPP} builds it.")


@cli.command(help=FIT_HELP)
@click.argument("model_path", metavar="MODEL", type=MODEL_ARG)
@BACKENDS
@JSON
@click.option("--ctx", "fit_ctx", type=_CtxType(), default=None,
              help="Context length, or 'auto': the largest (a multiple of 256, up to the "
                   "model's) that fits with the most layers; default the model's, at most 4096.")
@click.option("--min-ctx", type=click.IntRange(min=1, max=U32_MAX), default=4096,
              show_default=True,
              help="With --ctx auto: the context kept while layers are fitted (llama.cpp -fitc).")
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
def fit(model_path, backends_file, as_json, fit_ctx, min_ctx, margin, ggml, overrides,
        show_progress, **model_kw):
    """The most layers (-ngl), and with --ctx auto the longest context, that fit in memory."""
    from ggmlrun.core.util.errors import RunError
    from ggmlrun.core.util.inputs import open_regular

    if isinstance(model_path, Path):
        open_regular(model_path, "model", limit=None).close()   # "no such file", a directory
    model = _model_input(model_path, backends_file, model_kw, ggml, overrides=overrides,
                         this_machine=True)
    if model is None:
        raise InputError("fit takes a model: a GGUF file (by its GGUF magic) or a model card (a "
                         "YAML file with `architecture:`); this is neither", file=str(model_path))
    result, opts, record = fit_answer(model, fit_ctx, min_ctx, margin)
    if as_json:
        emit_json(record)
    else:
        print_model_figures(model, report.fit_table(model[0], result), result.backends,
                            opts.no_mmap, report.fit_line(result))
    if not result.fits:
        raise RunError(result.advice)


def fit_answer(model_input, fit_ctx, min_ctx: int, margin: str | None):
    """fit's answer for a model input: the result, the options it fitted with (--ctx N
    replaces the model's), and the record `--json` prints (the Python API returns it too)."""
    from dataclasses import replace

    from ggmlrun.cli.model_options import warn_past_training
    from ggmlrun.models.fit import fit_model
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
    result = fit_model(model_file, backends, opts, margin_device, margin_cpu, fit_ctx == "auto",
                       min_ctx=min_ctx, margins=by_name)
    note = getattr(result.measure, "mmproj_note", None)
    if note:
        click.echo(f"ggmlrun: note: {note}", err=True)
    record = {**report.model_fit_dict(model_file, result), "options": options_json(opts),
              **planned_for_dict(model_input)}
    return result, opts, record


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
