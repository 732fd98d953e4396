"""One verdict for every command: an option or a hyperparameter that a command cannot honour
is refused the same way (exit 2, one line) by validate, measure, fit and run, never accepted by
one and crashing another."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from clikit import invoke
from ggufkit import layout, patch

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
COMMANDS = [("measure",), ("fit", "--gpu", "1GiB", "--ram", "4GiB"), ("run", "--tokens", "1,2")]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_kv_block_that_divides_no_sliding_head_is_refused_by_every_command(command):
    """gemma4's sliding layers have heads 16 wide: q8_0's 32-value blocks do not divide them."""
    name, *rest = command
    code, _, err = invoke(name, MODELS / "tiny-gemma4-f16.gguf", *rest, "--flash-attn", "on",
                          "--kv-type", "q8_0")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "head size 16" in err


def patched(tmp_path, model: str, key: str, fmt: str, value) -> Path:
    raw = (MODELS / model).read_bytes()
    _, at_type, _ = layout(raw).keys[key]
    path = tmp_path / model
    path.write_bytes(patch(raw, at_type + 4, fmt, *value))
    return path


@pytest.mark.parametrize("command", [("validate",)] + COMMANDS, ids=lambda c: c[0])
def test_rope_sections_all_zero_are_refused_by_every_command(tmp_path, command):
    raw = (MODELS / "tiny-qwen35-f16.gguf").read_bytes()
    _, at_type, _ = layout(raw).keys["qwen35.rope.dimension_sections"]
    count = struct.unpack_from("<Q", raw, at_type + 8)[0]          # array: etype, count, items
    path = tmp_path / "m.gguf"
    path.write_bytes(patch(raw, at_type + 16, f"<{count}I", *([0] * count)))
    name, *rest = command
    code, _, err = invoke(name, path, *rest)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "dimension_sections" in err


@pytest.mark.parametrize("command", [("validate",)] + COMMANDS, ids=lambda c: c[0])
def test_no_shared_expert_is_refused_by_every_command(tmp_path, command):
    path = patched(tmp_path, "tiny-glm4moe-f16.gguf", "glm4moe.expert_shared_count", "<I", [0])
    name, *rest = command
    code, _, err = invoke(name, path, *rest)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "expert_shared_count" in err
