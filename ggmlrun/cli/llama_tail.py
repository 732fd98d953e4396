"""`fit`/`measure [MODEL] [OPTIONS] -- llama-server ARGS...`: the answer for a llama.cpp
command line as the user runs it (SPEC section 5). The words after `--` are read by
models/options/llama_command.py; here they become the command's own values: the model (-m,
-hf), the model options, and for `fit` how llama.cpp's --fit runs (what it may choose, its
targets, its smallest context). An option given on both sides of `--` is refused, whatever the
values; every option llama.cpp takes that ggmlrun does not model is named on stderr, one line,
and in the JSON's `unmodelled`.
"""

from __future__ import annotations

import dataclasses
import re

import click
from click.core import ParameterSource

from ggmlrun.core.util.errors import InputError


class TailCommand(click.Command):
    """A command whose words after the first `--` are a llama.cpp command line, kept whole in
    ctx.meta["llama_tail"] (click would read them as arguments)."""

    def parse_args(self, ctx, args):
        if "--" in args:
            i = args.index("--")
            ctx.meta["llama_tail"] = list(args[i + 1:])
            args = args[:i]
        return super().parse_args(ctx, args)


def tail_command():
    """The llama.cpp command after `--`, read; None without one. Exit 2 for what llama.cpp
    would refuse."""
    from ggmlrun.models.options.llama_command import read_command

    ctx = click.get_current_context()
    words = ctx.meta.get("llama_tail")
    if words is None:
        return None
    try:
        return read_command(words)
    except ValueError as err:
        raise InputError(str(err)) from None


def _given(name: str) -> bool:
    source = click.get_current_context().get_parameter_source(name)
    return source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _conflict(ours: str, theirs: str) -> None:
    raise InputError(f"{ours} (before --) and {theirs} (in the llama.cpp command) set the "
                     f"same thing: give it once")


def apply_command(cmd, model_path, model_kw: dict, overrides, *, own: dict[str, str],
                  backends_file=None):
    """The model path and click values with the command's in them. `own`: the command's own
    click parameters (one, or a tuple) that a llama.cpp option sets (fit: ctx -> fit_ctx,
    ...), by command key, for the conflicts; the caller reads those values from `cmd`."""
    from ggmlrun.models.options.table import BY_NAME

    if cmd.model is not None and model_path is not None:
        _conflict("MODEL", cmd.model_words)
    if cmd.model is None and model_path is None:
        raise InputError(f"no model: give MODEL before -- or -m PATH / -hf OWNER/REPO[:QUANT] "
                         f"in the {cmd.tool} command")
    written = dict(cmd.written)
    if cmd.ctx_train:
        written["ctx"] = "-c 0"
    theirs_of = {"fit_target": "--fit-target" if cmd.fit_target is not None else None,
                 "fit_ctx": "--fit-ctx" if cmd.fit_ctx is not None else None}
    for key, params in own.items():
        theirs = theirs_of[key] if key in theirs_of else written.get(key)
        for param in (params,) if isinstance(params, str) else params:
            if theirs and _given(param):
                _conflict(_flag(param), theirs)
    if cmd.ctx_train and "ctx" not in own and _given("ctx_size"):
        _conflict("--ctx", "-c 0")
    kw = dict(model_kw)
    for name, value in cmd.fields.items():
        option = BY_NAME[name]
        if name in own or name == "rpc":          # rpc: check_rpc's
            continue
        param = option.dest or option.name
        clashing = [param] + [o.dest or o.name for o in BY_NAME.values() if name in o.sets]
        for p in clashing:
            if _given(p):
                _conflict(_flag(p), written[name])
        if not option.flag:                       # no way in through the command's options
            cmd.unmodelled.append(written[name])
        elif name == "op_offload":
            overrides = dataclasses.replace(overrides, op_offload=value)
        elif name == "overrides":
            kw[param] = _device_names(value, backends_file, model_kw, overrides)
        elif option.kind.takes_value:
            kw[param] = value
        else:
            kw[param] = value != option.default
    if cmd.tool == "llama-cli" and "parallel" not in cmd.fields and not _given("parallel"):
        kw["parallel"] = 1                        # llama-cli's -np default (llama-server: auto)
    return model_path if cmd.model is None else cmd.model, kw, overrides



_LLAMA_DEVICE = re.compile(r"^(CUDA|Vulkan|ROCm|SYCL|MUSA|CANN|OpenCL)(\d+)$|^Metal$")


def _device_names(rules, backends_file, model_kw: dict, overrides):
    """-ot's buffer names as llama.cpp spells them (CUDA1, Vulkan0, Metal: its backend's name
    and the device's index) read as the devices planned for, in order (GPU1, ...), with a
    note; a name the devices do not have is left for the usual error."""
    if not any(_LLAMA_DEVICE.match(b) for _, b in rules):
        return rules
    from ggmlrun.cli.model_backends import planned_backends

    backends = planned_backends(backends_file, model_kw, overrides, this_machine=True)[0] or []
    names = {b.name for b in backends}
    devices = [b.name for b in backends if b.kind != "cpu"]
    out = []
    for pattern, backend in rules:
        match = _LLAMA_DEVICE.match(backend)
        index = int(match.group(2) or 0) if match else None
        if match and backend not in names and index < len(devices):
            click.echo(f"ggmlrun: note: -ot {pattern}={backend} read as {devices[index]} "
                       f"(device {index} planned for)", err=True)
            backend = devices[index]
        out.append((pattern, backend))
    return tuple(out)


def _flag(param: str) -> str:
    for p in click.get_current_context().command.params:
        if p.name == param:
            return p.opts[0] if p.opts else param.upper()
    return param


def check_rpc(cmd, backends) -> None:
    """--rpc HOST:PORT,...: the rpc-servers must be the devices planned for (a backends file
    naming them), since their memory is what the answer is about."""
    wanted = cmd.fields.get("rpc") or ()
    have = [getattr(b, "endpoint", None) for b in backends if b.kind == "rpc"]
    missing = [e for e in wanted if e not in have]
    if missing:
        raise InputError(f"--rpc {','.join(wanted)}: ggmlrun plans for the devices given, and "
                         f"none is the rpc-server {missing[0]}: give --backends FILE with a "
                         f"backend of kind rpc and `endpoint: {missing[0]}` (its memory)")


def warn_unmodelled(cmd) -> None:
    if cmd.unmodelled:
        click.echo(f"ggmlrun: warning: not modelled, the figures are without them: "
                   f"{', '.join(cmd.unmodelled)}", err=True)


def with_options(model_input, **changes):
    """The model input with its options changed (the command's -c 0, -ngl)."""
    from ggmlrun.cli.model_options import ModelInput

    model, backends, opts = model_input
    return ModelInput((model, backends, dataclasses.replace(opts, **changes)),
                      model_input.sources, model_input.machine,
                      getattr(model_input, "draft", None))
