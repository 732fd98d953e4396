"""Click commands only: parse, call the core, hand results to the report layer.

Data goes to stdout, diagnostics to stderr. Every error leaves through `main()`: one line, exit
2 for bad input, 1 for a failure while running, a traceback only with --debug.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click
from rich.console import Console

from ggmlrun import report
from ggmlrun.core import engine
from ggmlrun.core.util.errors import CheckError, GgmlrunError, InputError
from ggmlrun.core.frontend.loader import load_backends, load_graph

# piped output gets a wide fixed width so tables are not squeezed into 80 columns
stdout = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)
stderr = Console(stderr=True)

GRAPH = click.argument("graph", type=click.Path(dir_okay=False, path_type=Path))
BACKENDS = click.option("--backends", "backends_file", type=click.Path(dir_okay=False, path_type=Path),
                        help="YAML file with a `backends:` list; overrides the graph's own.")
JSON = click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
DEBUG = click.option("--debug", is_flag=True, expose_value=False, is_eager=True,
                     help="Show Python tracebacks on errors.")
POLICY = click.option("--policy", type=click.Choice(["ggml", "cost"]), default="ggml", show_default=True,
                      help="Placement: ggml's passes, or minimum modeled time (copies included).")
MAX_REPEAT = 1_000_000
MAX_MESSAGE = 1200
PLANNER = click.option("--planner", type=click.Choice(["ggml", "best"]), default="best",
                       show_default=True,
                       help="Arena offsets: ggml's online best-fit, or the offline planner "
                            "(never larger).")


def emit_json(data: dict) -> None:
    click.echo(strict_json(data, indent=2))


def strict_json(data, **options) -> str:
    """JSON every parser takes: NaN and infinities become the strings "nan", "inf", "-inf"
    (docs/format.md), since bare NaN/Infinity are not JSON."""
    return json.dumps(_finite(data), allow_nan=False, **options)


def _finite(value):
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _graph_inputs(graph_path, backends_file, input_specs=(), graph=None) -> list:
    """Every file a run reads: outputs must never replace one of them."""
    files = [graph_path, backends_file]
    files += [spec.partition("=")[2].strip() for spec in input_specs]
    if graph is not None:
        files += [t.data.file for t in graph.leafs if t.data is not None and t.data.file]
    return [f for f in files if f]


def _prepare(graph_path: Path, backends_file: Path | None, policy: str = "ggml"):
    graph = load_graph(graph_path)
    override = load_backends(backends_file) if backends_file else None
    backends = engine.resolve_backends(graph, override)
    return graph, engine.schedule(graph, backends, policy)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ggmlrun")
@DEBUG
def cli():
    """See and run how a ggml compute graph is placed, sized and executed across devices."""


@cli.command()
@GRAPH
@BACKENDS
@JSON
@DEBUG
def validate(graph, backends_file, as_json):
    """Load and check a graph file only (backend names and pins included)."""
    g, _ = _prepare(graph, backends_file)
    if as_json:
        emit_json({"graph": g.name, "valid": True, "tensors": len(g.leafs), "nodes": len(g.nodes),
                   "outputs": [t.name for t in g.outputs]})
    else:
        stdout.print(f"{graph}: ok ({len(g.leafs)} tensors, {len(g.nodes)} nodes, outputs: "
                     f"{', '.join(t.name for t in g.outputs)})")


@cli.command()
@GRAPH
@BACKENDS
@JSON
@click.option("--dump-splits", is_flag=True, help="Every node's backend, cause and sources.")
@click.option("--format", "fmt", type=click.Choice(["table", "ggml"]), default="table",
              help="With --dump-splits: rich tables, or ggml's GGML_SCHED_DEBUG text.")
@POLICY
@DEBUG
def plan(graph, backends_file, as_json, dump_splits, fmt, policy):
    """Schedule only: the splits, their inputs, and why every node went where it did."""
    _, sched = _prepare(graph, backends_file, policy)
    if as_json:
        emit_json(report.plan_dict(sched))
        return
    if dump_splits and fmt == "ggml":
        click.echo(report.ggml_dump(sched))
        return
    report.print_tables(stdout, report.split_table(sched))
    if sched.policy is not None:
        report.print_tables(stdout, report.policy_table(sched))
    if dump_splits:
        report.print_tables(stdout, report.assignment_table(sched))


@cli.command()
@GRAPH
@BACKENDS
@JSON
@POLICY
@PLANNER
@DEBUG
def measure(graph, backends_file, as_json, policy, planner):
    """The measure pass: per backend, arena bytes, weights bytes and the lower bound."""
    from ggmlrun import visual
    from ggmlrun.core.observe.occupancy import occupancy

    with visual.busy(stderr, "planning"):
        g, sched = _prepare(graph, backends_file, policy)
        plan_, memory = engine.plan_memory(sched, planner)
    if as_json:
        emit_json(report.measure_dict(memory))
    else:
        report.print_tables(stdout, report.measure_table(memory, f"memory of {g.name}"))
        visual.print_occupancy(stdout, occupancy(sched, plan_), planner)


@cli.command()
@GRAPH
@BACKENDS
@JSON
@click.option("--input", "input_specs", multiple=True, metavar="NAME=FILE.npy",
              help="Set a graph input from a .npy file (repeatable).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every output, by name, to this .npz (atomically).")
@click.option("--repeat", type=click.IntRange(min=1, max=MAX_REPEAT), default=1,
              help="Compute N times after one plan.")
@click.option("--check", is_flag=True, help="Compare outputs with the plain NumPy reference evaluator.")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE.json", help="Write a Chrome/Perfetto trace of every run (atomically); "
              "open it in ui.perfetto.dev or chrome://tracing.")
@click.option("--profile", "show_profile", is_flag=True,
              help="Time per op and per copy route (with --json: a `profile` key).")
@POLICY
@PLANNER
@DEBUG
def run(graph, backends_file, as_json, input_specs, out_file, repeat, check, policy, planner,
        trace_file, show_profile):
    """Schedule, measure, allocate and compute; print splits, timings and outputs."""
    from ggmlrun.core.frontend import data
    from ggmlrun.core.run import results

    from ggmlrun import visual
    from ggmlrun.core.util.outputs import check_output

    def check_outputs(g=None):
        reads = _graph_inputs(graph, backends_file, input_specs, g)
        if out_file is not None:
            check_output(out_file, "--out", inputs=reads, others=[("--trace", trace_file)],
                         suffixes=(".npz",))
        if trace_file is not None:
            check_output(trace_file, "--trace", inputs=reads)

    check_outputs()
    with visual.busy(stderr, "planning"):
        g, sched = _prepare(graph, backends_file, policy)
        check_outputs(g)
        inputs = dict(data.load_input_override(g, spec) for spec in input_specs)
        plan_, memory = engine.plan_memory(sched, planner)
    engine.check_capacity(sched, memory)
    _check_ram(g, memory, check)
    leaf_values = engine.leaf_values(g)
    with visual.run_progress(stderr, repeat) as progress:
        result = engine.execute(sched, plan_, leaf_values, inputs=inputs, repeat=repeat,
                                progress=progress, record_events=bool(trace_file or show_profile))
    prof = None
    if show_profile:
        from ggmlrun.core.observe.profile import profile

        prof = profile(sched, result)
    if trace_file:
        from ggmlrun.core.observe.trace import build_trace

        results.write_text(trace_file, strict_json(build_trace(sched, plan_, result)))
        click.echo(f"wrote {trace_file}", err=True)
    summaries = {name: results.summarize(arr) for name, arr in result.outputs.items()}
    errors = (results.compare_with_reference(g, leaf_values, inputs, result.outputs, repeat)
              if check else None)
    if out_file:
        results.write_npz(out_file, result.outputs)
        click.echo(f"wrote {out_file}", err=True)
    if as_json:
        payload = report.run_dict(sched, memory, result, summaries)
        if errors is not None:
            payload["check"] = {"max_rel_err": errors, "passed": results.check_passed(g, errors)}
        if prof is not None:
            payload["profile"] = prof.as_dict()
        emit_json(payload)
    else:
        report.print_tables(stdout, report.split_table(sched), report.timing_table(result),
                            report.outputs_table(summaries, errors))
        if prof is not None:
            report.print_tables(stdout, *visual.profile_tables(prof))
    if errors is not None and not results.check_passed(g, errors):
        worst = max(errors, key=errors.get)
        raise CheckError(f"output '{worst}' differs from the reference evaluator by "
                                 f"{errors[worst]:.3e} (relative)")


def _check_ram(graph, memory, check: bool) -> None:
    """The whole run's arrays against the machine's free memory, before any is made: every
    backend's weights and arena, and with --check the reference's copy of every node."""
    from ggmlrun.core.util.ram import ensure_memory

    need = sum(m.arena_bytes + m.weights_bytes for m in memory)
    if check:
        need += sum(t.n_elements * t.itemsize for t in graph.nodes)
    ensure_memory(need, "this run" + (" with --check's reference" if check else ""))


@cli.command("dot")
@GRAPH
@BACKENDS
@POLICY
@click.option("-o", "--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="FILE.svg/.png/.pdf: rendered by Graphviz's `dot` when it is on PATH (else "
                   "FILE.dot is written); any other name: DOT text. Default: DOT on stdout.")
@DEBUG
def dot_command(graph, backends_file, policy, out_file):
    """The schedule as a Graphviz graph: nodes by backend, splits as clusters, copies dashed."""
    import shutil

    from ggmlrun.core.observe.dot import RENDERED, render, to_dot
    from ggmlrun.core.run.results import write_atomic, write_text
    from ggmlrun.core.util.outputs import check_output

    if out_file is not None:
        check_output(out_file, "--out", inputs=_graph_inputs(graph, backends_file))
    g, sched = _prepare(graph, backends_file, policy)
    if out_file is not None:
        check_output(out_file, "--out", inputs=_graph_inputs(graph, backends_file, graph=g))
    text = to_dot(sched)
    if out_file is None:
        click.echo(text, nl=False)
        return
    fmt = out_file.suffix.lower().lstrip(".")
    if fmt in RENDERED:
        exe = shutil.which("dot")
        if exe:
            picture = render(text, fmt, exe)
            write_atomic(out_file, lambda handle: handle.write(picture))
            click.echo(f"wrote {out_file}", err=True)
            return
        dot_file = out_file.with_suffix(".dot")
        click.echo(f"ggmlrun: warning: Graphviz `dot` is not on PATH, so no {fmt.upper()}; "
                   f"writing DOT to {dot_file} (render it with: dot -T{fmt} {dot_file} "
                   f"-o {out_file})", err=True)
        out_file = check_output(dot_file, "--out", inputs=_graph_inputs(graph, backends_file, graph=g))
    write_text(out_file, text)
    click.echo(f"wrote {out_file}", err=True)


@cli.command()
@BACKENDS
@JSON
@DEBUG
def ops(backends_file, as_json):
    """The op table, and which backends support each op."""
    from ggmlrun.core.backends.spec import default_backends

    backends = load_backends(backends_file) if backends_file else default_backends()
    if as_json:
        emit_json(report.ops_dict(backends))
    else:
        report.print_tables(stdout, report.ops_table(backends))


@cli.command()
@click.argument("csv_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--capacity", metavar="BYTES", help="Fail (exit 1) when the peak exceeds this "
              "(an integer or 1MiB-style size); the search stops at the first fit.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the rows back with an `offset` column (atomically).")
@click.option("--time-limit", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds for the search after the greedy passes (0: greedy only).")
@JSON
@DEBUG
def pack(csv_file, capacity, out_file, time_limit, as_json):
    """The offset planner alone, on MiniMalloc's CSV format (id,lower,upper,size)."""
    from ggmlrun.core.util.errors import RunError
    from ggmlrun.core.frontend.loader import parse_size
    from ggmlrun.core.memory.pack import (FALLBACK_PREFIX, plan_offsets, read_csv, verify,
                                          write_csv)
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
        report.print_tables(stdout, report.pack_table(str(csv_file), len(buffers), result, capacity))
    if not fits:
        raise RunError(f"peak {result.peak} bytes exceeds --capacity {capacity} bytes "
                       f"(lower bound {result.lower_bound}); raise the capacity or the --time-limit")


