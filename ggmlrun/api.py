"""ggmlrun as a library, for the tools that embed it (a launcher, a model picker, a server
front end): `measure` and `fit` answer as the commands do and return the record their `--json`
prints, the same dict, so a tool reads one format whether it runs the command or imports it.

The options are the option table's names (models/options/table.py, the ModelOptions fields:
`ctx=8192, flash_attn=True, kv_type="q8_0", overrides=["ffn_.*=CPU"], tensor_split=(3, 1)`,
and a draft model, `model_draft="draft.gguf"`, read as MODEL is),
each taking a Python value or the text the command line takes ("on", "3,1"). The devices are
given as on the command line: `gpu="24GiB,12GiB"` (or a list of sizes), `ram="64GiB"`,
`backends=PATH` (a backends file). Without `gpu` or `backends` the devices are this machine's
GPUs with their free memory now (core/util/devices.py; none found: the CPU alone), and without
`ram` (and without a backends file that gives it) the host is this machine's RAM, as for the
commands. Bad input is an InputError with the
command line's message; what does not fit is an answer (`"fits": false`), not an error.

Nothing is imported until a function is called: `import ggmlrun` stays as cheap as the
command line's start (tests/test_startup.py).
"""

from __future__ import annotations

import os


def measure(model, *, backends=None, gpu=None, ram=None, **options) -> dict:
    """`ggmlrun measure MODEL --json`: llama.cpp's buffers for the model with these options on
    these devices, whether they fit, and the llama.cpp line that asks for them."""
    from ggmlrun.cli.model_commands import measure_answer

    return _as_json(measure_answer(_input(model, backends, gpu, ram, options))[-1])


def fit(model, *, ctx=None, min_ctx: int = 4096, margin: str | None = None, backends=None,
        gpu=None, ram=None, **options) -> dict:
    """`ggmlrun fit MODEL --json`: the most layers, and with `ctx="auto"` the longest
    context, that fit; `min_ctx` and `margin` as fit's --min-ctx and --margin."""
    from ggmlrun.cli.fit_command import fit_answer, fit_context
    from ggmlrun.core.util.errors import InputError
    from ggmlrun.models.options.table import BY_NAME

    if "ngl" in options:
        raise InputError("fit chooses ngl itself (the most layers that fit); measure takes ngl")
    try:
        fit_ctx = fit_context(ctx)
        min_ctx = BY_NAME["ctx"].kind.check(min_ctx)
    except ValueError as err:
        raise InputError(f"ctx={ctx!r}, min_ctx={min_ctx!r}: {err}") from None
    model_input = _input(model, backends, gpu, ram, options)
    return _as_json(fit_answer(model_input, fit_ctx, min_ctx, margin)[-1])


def _input(model, backends, gpu, ram, options: dict):
    """(model, backends, options) as the command line makes them: the options checked by the
    table, the devices planned as --backends/--gpu/--ram plan them."""
    from ggmlrun.cli.model_options import model_input
    from ggmlrun.core.util.errors import InputError
    from ggmlrun.models.options.table import check_values

    try:
        values = check_values(options)
    except ValueError as err:
        raise InputError(str(err)) from None
    devices = {"gpu_sizes": _sizes(gpu), "ram_size": _sizes(ram)}
    return model_input(_loaded(model), backends, devices, values)


def _loaded(model):
    """A path is read as the commands read MODEL; anything else is taken as a model already
    loaded (ggmlrun.models.load.load_model's)."""
    if not isinstance(model, (str, os.PathLike)):
        return model
    from pathlib import Path

    from ggmlrun.core.util.errors import InputError
    from ggmlrun.core.util.inputs import open_regular
    from ggmlrun.models.load import load_model

    open_regular(model, "model", limit=None).close()
    loaded = load_model(Path(model))
    if loaded is None:
        raise InputError("not a model: a GGUF file (by its GGUF magic) or a model card (a YAML "
                         "file with `architecture:`)", file=str(model))
    return loaded


def _sizes(value):
    """--gpu/--ram as text: a size, or a list of sizes (text, or bytes as integers)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value}B"
    return ",".join(str(v) if isinstance(v, str) else f"{v}B" for v in value)


def _as_json(record: dict) -> dict:
    """The record exactly as `--json` prints it (tuples as lists, NaN as "nan")."""
    import json

    from ggmlrun.core.util.strict_json import strict_json

    return json.loads(strict_json(record))
