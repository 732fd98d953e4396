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
MAX_REPEAT = 1_000_000
MAX_MESSAGE = 1200
PLANNER = click.option("--planner", type=click.Choice(["ggml", "best"]), default="best",
                       show_default=True,
                       help="Arena offsets: ggml's online best-fit, or the offline planner "
                            "(never larger).")


GGML = click.option("--ggml", "ggml", type=click.Choice(["0.25", "0.15"]), default="0.25",
                    show_default=True,
                    help="Whose scheduler and allocator rules: ggml 0.25.3 (llama.cpp's) or "
                         "0.15.3.")



# --- model options (GGUF files and model cards; SPEC section 5) --------------------------------
class _NglType(click.ParamType):
    name = "N|all"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value is None:
            return value
        if str(value).lower() == "all":
            return None
        try:
            n = int(value)
        except ValueError:
            n = -1
        if n < 0:
            self.fail(f"{value!r} is neither a layer count (0 or more) nor 'all'", param, ctx)
        return n


class _SplitType(click.ParamType):
    name = "A,B,..."

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            parts = tuple(float(v) for v in str(value).replace("/", ",").split(","))
        except ValueError:
            self.fail(f"{value!r}: give one non-negative number per device, e.g. 3,1", param, ctx)
        if any(not (p >= 0 and p < float("inf")) for p in parts) or not sum(parts) > 0:
            self.fail(f"{value!r}: the proportions must be non-negative, finite and not all 0",
                      param, ctx)
        return parts


class _OverrideType(click.ParamType):
    name = "REGEX=BACKEND"

    def convert(self, value, param, ctx):
        import re

        if isinstance(value, tuple):
            return value
        pattern, eq, backend = str(value).rpartition("=")
        if not eq or not pattern or not backend:
            self.fail(f"{value!r}: write REGEX=BACKEND, e.g. 'ffn_.*=CPU'", param, ctx)
        try:
            re.compile(pattern)
        except re.error as err:
            self.fail(f"{value!r}: bad regular expression: {err}", param, ctx)
        return (pattern, backend)


