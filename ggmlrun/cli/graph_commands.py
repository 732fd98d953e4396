"""validate, plan, measure, run and dot: parse, call the engine (or the models package),
render with report/."""

from __future__ import annotations

from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.core.util.errors import CapacityError, CheckError, InputError
from ggmlrun.cli.llama_tail import TailCommand
from ggmlrun.cli.common import MODEL_ARG, stdout, stderr, phase_timer, GRAPH, BACKENDS, JSON, DEBUG, POLICY, PLANNER, GGML, MAX_REPEAT, emit_json, _prepare, placement_options, _fit_and_summary, _raise_unless_fits, cli
from ggmlrun.cli.model_commands import _measure_model, _model_schedule, _run_model, _validate_model
from ggmlrun.cli.model_options import (MODEL_OPTIONS, model_options, _model_input, refuse_draft,
                                       planned_for_dict, print_planned_for)


@cli.command()
@GRAPH
@BACKENDS
@JSON
@MODEL_OPTIONS["refresh"]
@placement_options
@DEBUG
def validate(graph, backends_file, as_json, refresh, overrides, show_progress):
    """Load and check a graph file only (backend names and pins included)."""
    model = _model_input(graph, backends_file, {"refresh": refresh}, overrides=overrides)
    if model:
        return _validate_model(*model, as_json)

    phases = phase_timer(show_progress)
    g, _ = _prepare(graph, backends_file, overrides=overrides, phases=phases)
    phases.report()
    if as_json:
        emit_json({"graph": g.name, "valid": True, "tensors": len(g.leafs), "nodes": len(g.nodes),
                   "outputs": [t.name for t in g.outputs]})
    else:
        # one plain line: click's echo, not rich (whose import alone is ~20 ms of start-up)
        click.echo(report.plain(f"{graph}: ok ({len(g.leafs)} tensors, {len(g.nodes)} nodes, "
                                f"outputs: {', '.join(t.name for t in g.outputs)})"))


