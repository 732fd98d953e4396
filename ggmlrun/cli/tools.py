"""ops, pack and gen: the op table, the offset planner alone, the graph generators."""

from __future__ import annotations

from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.core.util.errors import InputError
from ggmlrun.cli.common import MODEL_ARG, stdout, stderr, BACKENDS, JSON, DEBUG, emit_json, cli
from ggmlrun.cli.model_options import MODEL_OPTIONS


@cli.command()
@BACKENDS
@JSON
@DEBUG
def ops(backends_file, as_json):
    """The op table, and which backends support each op."""
    from ggmlrun.core.backends.spec import default_backends
    from ggmlrun.core.frontend.backends_file import load_backends

    backends = load_backends(backends_file) if backends_file else default_backends()
    if as_json:
        emit_json(report.ops_dict(backends))
    else:
        report.print_tables(stdout(), report.ops_table(backends))


@cli.command()
@click.argument("csv_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--capacity", metavar="BYTES", help="Fail (exit 1) when the peak exceeds this "
              "(an integer or 1MiB-style size); the search stops at the first fit. Default: "
              "no limit.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the rows back with an `offset` column (atomically); default: "
                   "none, the table only.")
@click.option("--time-limit", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds for the search after the greedy passes (0: greedy only).")
@JSON
@DEBUG
def pack(csv_file, capacity, out_file, time_limit, as_json):
    """The offset planner alone, on MiniMalloc's CSV format (id,lower,upper,size)."""
    from ggmlrun.core.util.errors import RunError
    from ggmlrun.core.frontend.backends_file import parse_size
    from ggmlrun.core.memory.pack import FALLBACK_PREFIX, plan_offsets, verify
    from ggmlrun.core.memory.pack_csv import read_csv, write_csv
    from ggmlrun.core.util.notes import note
    from ggmlrun.core.util.outputs import check_output

    if out_file is not None:
        check_output(out_file, "--out", inputs=[csv_file])
    if capacity is not None:
        try:
            capacity = parse_size(capacity)
        except ValueError as err:
            raise InputError(f"--capacity: {err}") from None
    buffers = read_csv(csv_file)
    result = plan_offsets(buffers, capacity=capacity, time_limit=time_limit)
    for text in result.notes:
        if text.startswith(FALLBACK_PREFIX):
            note(text)
    problems = verify(buffers, result.offsets)
    if problems:
        raise RunError(f"internal error: the planner produced overlapping offsets: {problems[0]}")
    if out_file:
        write_csv(out_file, buffers, result.offsets)
        click.echo(f"wrote {out_file}", err=True)
    fits = capacity is None or result.peak <= capacity
    if as_json:
        emit_json({"peak_bytes": result.peak, "lower_bound_bytes": result.lower_bound,
                   "offsets": result.offsets, "buffers": len(buffers), "method": result.method,
                   "greedy_peak_bytes": result.greedy_peak, "seconds": result.seconds,
                   "optimal": result.optimal, "capacity_bytes": capacity, "fits": fits})
    else:
        report.print_tables(stdout(), report.pack_table(str(csv_file), len(buffers), result, capacity))
    if not fits:
        raise RunError(f"peak {result.peak} bytes exceeds --capacity {capacity} bytes "
                       f"(lower bound {result.lower_bound}); raise the capacity or the --time-limit")


@cli.group()
def gen():
    """Write a generated graph file (llama-style or MLP) with real model shapes."""


def _check_out(out: Path | None) -> None:
    from ggmlrun.core.util.outputs import check_output

    if out is not None:
        check_output(out, "--out")


def _write_text(text: str, out: Path | None) -> None:
    from ggmlrun.core.run.results import write_text

    if out is None:
        click.echo(text, nl=False)
    else:
        write_text(out, text)
        stderr().print(report.plain(f"wrote {out}"), markup=False, highlight=False)


@gen.command("llama")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Transformer blocks; their weights are named l<N>.* (measure --fit).")
@click.option("--dim", type=click.IntRange(min=2), default=256, show_default=True,
              help="Embedding width (n_embd): a multiple of --heads, with an even head size.")
@click.option("--heads", type=click.IntRange(min=1), default=8, show_default=True,
              help="Attention heads.")
@click.option("--ffn", type=click.IntRange(min=1), default=688, show_default=True,
              help="Hidden width of the swiglu feed-forward block (n_ff).")
@click.option("--batch", type=click.IntRange(min=1), default=32, show_default=True,
              help="Tokens per compute (rows of every activation).")
@click.option("--context", type=click.IntRange(min=0), default=0, show_default=True,
              help="KV-cache length: > batch keeps a cache per layer, written through cpy; "
                   "0 attends over the batch alone.")
@click.option("--dtype", type=click.Choice(["f32", "f16"]), default="f32", show_default=True,
              help="Type of every weight matrix (norms stay f32).")
@click.option("--offload", type=click.IntRange(min=0), default=0, show_default=True,
              help="How many of the last layers keep their weights on the device.")
@click.option("--device", default="SIM0", show_default=True,
              help="The backend the offloaded layers' weights are pinned to.")
@click.option("--name", default="llama", show_default=True, help="The graph's name.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the graph file here (atomically); default: stdout.")
@DEBUG
def gen_llama(layers, dim, heads, ffn, batch, context, dtype, offload, device, name, out):
    """A llama-style stack: rms_norm, q/k/v, rope, causal attention, swiglu FFN."""
    from ggmlrun.core.frontend.gen import LlamaShape, llama

    _check_out(out)
    shape = LlamaShape(layers=layers, dim=dim, heads=heads, ffn=ffn, batch=batch, context=context,
                       dtype=dtype, offload=offload, device=device)
    _write_text(llama(shape, name=name), out)


@gen.command("mlp")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True,
              help="MLP blocks (each: matmul, gelu, matmul, residual add).")
