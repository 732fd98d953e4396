"""SPEC section 4: with --json every outcome is exactly one JSON object on stdout, a failure
included ({"error": {"message", "exit"}}, the message on stderr too), and option errors are one
`ggmlrun: error:` line, never click's usage block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clikit import invoke

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "graphs" / "mlp.yaml"
MODEL = ROOT / "examples" / "models" / "tiny-llama-q8_0.gguf"


def _one_object(stdout: str) -> dict:
    data = json.loads(stdout)          # raises on a second object or trailing text
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("args, code", [
    (("validate", "no-such-file.yaml"), 2),
    (("plan", MLP, "--backends", "no-such-backends.yaml"), 2),
    (("measure", MODEL, "--ctx", "0"), 2),
    (("fit", "no-such-model.gguf"), 2),
    (("run", MLP, "--input", "x=missing.npy"), 2),
    (("plan", MLP, "--no-such-option"), 2),
])
def test_failure_is_one_error_object(args, code):
    exit_code, out, err = invoke(*args, "--json")
    assert exit_code == code
    data = _one_object(out)
    assert set(data) == {"error"}
    assert data["error"]["exit"] == code
    message = data["error"]["message"]
    assert message and f"ggmlrun: error: {message}" in err


def test_a_result_that_does_not_fit_stays_the_one_object():
    """measure prints its figures, then exits 1: the figures are the object, no second one."""
    exit_code, out, err = invoke("measure", MLP, "--memory", "SIM0=1", "--json")
    assert exit_code == 1
    data = _one_object(out)
    assert "backends" in data and "error" not in data
    assert "ggmlrun: error:" in err


def test_option_error_is_one_line_without_usage_block():
    exit_code, out, err = invoke("measure", MODEL, "--ctx", "0")
    assert exit_code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ggmlrun: error:")
    assert "--ctx" in lines[0] and "ggmlrun measure --help" in lines[0]


def test_success_prints_no_error_object():
    exit_code, out, _ = invoke("validate", MLP, "--json")
    assert exit_code == 0 and "error" not in _one_object(out)
