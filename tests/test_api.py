"""The Python API (ggmlrun.measure, ggmlrun.fit) answers as the command line does: for the
same inputs its record is the one `--json` prints, on every bundled tiny model and card,
with option sets drawn from the option table; bad input is an InputError."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import ggmlrun
from clikit import invoke
from ggmlrun.models.load import load_model
from ggmlrun.models.options.table import BY_NAME, check_values
from optionkit import random_options

ROOT = Path(__file__).resolve().parent.parent
# the API and the commands share measure_answer / fit_answer: one model per kind of memory
# (dense, iSWA, hybrid, MLA, experts on MXFP4) and cards of both kinds is every distinct path
MODELS = [ROOT / "examples" / "models" / f"tiny-{name}.gguf" for name in (
    "llama-q8_0", "gemma3-f16", "qwen35moe-f16", "deepseek2-f16", "gpt-oss-mxfp4")]
CARDS = sorted((ROOT / "ggmlrun" / "models" / "cards").glob("*.yaml"))[::4]
DEVICES = {"gpu": "2GiB,1GiB", "ram": "64GiB"}         # never this machine's RAM
BACKENDS = ("GPU0", "GPU1", "CPU")
# a quantized cache needs flash attention and a head size its blocks divide: measured apart
# (tests/test_kv_q8_0.py); the cards' options stay small so a measure takes a moment
SKIP = ("type_k", "type_v")
# a draft only a tiny model's vocabulary matches: measured with one in tests/test_draft.py
SKIP += ("model_draft", "ngl_draft", "ctx_draft", "type_k_draft", "type_v_draft",
         "devices_draft")


def _cli_args(values: dict) -> list[str]:
    """The drawn options as the command line's flags, written as the table writes values."""
    args = []
    for name, value in check_values(values).items():
        option = BY_NAME[name]
        if not option.kind.takes_value:         # a switch's flag turns it from its default
            args += [option.flag] if value != option.default else []
        elif option.kind.repeatable:
            args += [w for rule in value for w in (option.flag, option.kind.write(rule))]
        else:
            args += [option.flag, option.kind.write(value)]
    return args


def _cli(command: str, path, values: dict, *extra) -> dict:
    code, out, err = invoke(command, path, "--json", "--gpu", DEVICES["gpu"], "--ram",
                            DEVICES["ram"], *_cli_args(values), *extra)
    assert code in (0, 1) and out, err         # 1: "does not fit", still a record
    return json.loads(out)


def _drawn(path: Path, skip=()) -> dict:
    values = random_options(random.Random(path.name), backends=BACKENDS, skip=SKIP + skip)
    if path.suffix == ".yaml":
        values["ctx"] = min(int(check_values({"ctx": values.get("ctx", 256)})["ctx"]), 512)
    return values


@pytest.mark.parametrize("path", MODELS + CARDS, ids=lambda p: p.name)
def test_measure_is_the_commands_json(path):
    values = _drawn(path)
    assert ggmlrun.measure(path, **DEVICES, **values) == _cli("measure", path, values)


@pytest.mark.parametrize("path", MODELS[::2] + CARDS[2:4], ids=lambda p: p.name)
def test_fit_is_the_commands_json(path):
    """fit's record, less `seconds` (how long this run took)."""
    values = _drawn(path, skip=("ngl", "ctx"))
    record = ggmlrun.fit(path, **DEVICES, **values)
    expected = _cli("fit", path, values)
    assert record.pop("seconds") >= 0 and expected.pop("seconds") >= 0
    assert record == expected


def test_a_loaded_model_and_fits_options():
    """A model already loaded answers as its path does; fit's ctx='auto', min_ctx and margin
    are its --ctx auto, --min-ctx and --margin."""
    path = ROOT / "examples" / "models" / "tiny-qwen3moe-q8_0.gguf"
    model = load_model(path)
    assert ggmlrun.measure(model, **DEVICES, ctx=512) == ggmlrun.measure(path, **DEVICES,
                                                                         ctx=512)
    record = ggmlrun.fit(model, **DEVICES, ctx="auto", min_ctx=256, margin="0,1GiB")
    expected = _cli("fit", path, {}, "--ctx", "auto", "--min-ctx", "256", "--margin", "0,1GiB")
    assert record.pop("seconds") >= 0 and expected.pop("seconds") >= 0
    assert record == expected and record["options"]["ctx"] is None


@pytest.mark.parametrize("call,named", [
    (lambda p: ggmlrun.measure(p, ctxx=3), "ctxx"),
    (lambda p: ggmlrun.measure(p, ctx=0), "ctx"),
    (lambda p: ggmlrun.measure(p, flash_attn="maybe"), "flash_attn"),
    (lambda p: ggmlrun.measure(p, overrides=["ffn"]), "REGEX=BACKEND"),
    (lambda p: ggmlrun.measure(p, overrides=["ffn=GPU7"], **DEVICES), "GPU7"),
    (lambda p: ggmlrun.measure(p, tensor_split=(1, 2, 3), **DEVICES), "--tensor-split"),
    (lambda p: ggmlrun.measure(p, gpu="2GB", ram="1GiB"), "--gpu"),
    (lambda p: ggmlrun.measure(p.parent / "missing.gguf"), "no such file"),
    (lambda p: ggmlrun.fit(p, ngl=3), "ngl"),
    (lambda p: ggmlrun.fit(p, ctx="most"), "ctx"),
    (lambda p: ggmlrun.fit(p, margin="1GB", **DEVICES), "--margin"),
])
def test_bad_input_is_an_input_error(call, named):
    with pytest.raises(ggmlrun.InputError, match=named):
        call(ROOT / "examples" / "models" / "tiny-llama-q8_0.gguf")


def test_the_docs_example_runs():
    """docs/models.md's example of the API, as written."""
    text = (ROOT / "docs" / "models.md").read_text()
    section = text[text.index("### ggmlrun as a library"):]
    code = section[section.index("```python") + len("```python"):section.index("```\n", 10)]
    space: dict = {}
    exec(compile(code, "docs/models.md", "exec"), space)      # noqa: S102 - our own docs
    assert space["record"]["fits"] and space["answer"]["command"].startswith("-ngl ")
