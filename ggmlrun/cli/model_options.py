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
from ggmlrun.models.options.table import OPTIONS


# --- model options (GGUF files and model cards; SPEC section 5) --------------------------------
class _TableType(click.ParamType):
    """A value of the option table's kind (models/options/table.py), read as the table reads
    it: the error is the table's, under click's name of the option."""

    def __init__(self, option):
        self.option = option
        self.name = option.kind.metavar

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.option.kind.read(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


def _click_option(option):
    """One table row as a click option; its help says the llama.cpp spelling and default."""
    dest = option.dest or option.name
    if not option.kind.takes_value:
        return click.option(option.flag, dest, is_flag=True, default=False,
                            help=option.help_text())
    return click.option(option.flag, *option.aliases, dest, type=_TableType(option),
                        multiple=option.kind.repeatable,
                        default=() if option.kind.repeatable else None,
                        metavar=option.kind.metavar or None, help=option.help_text())


def _table_options() -> dict:
    return {option.dest or option.name: (option.flag, _click_option(option))
            for option in OPTIONS if option.flag and not option.shared}


# what the table cannot say: the devices (not llama.cpp options but the machine) and how a
# remote model is fetched
_DEVICES = {
    "gpu_sizes": ("--gpu", click.option(
        "--gpu", "gpu_sizes", metavar="SIZE[,SIZE...]", default=None,
        help="[models] The devices, one per size (e.g. 24GiB,12GiB), named GPU0, GPU1, ... "
             "with the sim kind's defaults; instead of --backends. Default: SIM0 of 16GiB.")),
    "ram_size": ("--ram", click.option(
        "--ram", "ram_size", metavar="SIZE", default=None,
        help="[models] The host's memory (the CPU backend's), e.g. 32GiB; default the "
             "backends file's, else this machine's RAM.")),
    # a remote model's headers (models/gguf/cache.py): not a llama.cpp option either
    "refresh": ("--refresh", click.option(
        "--refresh", is_flag=True, default=False,
        help="[models] A remote model's headers (URL, hf://) fetched again, not taken from "
             "the header cache.")),
}
_ALL = {**_table_options(), **_DEVICES}
_SWITCHES = {o.dest or o.name for o in OPTIONS if not o.kind.takes_value} | {"refresh",
                                                                             "download"}
_SINGLE = {o.dest or o.name for o in OPTIONS if not o.kind.repeatable}   # () is a value
MODEL_OPTIONS = {key: option for key, (_, option) in _ALL.items()}
MODEL_FLAGS = {**{key: flag for key, (flag, _) in _ALL.items()}, "tokens": "--tokens",
               "download": "--download"}


def model_options(skip=()):
    """Every model option (SPEC section 5), defined once, on any command that takes a model."""
    def apply(func):
        for key, option in reversed(MODEL_OPTIONS.items()):
            if key not in skip:
                func = option(func)
        return func
    return apply


def _model_input(path: Path, backends_file: Path | None, model_kw: dict, ggml: str = "0.25",
                 policy: str = "ggml", overrides=None, this_machine: bool = False):
    """(model, backends, options) when GRAPH is a GGUF file or a card; None for a graph file,
    which must then not carry model options. A model is placed as llama.cpp places it, so
    only ggml's policy applies."""
    from ggmlrun.cli.fetching import load_named_model
    from ggmlrun.models.options.table import given

    model = load_named_model(path, model_kw)
    if model is not None and model.path:
        from ggmlrun.core.util.inputs import note_read

        note_read(model.path)  # the GGUF (every shard) or card: an input no output may replace
        for shard in model.files:
            note_read(shard.path)
    if model is None:
        flags = [flag for key, flag in MODEL_FLAGS.items()
                 if given(model_kw.get(key), key not in _SWITCHES, key not in _SINGLE)]
        if flags:
            raise InputError(f"{flags[0]} applies to models (GGUF files and model cards), not "
                             f"to graph files", file=str(path))
        return None
    if policy != "ggml":
        raise InputError(f"--policy {policy} applies to graph files; a model is placed as "
                         f"llama.cpp places it", file=str(path))
    from ggmlrun.models.options.table import from_cli

    backends, sources, machine = planned_backends(backends_file, model_kw, overrides,
                                                  this_machine)
    if overrides is not None:
        if overrides.remap:
            raise InputError("--remap applies to graph files; place a model's weights with "
                             "--ngl or --override-tensor", file=str(path))
        if overrides.offload_min_batch is not None:
            raise InputError("--offload-min-batch applies to graph files; llama.cpp's devices "
                             "offload an op from a batch of 32 (--no-op-offload turns it off)",
                             file=str(path))
        model_kw = {**model_kw, "no_op_offload": not overrides.op_offload}
    setup = _model_setup(model, backends, from_cli({**model_kw, "ggml": ggml}))
    return ModelInput((model, *setup), sources, machine,
                      draft=load_draft(model, setup[1], model_kw))


def model_input(model, backends_file, model_kw: dict, values: dict, overrides=None):
    """A loaded model, the backends it is planned for (--gpu/--ram in `model_kw`, a
    backends file, else this machine's GPUs as `measure` and `fit` find them) and its
    options from checked values by name: the Python API's way in."""
    backends, sources, machine = planned_backends(backends_file, model_kw, overrides,
                                                  this_machine=True)
    setup = _model_setup(model, backends, values)
    return ModelInput((model, *setup), sources, machine,
                      draft=load_draft(model, setup[1], model_kw))


def draft_of(model_input):
    """The draft of a model input: loaded with it, or, for an input made another way whose
    options name one (a llama.cpp line's -md), loaded now; None without -md."""
    draft = getattr(model_input, "draft", None)
    model, _, opts = model_input
    if draft is None and opts.model_draft is not None:
        draft = load_draft(model, opts, {})
        if isinstance(model_input, ModelInput):
            model_input.draft = draft
    return draft


def refuse_draft(model_input, command: str) -> None:
    """plan, dot and run show the target's own graph: a draft (a second context of its own)
    would be left out of what they say, so -md is refused there, not ignored."""
    if model_input is not None and model_input[2].model_draft is not None:
        raise InputError(f"--model-draft applies to measure and fit (both models' buffers); "
                         f"{command} takes the target alone: leave -md out")


def load_draft(model, opts, model_kw: dict):
    """The draft model -md names (None without -md), read as MODEL is (a path, a URL,
    hf://), refused unless its vocabulary matches the target's (models/draft.py)."""
    from ggmlrun.cli.fetching import load_named_model
    from ggmlrun.core.util.inputs import note_read, open_regular
    from ggmlrun.models.draft import check_compatible, check_draft_options, has_draft
    from ggmlrun.models.gguf.source import is_remote

    check_draft_options(opts)
    if not has_draft(opts):
        return None
    if "tokens" in model_kw:
        refuse_draft((model, None, opts), "run")
    name = opts.model_draft if is_remote(opts.model_draft) else Path(opts.model_draft)
    if isinstance(name, Path):
        open_regular(name, "draft model", limit=None).close()
    draft = load_named_model(name, {"refresh": model_kw.get("refresh")})
    if draft is None:
        raise InputError("--model-draft: not a model: a GGUF file (by its GGUF magic) or a "
                         "model card (a YAML file with `architecture:`)", file=str(name))
    for shard in draft.files:
        note_read(shard.path)
    check_compatible(model, draft)
    return draft


class ModelInput(tuple):
    """(model, backends, options), where each backend's memory size came from, and what was
    read of this machine's GPUs (core/util/devices.py's Found; None when not read)."""

    def __new__(cls, items, sources: dict[str, str], machine=None, draft=None):
        self = super().__new__(cls, items)
        self.sources = sources
        self.machine = machine
        self.draft = draft          # the draft model (-md), loaded; None without one
        return self

def _model_setup(model, backends, values: dict):
    """The backends and ModelOptions from option values by name (table.from_cli's), checked
    against the backends: -ot's backend names, one -ts proportion per device."""
    from ggmlrun.core.backends.spec import default_backends
    from ggmlrun.models.options.table import make_options

    backends = backends or default_backends()
    names = [b.name for b in backends]
    devices = [b for b in backends if b.kind != "cpu"]
    for pattern, backend in values.get("overrides") or ():
        if backend not in names:
            raise InputError(f"--override-tensor {pattern}={backend}: no backend '{backend}'; "
                             f"backends: {', '.join(names)}")
    for name in values.get("devices_draft") or ():
        if name not in names[:-1]:
            raise InputError(f"--device-draft {','.join(values['devices_draft'])}: no device "
                             f"'{name}'; devices: {', '.join(names[:-1]) or 'none'}")
    split = values.get("tensor_split")
    if split is not None and len(split) != len(devices):
        raise InputError(f"--tensor-split has {len(split)} proportions, one per device, but "
                         f"there are {len(devices)} devices ({', '.join(d.name for d in devices) or 'none'})")
    warn_past_training(model, values.get("ctx"))
    warn_without_experts(model, values)
    return backends, make_options(values)


def warn_without_experts(model, values: dict) -> None:
    """--cpu-moe / --n-cpu-moe on a model without experts: llama.cpp takes them (their -ot
    rules match no tensor) and so does ggmlrun, but they move nothing, which a user who
    typed them would want to know."""
    if model.hparams.n_expert:
        return
    for name, flag in (("cpu_moe", "--cpu-moe"), ("n_cpu_moe", "--n-cpu-moe")):
        if values.get(name):
            click.echo(f"ggmlrun: warning: {flag} moves nothing: {model.name} is a dense model "
                       f"(no expert tensors); llama.cpp accepts it the same", err=True)


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
    for line in report.planned_for_lines(backends, model_input.sources, stdout().width,
                                         model_input.machine):
        stdout().print(line, markup=False, highlight=False, soft_wrap=True)


def planned_for_dict(model_input) -> dict:
    _, backends, _ = model_input
    return report.planned_for_dict(backends, model_input.sources, model_input.machine)


def llama_model_words(model_file) -> list[str]:
    """-m PATH, -hf OWNER/REPO:QUANT, -mu URL: the model as the line to paste names it (a
    card names no file: nothing)."""
    from ggmlrun.models.options.command_line import model_words

    return model_words(model_file.source or str(model_file.path or ""),
                       local_gguf=model_file.kv is not None)


def print_model_figures(model_input, table, backends, no_mmap: bool, last_line: str,
                        draft=None, without_draft=None, growth: dict | None = None) -> None:
    """The text report of measure MODEL and fit: where the sizes came from, the figures'
    table, each backend's memory bar, the host's lines (what is taken at start, then
    llama-server's growth: `growth`, the record's host_growth), the draft's share (`draft`:
    its ModelMeasure), and the command's own last line."""
    from ggmlrun import visual

    print_planned_for(model_input)
    report.print_tables(stdout(), table)
    visual.print_memory_bars(stdout(), report.memory_bars(backends))
    for line in report.host_lines(backends, no_mmap, stdout().width):
        click.echo(line)
    for line in report.host_growth_lines(backends, growth, stdout().width):
        click.echo(line)
    if draft is not None:
        for line in report.draft_lines(draft_of(model_input).name, draft, stdout().width,
                                       without_draft):
            click.echo(line)
    click.echo(last_line)


def host_growth(model_input, opts, ctx: int, free_bytes: int) -> dict:
    """The record's `host_growth`: llama-server's prompt cache and context checkpoints at
    context `ctx` (llama-cli's too: it runs the same server with one slot), with a warning on
    stderr when these upper bounds overrun the host's `free_bytes` left after start (a
    warning: the server starts, and grows into them only while it serves)."""
    from ggmlrun.models.memory.host_share import server_growth

    record = report.host_growth_dict(server_growth(model_input[0].hparams, opts, ctx),
                                     free_bytes)
    warning = report.host_growth_warning(record)
    if warning:
        click.echo(f"ggmlrun: warning: {warning}", err=True)
    return record