@cli.group()
def gen():
    """Write a generated graph file (llama-style or MLP) with real model shapes."""


def _check_gen(name: str, device: str, out: Path | None) -> None:
    """Refuse, before generating, what would make a file ggmlrun itself then rejects."""
    from ggmlrun.core.frontend.yamlfile import NAME_RE
    from ggmlrun.core.util.fmt import clip
    from ggmlrun.core.util.outputs import check_output

    for option, value in (("--name", name), ("--device", device)):
        if not NAME_RE.match(value):
            raise InputError(f"{option} '{clip(value)}' is not a valid name; use letters, digits, "
                             "'_', '.' and '-', starting with a letter or '_'")
    if out is not None:
        check_output(out, "--out")


def _write_text(text: str, out: Path | None) -> None:
    from ggmlrun.core.run.results import write_text

    if out is None:
        click.echo(text, nl=False)
    else:
        write_text(out, text)
        click.echo(f"wrote {out}", err=True)


@gen.command("llama")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--dim", type=click.IntRange(min=2), default=256, show_default=True)
@click.option("--heads", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--ffn", type=click.IntRange(min=1), default=688, show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=32, show_default=True,
              help="Tokens per compute (rows of every activation).")
@click.option("--context", type=click.IntRange(min=0), default=0, show_default=True,
              help="KV-cache length: > batch keeps a cache per layer, written through cpy; "
                   "0 attends over the batch alone.")