MODEL_OPTIONS = {
    "ctx_size": click.option("--ctx", "ctx_size", type=click.IntRange(min=1), default=None,
                             help="[models] Context length (llama.cpp -c); default the model's, "
                                  "at most 4096."),
    "ubatch": click.option("--ubatch", type=click.IntRange(min=1), default=None,
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


def emit_json(data: dict) -> None:
    from ggmlrun.core.run.results import strict_json

    click.echo(strict_json(data, indent=2))


def _prepare(graph_path: Path, backends_file: Path | None, policy: str = "ggml",
             overrides=None, phases=None, ggml: str | None = None):
    return engine.prepare(graph_path, backends_file, policy, ggml, overrides, phases)


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
        payload.update(report.fits_dict(fit))
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

    model = _model_input(graph, backends_file, {}, overrides=overrides)
    if model:
        return _validate_model(*model, as_json)

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
@GGML
@model_options()
@placement_options
@DEBUG
def plan(graph, backends_file, as_json, dump_splits, fmt, policy, ggml, overrides, show_progress,
         **model_kw):
    """Schedule only: the splits, their inputs, and why every node went where it did; with the
    memory each backend would need (ggml's allocator) and whether it fits."""
    from ggmlrun import visual

    phases = visual.Phases(stderr, show_progress)
    model = _model_input(graph, backends_file, model_kw, ggml, policy, overrides)
    if model:
        sched = _model_schedule(*model)
    else:
        _, sched = _prepare(graph, backends_file, policy, overrides, phases, ggml)
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
@GGML
@model_options()
@placement_options
@DEBUG
def measure(graph, backends_file, as_json, policy, planner, fit_layers, ggml, overrides,
            show_progress, **model_kw):
    """The measure pass: per backend, arena bytes, weights bytes and the lower bound, and
    whether weights + arena fit each backend's memory and all of them the host's RAM."""
    from ggmlrun import visual
    from ggmlrun.core.observe.occupancy import occupancy

    model = _model_input(graph, backends_file, model_kw, ggml, policy, overrides)
    if model:
        return _measure_model(*model, as_json)
    phases = visual.Phases(stderr, show_progress)
    g, sched = _prepare(graph, backends_file, policy, overrides, phases, ggml)
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
@click.option("--repeat", type=click.IntRange(min=1, max=MAX_REPEAT), default=1,
              help="Compute N times after one plan.")
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
@GGML
@click.option("--tokens", metavar="1,2,3", help="[models] Token ids evaluated as one batch; the "
              "output is the last token's logits, `result_output`.")
@model_options()
@placement_options
@DEBUG
def run(graph, backends_file, as_json, input_specs, out_file, repeat, check, policy, planner,
        trace_file, show_profile, profile_by, profile_sort, profile_top, warmup, ggml, tokens,
        overrides, show_progress, **model_kw):
    """Schedule, measure, allocate and compute; print splits, timings and outputs."""
    import os

    from ggmlrun import visual

    model = _model_input(graph, backends_file, {**model_kw, "tokens": tokens}, ggml, policy,
                         overrides)
    if model:
        return _run_model(*model, tokens, as_json, out_file)
    phases = visual.Phases(stderr, show_progress)
    request = engine.RunRequest(graph_path=graph, backends_path=backends_file,
                                input_specs=input_specs, repeat=repeat, check=check,
                                policy=policy, planner=planner, trace_path=trace_file,
                                out_path=out_file, profile=show_profile, profile_by=profile_by,
                                profile_sort=profile_sort, profile_top=profile_top, ggml=ggml,
                                overrides=overrides, warmup=warmup)
    outcome = engine.run_pipeline(request, phases=phases,
                                  progress=lambda: visual.run_progress(stderr, repeat))
    sched, result, errors, prof = outcome.schedule, outcome.result, outcome.errors, outcome.profile
    if trace_file:
        click.echo(f"wrote {trace_file}", err=True)
    if out_file:
        click.echo(f"wrote {out_file}", err=True)
    payload = {} if as_json else None
    fit, summary = _fit_and_summary(sched, outcome.memory, phases, payload)
    cpu_threads = sched.backends[-1].threads
    threads = str(cpu_threads) if cpu_threads else f"default ({os.cpu_count()} cores)"
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    if as_json:
        payload.update(report.run_dict(sched, outcome.memory, result, outcome.summaries))
        payload["timings"].update({"warmup": warmup, "threads": cpu_threads,
                                   "load_average": list(load) if load else None})
        payload["phases"] = phases.as_dict()
        if errors is not None:
            payload["check"] = {"max_rel_err": errors, "passed": outcome.check_failure is None}
        if prof is not None:
            payload["profile"] = prof.as_dict()
        emit_json(payload)
    else:
        report.print_tables(stdout, report.summary_table(summary, fit), report.split_table(sched))
        stdout.print(report.timing_header(result, warmup, threads, load), markup=False,
                     highlight=False)
        report.print_tables(stdout, report.timing_table(result),
                            report.outputs_table(outcome.summaries, errors))
        if prof is not None:
            report.print_tables(stdout, *visual.profile_tables(prof, profile_by))
        phases.report()
    if outcome.check_failure:
        raise CheckError(outcome.check_failure)


@cli.command("dot")
@GRAPH
@BACKENDS
@POLICY
@click.option("-o", "--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="FILE.svg/.png/.pdf: rendered by Graphviz's `dot` when it is on PATH (else "
                   "FILE.dot is written); any other name: DOT text. Default: DOT on stdout.")
@GGML
@model_options()
@DEBUG
def dot_command(graph, backends_file, policy, out_file, ggml, **model_kw):
    """The schedule as a Graphviz graph: nodes by backend, splits as clusters, copies dashed."""
    import shutil

    from ggmlrun.core.observe.dot import RENDERED, render, to_dot
    from ggmlrun.core.run.results import write_atomic, write_text
    from ggmlrun.core.util.outputs import check_output

    if out_file is not None:
        check_output(out_file, "--out", inputs=engine.files_read(graph, backends_file))
    model = _model_input(graph, backends_file, model_kw, ggml, policy)
    if model:
        sched = _model_schedule(*model)
    else:
        g, sched = _prepare(graph, backends_file, policy, ggml=ggml)
        if out_file is not None:
            check_output(out_file, "--out", inputs=engine.files_read(graph, backends_file, graph=g))
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
        out_file = check_output(dot_file, "--out", inputs=engine.files_read(graph, backends_file))
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
    if as_json:
        emit_json(report.model_measure_dict(model, figures, memory))
    else:
        report.print_tables(stdout, report.model_measure_table(model, figures))


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
        report.print_tables(stdout, report.timing_table(result),
                            report.outputs_table(summaries, None))


class _CtxType(click.ParamType):
    name = "N|auto"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int) or value == "auto":
            return value
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            self.fail(f"{value!r} is neither a context length (1 or more) nor 'auto'", param, ctx)
        return n


@cli.command()
@click.argument("model_path", metavar="MODEL", type=click.Path(dir_okay=False, path_type=Path))
@BACKENDS
@JSON
@click.option("--ctx", "fit_ctx", type=_CtxType(), default=None,
              help="Context length, or 'auto': the largest (a multiple of 256, up to the "
                   "model's) that fits with the most layers; default the model's, at most 4096.")
@click.option("--min-ctx", type=click.IntRange(min=1), default=4096, show_default=True,
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
        report.print_tables(stdout, report.fit_table(model_file, result))
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
