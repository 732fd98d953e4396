"""Click commands only: parse, call the core, hand results to the report layer.

Data goes to stdout, diagnostics to stderr. Every error leaves through `main()`: one line, exit
2 for bad input, 1 for a failure while running, a traceback only with --debug.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from pathlib import Path

import click
from rich.console import Console

from ggmlrun import report
from ggmlrun.core import engine
from ggmlrun.core.util.errors import CapacityError, CheckError, GgmlrunError, InputError
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
PLANNER = click.option("--planner", type=click.Choice(["ggml", "best"]), default="best",
                       show_default=True,
                       help="Arena offsets: ggml's online best-fit, or the offline planner "
                            "(never larger).")


def emit_json(data: dict) -> None:
    click.echo(json.dumps(data, indent=2, default=_json_default))


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _prepare(graph_path: Path, backends_file: Path | None, policy: str = "ggml",
             overrides=None, phases=None):
    from ggmlrun.core.frontend.overrides import apply

    phase = phases or (lambda name: contextlib.nullcontext())
    with phase("load"):
        graph = load_graph(graph_path)
        override = load_backends(backends_file) if backends_file else None
        backends = engine.resolve_backends(graph, override)
        if overrides is not None:
            backends = apply(graph, backends, overrides)
    with phase("schedule"):
        return graph, engine.schedule(graph, backends, policy)


def placement_options(func):
    """--memory, --remap, --no-op-offload, --offload-min-batch: "what if" without editing files,
    received by the command as one `overrides` argument; and --progress (phase times)."""
    @functools.wraps(func)
    def wrapper(*args, memory_specs, remap_specs, no_op_offload, offload_min_batch, **kwargs):
        from ggmlrun.core.frontend.overrides import parse

        kwargs["overrides"] = parse(memory_specs, remap_specs, not no_op_offload,
                                    offload_min_batch, kwargs.pop("threads", None))
        return func(*args, **kwargs)

    options = [
        click.option("--memory", "memory_specs", multiple=True, metavar="NAME=SIZE",
                     help="Override a backend's memory (e.g. SIM0=4GiB); repeatable."),
        click.option("--remap", "remap_specs", multiple=True, metavar="NAME=NAME",
                     help="Move every tensor and pin of one backend to another, which drops the "
                          "first from the list (e.g. SIM0=CPU); repeatable."),
        click.option("--no-op-offload", is_flag=True,
                     help="Never move a CPU-weight op to a device for its batch (llama.cpp's "
                          "--no-op-offload)."),
        click.option("--offload-min-batch", type=click.IntRange(min=1), metavar="N",
                     help="Batch from which op offload moves an op to a device (every device)."),
        click.option("--progress", "show_progress", is_flag=True,
                     help="Phase times on stderr even when it is not a terminal."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def _fit_and_summary(sched, memory, phases, payload: dict | None = None):
    """The fits check, the llama.cpp-style summary and the op-offload note, shared by plan,
    measure and run; returns both (a failure to fit is raised by the caller, after the output)."""
    import os

    from ggmlrun.core.memory.fits import check
    from ggmlrun.core.observe.summary import summarize

    fit = check(memory)
    summary = summarize(sched, memory)
    note = report.offload_note(summary)
    if note:
        click.echo(f"ggmlrun: {note}", err=True)
    if os.environ.get("GGML_SCHED_DEBUG", "0") not in ("", "0"):
        click.echo(report.ggml_dump(sched), err=True)
    if payload is not None:
        payload.update(report.fit_dict(fit))
        payload["summary"] = report.summary_dict(summary)
        payload["phases"] = phases.as_dict()
    return fit, summary


def _raise_unless_fits(sched, memory, fit) -> None:
    engine.check_capacity(sched, memory, fit.host_memory_bytes)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ggmlrun")
@DEBUG
def cli():
    """See and run how a ggml compute graph is placed, sized and executed across devices."""


@cli.command()
@GRAPH
@BACKENDS
@JSON
@placement_options
@DEBUG
def validate(graph, backends_file, as_json, overrides, show_progress):
    """Load and check a graph file only (backend names and pins included)."""
    from ggmlrun import visual

    phases = visual.Phases(stderr, show_progress)
    g, _ = _prepare(graph, backends_file, overrides=overrides, phases=phases)
    phases.report()
    if as_json:
        emit_json({"graph": g.name, "valid": True, "tensors": len(g.leafs), "nodes": len(g.nodes),
                   "outputs": [t.name for t in g.outputs]})
    else:
        stdout.print(report.plain(f"{graph}: ok ({len(g.leafs)} tensors, {len(g.nodes)} nodes, "
                                  f"outputs: {', '.join(t.name for t in g.outputs)})"),
                     markup=False, highlight=False)


@cli.command()
@GRAPH
@BACKENDS
@JSON
@click.option("--dump-splits", is_flag=True, help="Every node's backend, cause and sources.")
@click.option("--format", "fmt", type=click.Choice(["table", "ggml"]), default="table",
              help="The dump as rich tables, or as ggml's GGML_SCHED_DEBUG text (implies "
                   "--dump-splits).")
@POLICY
@placement_options
@DEBUG
def plan(graph, backends_file, as_json, dump_splits, fmt, policy, overrides, show_progress):
    """Schedule only: the splits, their inputs, and why every node went where it did; with the
    memory each backend would need (ggml's allocator) and whether it fits."""
    from ggmlrun import visual

    phases = visual.Phases(stderr, show_progress)
    _, sched = _prepare(graph, backends_file, policy, overrides, phases)
    with phases("plan"):
        _, memory = engine.plan_memory(sched, "ggml")
    dump_splits = dump_splits or fmt == "ggml"     # the ggml text is the dump itself
    payload = report.plan_dict(sched) if as_json else None
    if as_json:
        pass
    elif fmt == "ggml":
        click.echo(report.ggml_dump(sched))
    else:
        report.print_tables(stdout, report.split_table(sched))
        if sched.policy is not None:
            report.print_tables(stdout, report.policy_table(sched))
        if dump_splits:
            report.print_tables(stdout, report.assignment_table(sched))
    fit, summary = _fit_and_summary(sched, memory, phases, payload)
    if not as_json and fmt != "ggml":    # the ggml text stands alone, as ggml prints it
        report.print_tables(stdout, report.summary_table(summary, fit))
    if as_json:
        emit_json(payload)
    else:
        phases.report()
    _raise_unless_fits(sched, memory, fit)


@cli.command()
@GRAPH
@BACKENDS
@JSON
@POLICY
@PLANNER
@click.option("--fit", "fit_layers", is_flag=True,
              help="For a layered graph (weights l<N>.*): how many layers fit on each device.")
@placement_options
@DEBUG
def measure(graph, backends_file, as_json, policy, planner, fit_layers, overrides, show_progress):
    """The measure pass: per backend, arena bytes, weights bytes and the lower bound, and
    whether weights + arena fit each backend's memory and all of them the host's RAM."""
    from ggmlrun import visual
    from ggmlrun.core.observe.occupancy import occupancy

    phases = visual.Phases(stderr, show_progress)
    g, sched = _prepare(graph, backends_file, policy, overrides, phases)
    with phases("plan"):
        plan_, memory = engine.plan_memory(sched, planner)
    payload = report.measure_dict(memory) if as_json else None
    fit, summary = _fit_and_summary(sched, memory, phases, payload)
    layer_fits = []
    if fit_layers:
        with phases("fit"):
            layer_fits = _layers_that_fit(g, sched, policy, planner)
        if payload is not None:
            payload["layer_fit"] = [report.layer_fit_dict(f, overrides.op_offload)
                                    for f in layer_fits]
    if as_json:
        emit_json(payload)
    else:
        report.print_tables(stdout, report.summary_table(summary),
                            report.measure_table(memory, f"memory of {g.name}", fit))
        stdout.print(report.host_line(fit), markup=False, highlight=False)
        for f in layer_fits:
            stdout.print(report.layer_fit_line(f, overrides.op_offload), markup=False,
                         highlight=False)
        visual.print_occupancy(stdout, occupancy(sched, plan_), planner)
        phases.report()
    if not layer_fits:
        _raise_unless_fits(sched, memory, fit)
    elif not all(f.base_fits for f in layer_fits):
        worst = next(f for f in layer_fits if not f.base_fits)
        raise CapacityError(f"{worst.device} is over its memory even with no layer on it")


def _layers_that_fit(graph, sched, policy: str, planner: str):
    from ggmlrun.core.memory.fits import layer_weights, layers_that_fit

    backends = sched.backends
    if not layer_weights(graph):
        raise InputError("--fit needs a layered graph: weights named l<N>.* (as `gen llama` "
                         "writes them)", file=str(graph.path) if graph.path else None)
    devices = [b.name for b in backends if b.kind != "cpu"]
    if not devices:
        raise InputError("--fit needs a device besides the CPU in the backends list")
    return [layers_that_fit(graph, device, backends[-1].name,
                            lambda g: engine.measure_graph(g, backends, policy, planner))
            for device in devices]


@cli.command()
@GRAPH
@BACKENDS
@JSON
@click.option("--input", "input_specs", multiple=True, metavar="NAME=FILE.npy",
              help="Set a graph input from a .npy file (repeatable).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every output, by name, to this .npz (atomically).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, help="Compute N times after one plan.")
@click.option("--check", is_flag=True, help="Compare outputs with the plain NumPy reference evaluator.")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE.json", help="Write a Chrome/Perfetto trace of every run (atomically); "
              "open it in ui.perfetto.dev or chrome://tracing.")
@click.option("--profile", "show_profile", is_flag=True,
              help="Time per op and per copy route (with --json: a `profile` key).")
@click.option("--profile-by", type=click.Choice(["op", "node", "shape"]), default="op",
              show_default=True, help="With --profile: group computes by op, node, or op and shape.")
@click.option("--sort", "profile_sort", type=click.Choice(["total", "mean", "calls", "name"]),
              default="total", show_default=True, help="With --profile: the order of its rows.")
@click.option("--top", "profile_top", type=click.IntRange(min=1), metavar="N",
              help="With --profile: only the first N rows.")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Untimed runs before the timed ones (caches, BLAS start-up).")
@click.option("--threads", type=click.IntRange(min=1), metavar="N",
              help="BLAS threads for the run (capped at the machine's cores); overrides the CPU "
                   "backend's `threads`.")
@POLICY
@PLANNER
@placement_options
@DEBUG
def run(graph, backends_file, as_json, input_specs, out_file, repeat, check, policy, planner,
        trace_file, show_profile, profile_by, profile_sort, profile_top, warmup, overrides,
        show_progress):
    """Schedule, measure, allocate and compute; print splits, timings and outputs."""
    import os

    from ggmlrun.core.frontend import data
    from ggmlrun.core.run import results

    from ggmlrun import visual

    phases = visual.Phases(stderr, show_progress)
    g, sched = _prepare(graph, backends_file, policy, overrides, phases)
    with phases("load"):
        inputs = dict(data.load_input_override(g, spec) for spec in input_specs)
    with phases("plan"):
        plan_, memory = engine.plan_memory(sched, planner)
    payload = {} if as_json else None
    fit, summary = _fit_and_summary(sched, memory, phases, payload)
    _raise_unless_fits(sched, memory, fit)    # before any data is generated or allocated
    with phases("data"):
        leaf_values = engine.leaf_values(g)
    with phases("compute"), visual.run_progress(stderr, repeat) as progress:
        result = engine.execute(sched, plan_, leaf_values, inputs=inputs, repeat=repeat,
                                progress=progress, record_events=bool(trace_file or show_profile),
                                warmup=warmup)
    cpu_threads = sched.backends[-1].threads
    threads = str(cpu_threads) if cpu_threads else f"default ({os.cpu_count()} cores)"
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    prof = None
    if show_profile:
        from ggmlrun.core.observe.profile import profile

        prof = profile(sched, result, profile_by, profile_sort, profile_top)
    if trace_file:
        from ggmlrun.core.observe.trace import build_trace

        results.write_text(trace_file, json.dumps(build_trace(sched, plan_, result),
                                                  default=_json_default))
        click.echo(f"wrote {trace_file}", err=True)
    summaries = {name: results.summarize(arr) for name, arr in result.outputs.items()}
    errors = results.compare_with_reference(g, leaf_values, inputs, result.outputs) if check else None
    if out_file:
        results.write_npz(out_file, result.outputs)
    if as_json:
        payload.update(report.run_dict(sched, memory, result, summaries))
        payload["timings"].update({"warmup": warmup, "threads": cpu_threads,
                                   "load_average": list(load) if load else None})
        payload["phases"] = phases.as_dict()
        if errors is not None:
            payload["check"] = {"max_rel_err": errors, "passed": results.check_passed(g, errors)}
        if prof is not None:
            payload["profile"] = prof.as_dict()
        emit_json(payload)
    else:
        report.print_tables(stdout, report.summary_table(summary, fit), report.split_table(sched))
        stdout.print(report.timing_header(result, warmup, threads, load), markup=False,
                     highlight=False)
        report.print_tables(stdout, report.timing_table(result),
                            report.outputs_table(summaries, errors))
        if prof is not None:
            report.print_tables(stdout, *visual.profile_tables(prof, profile_by))
        phases.report()
    if errors is not None and not results.check_passed(g, errors):
        worst = max(errors, key=errors.get)
        raise CheckError(f"output '{worst}' differs from the reference evaluator by "
                                 f"{errors[worst]:.3e} (relative)")


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

    _, sched = _prepare(graph, backends_file, policy)
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
        out_file = dot_file
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
    from ggmlrun.core.memory.pack import plan_offsets, read_csv, verify, write_csv

    if capacity is not None:
        try:
            capacity = parse_size(capacity)
        except ValueError as err:
            raise InputError(f"--capacity: {err}") from None
    buffers = read_csv(csv_file)
    result = plan_offsets(buffers, capacity=capacity, time_limit=time_limit)
    problems = verify(buffers, result.offsets)
    if problems:
        raise RunError(f"internal error: the planner produced overlapping offsets: {problems[0]}")
    if out_file:
        write_csv(out_file, buffers, result.offsets)
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


def _write_text(text: str, out: Path | None) -> None:
    from ggmlrun.core.run.results import write_text

    if out is None:
        click.echo(text, nl=False)
    else:
        write_text(out, text)
        stderr.print(report.plain(f"wrote {out}"), markup=False, highlight=False)


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

    if offload > layers:
        raise InputError(f"--offload {offload} is more than --layers {layers}")
    _write_text(mlp(layers, dim, hidden, batch, dtype, offload, device, name), out)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        cli.main(args=argv, prog_name="ggmlrun", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(2 if isinstance(err, click.UsageError) else err.exit_code)
    except click.exceptions.Abort:
        stderr.print("ggmlrun: aborted")
        sys.exit(1)
    except GgmlrunError as err:
        if debug:
            raise
        fail(str(err), err.exit_code)
    except Exception as err:  # noqa: BLE001 - one line for anything unexpected
        if debug:
            raise
        fail(f"internal error: {type(err).__name__}: {err} (run with --debug for a traceback)", 1)
    sys.exit(0)


def fail(message: str, code: int) -> None:
    click.echo(f"ggmlrun: error: {message}", err=True)
    sys.exit(code)


__all__ = ["cli", "main", "InputError"]