@click.option("--dtype", type=click.Choice(["f32", "f16"]), default="f32", show_default=True)
@click.option("--offload", type=click.IntRange(min=0), default=0, show_default=True,
              help="How many of the last layers keep their weights on the device.")
@click.option("--device", default="SIM0", show_default=True)
@click.option("--name", default="llama", show_default=True)
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path))
@DEBUG
def gen_llama(layers, dim, heads, ffn, batch, context, dtype, offload, device, name, out):
    """A llama-style stack: rms_norm, q/k/v, rope, causal attention, swiglu FFN."""
    from ggmlrun.core.frontend.gen import LlamaShape, llama

    _check_gen(name, device, out)
    if dim % heads or (dim // heads) % 2:
        raise InputError(f"--dim {dim} must be a multiple of --heads {heads} with an even head size")
    if offload > layers:
        raise InputError(f"--offload {offload} is more than --layers {layers}")
    if 0 < context < batch:
        raise InputError(f"--context {context} is shorter than --batch {batch}")
    shape = LlamaShape(layers=layers, dim=dim, heads=heads, ffn=ffn, batch=batch, context=context,
                       dtype=dtype, offload=offload, device=device)
    _write_text(llama(shape, name=name), out)


@gen.command("mlp")
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--dim", type=click.IntRange(min=1), default=512, show_default=True)
@click.option("--hidden", type=click.IntRange(min=1), default=2048, show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--dtype", type=click.Choice(["f32", "f16"]), default="f32", show_default=True)
@click.option("--offload", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--device", default="SIM0", show_default=True)
@click.option("--name", default="mlp", show_default=True)
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path))
@DEBUG
def gen_mlp(layers, dim, hidden, batch, dtype, offload, device, name, out):
    """A stack of gelu MLP blocks with residuals."""
    from ggmlrun.core.frontend.gen import mlp

    _check_gen(name, device, out)
    if offload > layers:
        raise InputError(f"--offload {offload} is more than --layers {layers}")
    _write_text(mlp(layers, dim, hidden, batch, dtype, offload, device, name), out)


def _on_sigterm(signum, frame):
    """SIGTERM: leave no temporary file behind, then exit as a terminated process does."""
    from ggmlrun.core.util.atomic import remove_temp_files

    remove_temp_files()
    raise SystemExit(128 + signum)


def _install_signal_handlers() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _on_sigterm)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        _install_signal_handlers()
        _main(argv)
    except KeyboardInterrupt:
        _interrupted()


