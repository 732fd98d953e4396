"""Never a non-finite answer: a model run whose logits hold a NaN or an infinity exits 1 with
one line naming the likely cause, and prints or writes no answer."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.models.load import load_model

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "models" / "tiny-llama-q8_0.gguf"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_norm_weight_is_named_and_no_answer_is_given(tmp_path, value):
    model = tmp_path / "m.gguf"
    shutil.copy(MODEL, model)
    info = load_model(model).tensors["blk.0.attn_norm.weight"]
    with open(model, "r+b") as handle:
        handle.seek(info.offset + 4 * 5)
        handle.write(struct.pack("<f", value))
    out = tmp_path / "o.npz"
    code, stdout, err = invoke("run", model, "--tokens", "1,2,3", "--out", out)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "blk.0.attn_norm.weight" in err and "logits" in err
    assert "top" not in stdout and not out.exists()


def test_a_non_finite_block_scale_is_named(tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copy(MODEL, model)
    info = load_model(model).tensors["blk.0.attn_q.weight"]          # q8_0: 34-byte blocks
    with open(model, "r+b") as handle:
        handle.seek(info.offset + 34 * 3)
        handle.write(struct.pack("<H", 0x7C00))                      # f16 +inf as the scale
    code, _, err = invoke("run", model, "--tokens", "1,2,3")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "blk.0.attn_q.weight" in err


def test_finite_logits_still_answer(tmp_path):
    code, stdout, _ = invoke("run", MODEL, "--tokens", "1,2,3")
    assert code == 0 and "top 5 tokens" in stdout
