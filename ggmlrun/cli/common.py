"""What every command shares: the consoles, the options defined once, the group, and
the fits check and summary that plan, measure and run print."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from ggmlrun import report
from ggmlrun.version import __version__
from ggmlrun.models.options.table import BY_NAME


@functools.cache
def stdout():
    """The console for data; made on first use, so a command that draws nothing never loads
    rich. Its width is COLUMNS when that is set (a terminal's, or `COLUMNS=80 ggmlrun ...` into
    a file), else the terminal's; piped output without COLUMNS gets a wide fixed width (160) so
    tables are not squeezed into 80 columns."""
    import os

    from rich.console import Console

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return Console(soft_wrap=False, width=int(columns))
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160)


@functools.cache
def stderr():
    """The console for diagnostics (phase times, progress), made on first use."""
    from rich.console import Console

    return Console(stderr=True)


def phase_timer(show_progress: bool):
    """The command's phase timer; stderr's rich console only where it will draw (a terminal,
    or --progress), so `validate` into a pipe never loads rich."""
    from ggmlrun import visual

    console = stderr() if show_progress or visual.is_terminal(sys.stderr) else None
    return visual.Phases(console, show_progress)

class _GraphArg(click.Path):
    """A local path, or a remote model's name kept as written (a URL, an hf:// name: a Path
    would collapse its `//`)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.startswith(("http://", "https://", "hf://")):
            return value
        return super().convert(value, param, ctx)


MODEL_ARG = _GraphArg(dir_okay=False, path_type=Path)
GRAPH = click.argument("graph", type=MODEL_ARG)
BACKENDS = click.option("--backends", "backends_file", type=click.Path(dir_okay=False, path_type=Path),
                        help="YAML file with a `backends:` list; overrides the graph's own. "
                             "Default: the graph's, else [SIM0 (sim, 16GiB), CPU].")
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


GGML = click.option("--ggml", "ggml", type=click.Choice(BY_NAME["ggml"].kind.values),
                    default=BY_NAME["ggml"].default, help=BY_NAME["ggml"].help_text())


_JSON_EMITTED = []


def emit_json(data: dict) -> None:
    """The command's one JSON object; remembered, so a failure after it (a run that does not
    fit prints its figures, then exits 1) adds no second object (SPEC section 4)."""
    from ggmlrun.core.util.strict_json import strict_json

    click.echo(strict_json(data, indent=2))
    _JSON_EMITTED.append(True)


def json_emitted() -> bool:
    return bool(_JSON_EMITTED)


def forget_json() -> None:
    """A new command in the same process (tests, programs calling main) starts afresh."""
    _JSON_EMITTED.clear()


def _prepare(graph_path: Path, backends_file: Path | None, policy: str = "ggml",
             overrides=None, phases=None, ggml: str | None = None):
    from ggmlrun.core import engine

    return engine.prepare(graph_path, backends_file, policy, ggml, overrides, phases)


def memory_size(text: str, option: str, sep: str = " ") -> int:
    """A memory size given on the command line. A bare number is bytes, but one under 1 MiB is
    surely a size without its unit (`--gpu 12` meaning 12 GiB): an error that suggests it."""
    from ggmlrun.core.frontend.sizes import SIZE_RE, parse_size
    from ggmlrun.core.util.errors import InputError

    text = str(text).strip()
    match = SIZE_RE.match(text)
    if match and not match.group(2) and float(match.group(1)) < 2**20:
        raise InputError(f"{option}{sep}{text}: {text} bytes is less than 1 MiB; give the unit, "
                         f"e.g. {option}{sep}{text}GiB (units: B, KiB, MiB, GiB, TiB)")
    try:
        return parse_size(text)
    except ValueError as err:
        raise InputError(f"{option}{sep}{text}: {err}") from None


def _check_memory_specs(specs) -> None:
    """--memory NAME=SIZE: a size without NAME= (the user means "my GPU has 12 GiB") gets the
    plain way to say it; a bare size under 1 MiB is refused as memory_size refuses it."""
    from ggmlrun.core.frontend.sizes import SIZE_RE
    from ggmlrun.core.util.errors import InputError

    for spec in specs:
        name, eq, size = spec.partition("=")
        if not eq:
            hint = (f"; for a model, --gpu {spec.strip()} says one GPU of that size (and --ram "
                    f"SIZE the host's memory)" if SIZE_RE.match(spec) else "")
            raise InputError(f"--memory {spec!r}: expected NAME=SIZE, e.g. SIM0=12GiB{hint}")
        memory_size(size, f"--memory {name.strip()}", sep="=")


def placement_options(func):
    """--memory, --remap, --no-op-offload, --offload-min-batch: "what if" without editing files,
    received by the command as one `overrides` argument; and --progress (phase times)."""
    @functools.wraps(func)
    def wrapper(*args, memory_specs, remap_specs, no_op_offload, offload_min_batch, **kwargs):
        from ggmlrun.core.frontend.overrides import parse

        _check_memory_specs(memory_specs)
        kwargs["overrides"] = parse(memory_specs, remap_specs, not no_op_offload,
                                    offload_min_batch, kwargs.pop("threads", None))
        return func(*args, **kwargs)

    options = [
        click.option("--memory", "memory_specs", multiple=True, metavar="NAME=SIZE",
                     help="Override a backend's memory (e.g. SIM0=4GiB); repeatable."),
        click.option("--remap", "remap_specs", multiple=True, metavar="NAME=NAME",
                     help="Move every tensor and pin of one backend to another, which drops the "
                          "first from the list (e.g. SIM0=CPU); repeatable. Graph files only "
                          "(a model's weights move with --ngl or --override-tensor)."),
        click.option("--no-op-offload", is_flag=True, help=BY_NAME["op_offload"].help_text()),
        click.option("--offload-min-batch", type=click.IntRange(min=1), metavar="N",
                     help="Batch from which op offload moves an op to a device (every device); "
                          "default each device's own (32). Graph files only."),
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
    from ggmlrun.core import engine

    engine.check_capacity(sched, memory, fit=fit)


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             invoke_without_command=True)
# the version from the package itself: asking the installed metadata (importlib.metadata,
# email, ...) is ~10 ms of a `--version` that should cost nothing
@click.version_option(version=__version__, package_name="ggmlrun")
@DEBUG
@click.pass_context
def cli(ctx):
    """See and run how a ggml compute graph is placed, sized and executed across devices."""
    if ctx.invoked_subcommand is None:       # bare `ggmlrun`: the help, and a clean exit
        click.echo(ctx.get_help())
        ctx.exit(0)