def _interrupted() -> None:
    from ggmlrun.core.util.atomic import remove_temp_files

    remove_temp_files()
    click.echo("ggmlrun: interrupted", err=True)
    sys.exit(130)


def _main(argv: list[str]) -> None:
    debug = "--debug" in argv
    try:
        cli.main(args=argv, prog_name="ggmlrun", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(2 if isinstance(err, click.UsageError) else err.exit_code)
    except click.exceptions.Abort as err:
        if isinstance(err.__context__, KeyboardInterrupt):
            _interrupted()
        stderr.print("ggmlrun: aborted")
        sys.exit(1)
    except GgmlrunError as err:
        if debug:
            raise
        fail(str(err), err.exit_code)
    except MemoryError:       # the checks before each allocation missed one: still one line
        if debug:
            raise
        fail("out of memory: the machine could not give what this run needs; use a smaller "
             "graph or free memory", 1)
    except Exception as err:  # noqa: BLE001 - one line for anything unexpected
        if debug:
            raise
        fail(f"internal error: {type(err).__name__}: {err} (run with --debug for a traceback)", 1)
    sys.exit(0)


def fail(message: str, code: int) -> None:
    from ggmlrun.core.util.fmt import clip

    # a huge value or name in a message is shown cut, so an error stays a readable line
    # (a file path, up to 256 characters, stays whole)
    message = " ".join(word if len(word) <= 256 else clip(word) for word in message.split(" "))
    if len(message) > MAX_MESSAGE:  # a huge value printed in full: keep where, and the advice
        message = f"{message[:MAX_MESSAGE - 300]} … {message[-250:]}"
    click.echo(f"ggmlrun: error: {message}", err=True)
    sys.exit(code)


__all__ = ["cli", "main", "InputError"]