@click.option("--dim", type=click.IntRange(min=1), default=512, show_default=True,
              help="Width of the input and of each block's output.")
@click.option("--hidden", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Width inside each block.")
@click.option("--batch", type=click.IntRange(min=1), default=32, show_default=True,
              help="Rows of the input (tokens per compute).")
@click.option("--dtype", type=click.Choice(["f32", "f16"]), default="f32", show_default=True,
              help="Type of every weight matrix.")
@click.option("--offload", type=click.IntRange(min=0), default=0, show_default=True,
              help="How many of the last blocks keep their weights on the device.")
@click.option("--device", default="SIM0", show_default=True,
              help="The backend the offloaded blocks' weights are pinned to.")
@click.option("--name", default="mlp", show_default=True, help="The graph's name.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the graph file here (atomically); default: stdout.")
@DEBUG
def gen_mlp(layers, dim, hidden, batch, dtype, offload, device, name, out):
    """A stack of gelu MLP blocks with residuals."""
    from ggmlrun.core.frontend.gen import mlp

    _check_out(out)
    _write_text(mlp(layers, dim, hidden, batch, dtype, offload, device, name), out)


@cli.command("card")
@click.argument("model_path", metavar="MODEL", type=MODEL_ARG)
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the card here (FILE.yaml, atomically); default: stdout.")
@MODEL_OPTIONS["refresh"]
@DEBUG
def card(model_path, out, refresh):
    """A model card (YAML, as ggmlrun/models/cards/) from a GGUF header, local or remote:
    `fit` on the card gives what `fit` on the file gives, without the weights."""
    from ggmlrun.cli.fetching import load_named_model
    from ggmlrun.core.util.outputs import check_output
    from ggmlrun.models.cards.writer import card_text

    if out is not None:
        check_output(out, "-o", inputs=[model_path] if isinstance(model_path, Path) else [],
                     suffixes=(".yaml",))
    model = load_named_model(model_path, {"refresh": refresh})
    if model is None:
        raise InputError("card takes a GGUF model (a file, a split set, a URL or an hf:// "
                         "name); this is not one", file=str(model_path))
    _write_text(card_text(model), out)
