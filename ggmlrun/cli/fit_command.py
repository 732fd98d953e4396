"""`ggmlrun fit`: the most layers, and the longest context, that fit the devices."""

from __future__ import annotations

from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.core.util.errors import InputError
from ggmlrun.cli.common import stdout, BACKENDS, JSON, DEBUG, GGML, emit_json, placement_options, cli
from ggmlrun.cli.model_options import model_options, _model_input
from ggmlrun.models.options import U32_MAX


class _CtxType(click.ParamType):
    name = "N|auto"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int) or value == "auto":
            return value
        try:
            n = int(value)
        except ValueError:
            n = 0
        if not 1 <= n <= U32_MAX:
            self.fail(f"{value!r} is neither a context length (1 to {U32_MAX}, llama.cpp's "
                      f"uint32) nor 'auto'", param, ctx)
        return n


@cli.command()
@click.argument("model_path", metavar="MODEL", type=click.Path(dir_okay=False, path_type=Path))
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
                   "one SIZE for devices, or DEVICES,CPU (e.g. 512MiB,2GiB).")
@GGML
@model_options(skip=("ctx_size", "ngl"))
@placement_options
@DEBUG
def fit(model_path, backends_file, as_json, fit_ctx, min_ctx, margin, ggml, overrides,
        show_progress, **model_kw):
    """The most layers (-ngl), and with --ctx auto the longest context, that fit in memory."""
    from ggmlrun.core.util.errors import RunError
    from ggmlrun.models.fit import fit_model

    model = _model_input(model_path, backends_file, model_kw, ggml, overrides=overrides)
    if model is None:
        raise InputError("fit takes a model: a GGUF file or a model card", file=str(model_path))
    margin_device, margin_cpu = _parse_margins(margin)
    model_file, backends, opts = model
    if isinstance(fit_ctx, int):
        from dataclasses import replace

        opts = replace(opts, ctx=fit_ctx)
    result = fit_model(model_file, backends, opts, margin_device, margin_cpu, fit_ctx == "auto",
                       min_ctx=min_ctx)
    if as_json:
        emit_json(report.model_fit_dict(model_file, result))
    else:
        report.print_tables(stdout(), report.fit_table(model_file, result))
        click.echo(report.fit_line(result))
    if not result.fits:
        raise RunError(result.advice)


def _parse_margins(text: str | None) -> tuple[int, int]:
    """Device and CPU margins; unlike a memory size, a margin may be 0."""
    from ggmlrun.core.frontend.backends_file import SIZE_RE, SIZE_UNITS
    from ggmlrun.core.frontend.loader import parse_size
    from ggmlrun.core.backends.spec import GiB

    if text is None:
        return GiB, 0
    parts = text.split(",")
    if len(parts) > 2:
        raise InputError(f"--margin {text!r}: one SIZE, or DEVICES,CPU")
    sizes = []
    for part in parts:
        try:
            match = SIZE_RE.match(part)
            unit = match.group(2).lower() if match else ""
            zero = match and float(match.group(1)) == 0 and (not unit or unit in SIZE_UNITS)
            sizes.append(0 if zero else parse_size(part.strip()))
        except ValueError as err:
            raise InputError(f"--margin: {err}") from None
    return sizes[0], sizes[1] if len(sizes) > 1 else 0