@cli.command()
@GRAPH
@BACKENDS
@JSON
@click.option("--dump-splits", is_flag=True, help="Every node's backend, cause and sources.")
@click.option("--format", "fmt", type=click.Choice(["table", "ggml"]), default="table",
              show_default=True,
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
    from ggmlrun.core import engine

    phases = phase_timer(show_progress)
    model = _model_input(graph, backends_file, model_kw, ggml, policy, overrides)
    refuse_draft(model, "plan")
    if model:
        sched = _model_schedule(*model)
    else:
        _, sched = _prepare(graph, backends_file, policy, overrides, phases, ggml)
    with phases("plan"):
        _, memory = engine.plan_memory(sched, "ggml")
    dump_splits = dump_splits or fmt == "ggml"     # the ggml text is the dump itself
    payload = report.plan_dict(sched) if as_json else None
    if model and as_json:
        payload.update(planned_for_dict(model))
    elif model and fmt != "ggml":
        print_planned_for(model)
    if as_json:
        pass
    elif fmt == "ggml":
        click.echo(report.ggml_dump(sched))
    else:
        report.print_tables(stdout(), report.split_table(sched))
        if sched.policy is not None:
            report.print_tables(stdout(), report.policy_table(sched))
        if dump_splits:
            report.print_tables(stdout(), report.assignment_table(sched))
    fit, summary = _fit_and_summary(sched, memory, phases, payload)
    if not as_json and fmt != "ggml":    # the ggml text stands alone, as ggml prints it
        report.print_tables(stdout(), report.summary_table(summary, fit))
        for line in report.cause_legend(sched):
            click.echo(line)
    if as_json:
        emit_json(payload)
    else:
        phases.report()
    _raise_unless_fits(sched, memory, fit)


@cli.command(cls=TailCommand)
@click.argument("graph", type=MODEL_ARG, required=False)
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
    whether weights + arena fit each backend's memory and all of them the host's RAM.

    measure [MODEL] [OPTIONS] -- llama-server ARGS... (or llama-cli): a model's buffers for
    that command line as you run it (the model from -m/-hf when MODEL is not given); options
    ggmlrun does not model are named on stderr."""
    from ggmlrun.core import engine

    from ggmlrun import visual
    from ggmlrun.core.observe.occupancy import occupancy

    from ggmlrun.cli import llama_tail

    cmd = llama_tail.tail_command()
    if cmd is not None:
        graph, model_kw, overrides = llama_tail.apply_command(cmd, graph, model_kw, overrides,
                                                              own={}, backends_file=backends_file)
    elif graph is None:
        raise click.UsageError("Missing argument 'GRAPH'.")
    model = _model_input(graph, backends_file, model_kw, ggml, policy, overrides,
                         this_machine=True)
    if cmd is not None and not model:
        raise InputError("a llama.cpp command after -- runs a model: a GGUF file or a model "
                         "card, not a graph file", file=str(graph))
    if model:
        return _measure_model(model, as_json, cmd)
    phases = phase_timer(show_progress)
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
        report.print_tables(stdout(), report.summary_table(summary),
                            report.measure_table(memory, f"memory of {g.name}", fit))
        stdout().print(report.host_line(fit), markup=False, highlight=False)
        for f in layer_fits:
            stdout().print(report.layer_fit_line(f, overrides.op_offload), markup=False,
                         highlight=False)
        visual.print_occupancy(stdout(), occupancy(sched, plan_), planner)
        phases.report()
    if not layer_fits:
        _raise_unless_fits(sched, memory, fit)
        return
    from ggmlrun.core.memory.fits import host_failure_message

    # --fit answers for the devices, whose plan may be over them; the host is not moved by it
    worst = next((f for f in layer_fits if not f.base_fits), None)
    if worst is not None:
        raise CapacityError(f"{worst.device} is over its memory even with no layer on it")
    host = host_failure_message(sched, fit)
    if host:
        raise CapacityError(host, file=str(sched.graph.path) if sched.graph.path else None)


def _layers_that_fit(graph, sched, policy: str, planner: str):
    from ggmlrun.core import engine

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
              help="Write every output, by name, to this .npz (atomically); default: none.")
@click.option("--repeat", type=click.IntRange(min=1, max=MAX_REPEAT), default=1,
              show_default=True, help="Compute N times after one plan.")
@click.option("--check", is_flag=True, help="Compare outputs with the plain NumPy reference evaluator.")
@click.option("--trace", "trace_file", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE.json", help="Write a Chrome/Perfetto trace of every run (atomically); "
              "open it in ui.perfetto.dev or chrome://tracing. Default: none.")
@click.option("--profile", "show_profile", is_flag=True,
              help="Time per op and per copy route (with --json: a `profile` key).")
@click.option("--profile-by", type=click.Choice(["op", "node", "shape"]), default="op",
              show_default=True, help="With --profile: group computes by op, node, or op and shape.")
@click.option("--sort", "profile_sort", type=click.Choice(["total", "mean", "calls", "name"]),
              default="total", show_default=True, help="With --profile: the order of its rows.")
@click.option("--top", "profile_top", type=click.IntRange(min=1), metavar="N",
              help="With --profile: only the first N rows; default all.")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Untimed runs before the timed ones (caches, BLAS start-up).")
@click.option("--threads", type=click.IntRange(min=1), metavar="N",
              help="BLAS threads for the run (capped at the machine's cores); overrides the CPU "
                   "backend's `threads`. Default: the backend's, else BLAS's own.")
@POLICY
@PLANNER
@GGML
@click.option("--tokens", metavar="1,2,3", help="[models] Token ids evaluated as one batch; the "
              "output is the last token's logits, `result_output`. No default: run MODEL "
              "needs it.")
@click.option("--download", is_flag=True, default=False,
              help="[models] A remote model's weights downloaded whole (hf://: into the Hugging "
                   "Face cache; a URL: into ggmlrun's), then run; without it run refuses one.")
@model_options()
@placement_options
@DEBUG
def run(graph, backends_file, as_json, input_specs, out_file, repeat, check, policy, planner,
        trace_file, show_profile, profile_by, profile_sort, profile_top, warmup, ggml, tokens,
        download, overrides, show_progress, **model_kw):
    """Schedule, measure, allocate and compute; print splits, timings and outputs."""
    from ggmlrun.core import engine

    from ggmlrun.core.util import host

    from ggmlrun import visual

    model = _model_input(graph, backends_file, {**model_kw, "tokens": tokens,
                                                 "download": download}, ggml, policy, overrides)
    if model:
        source = click.get_current_context().get_parameter_source
        return _run_model(model, tokens, as_json, out_file, dict(
            repeat=repeat, warmup=warmup, trace_file=trace_file, show_profile=show_profile,
            profile_by=profile_by, profile_sort=profile_sort, profile_top=profile_top,
            check=check, input_specs=input_specs,
            planner=source("planner") == click.core.ParameterSource.COMMANDLINE))
    phases = phase_timer(show_progress)
    request = engine.RunRequest(graph_path=graph, backends_path=backends_file,
                                input_specs=input_specs, repeat=repeat, check=check,
                                policy=policy, planner=planner, trace_path=trace_file,
                                out_path=out_file, profile=show_profile, profile_by=profile_by,
                                profile_sort=profile_sort, profile_top=profile_top, ggml=ggml,
                                overrides=overrides, warmup=warmup)
    outcome = engine.run_pipeline(request, phases=phases,
                                  progress=lambda: visual.run_progress(stderr(), repeat))
    sched, result, errors, prof = outcome.schedule, outcome.result, outcome.errors, outcome.profile
    if trace_file:
        click.echo(f"wrote {trace_file}", err=True)
    if out_file:
        click.echo(f"wrote {out_file}", err=True)
    payload = {} if as_json else None
    fit, summary = _fit_and_summary(sched, outcome.memory, phases, payload)
    cpu_threads = sched.backends[-1].threads
    threads = str(cpu_threads) if cpu_threads else f"default ({host.cores()} cores)"
    load = host.load_average()
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
        report.print_tables(stdout(), report.summary_table(summary, fit), report.split_table(sched))
        stdout().print(report.timing_header(result, warmup, threads, load), markup=False,
                     highlight=False)
        report.print_tables(stdout(), report.timing_table(result),
                            report.outputs_table(outcome.summaries, errors))
        if prof is not None:
            report.print_tables(stdout(), *visual.profile_tables(prof, profile_by))
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
    from ggmlrun.core import engine

    import shutil

    from ggmlrun.core.observe.dot import RENDERED, render, to_dot
    from ggmlrun.core.run.results import write_atomic, write_text
    from ggmlrun.core.util.outputs import check_output

    if out_file is not None:
        check_output(out_file, "--out", inputs=engine.files_read(graph, backends_file))
    model = _model_input(graph, backends_file, model_kw, ggml, policy)
    refuse_draft(model, "dot")
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
        if dot_file.exists() and not _our_fallback(dot_file):
            from ggmlrun.core.util.errors import RunError

            raise RunError(f"Graphviz `dot` is not on PATH, so no {fmt.upper()}; the DOT text "
                           f"would go to {dot_file}, which exists and is left as it is: remove "
                           f"it, or name the DOT file with -o FILE.dot (apt install graphviz "
                           f"for {fmt.upper()})")
        click.echo(f"ggmlrun: warning: Graphviz `dot` is not on PATH, so no {fmt.upper()}; "
                   f"writing DOT to {dot_file} (render it with: dot -T{fmt} {dot_file} "
                   f"-o {out_file})", err=True)
        out_file = check_output(dot_file, "--out", inputs=engine.files_read(graph, backends_file))
        text = FALLBACK_MARK + text     # so that the next run may write over it, and only it
    write_text(out_file, text)
    click.echo(f"wrote {out_file}", err=True)


# the first line of the DOT text `dot -o X.svg` writes to X.dot when Graphviz is missing
FALLBACK_MARK = "// ggmlrun dot: Graphviz was not on PATH; this is the DOT text to render\n"


def _our_fallback(path: Path) -> bool:
    """Whether `path` is a DOT file an earlier `dot -o` wrote in place of a picture (its first
    line says so): that one is ours to replace; any other file is the user's and is kept."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(FALLBACK_MARK)) == FALLBACK_MARK.encode()
    except OSError:
        return False
