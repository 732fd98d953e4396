"""What the GGUF fuzzer (tests/test_gguf_fuzz.py) and a sweep of hostile hyperparameters over
the newer architectures found, each as its minimal input: a bundled model with one key changed,
or a bundled card with one value changed. Each must be one error line and exit 2, or a run with
finite logits; never exit 1, NaN logits or a kernel's exception."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.clikit import invoke
from tests.ggufkit import kv_bytes, layout, rebuild

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
CARDS = ROOT / "ggmlrun" / "models" / "cards"


def with_key(tmp_path, model: str, key: str, value) -> Path:
    """The bundled model with `key` (under its architecture) set to `value`, kept in its
    stored type (FLOAT32 for a float, UINT32 for an int), or added when absent."""
    raw = (MODELS / f"{model}.gguf").read_bytes()
    lay = layout(raw)
    at = lay.keys["general.architecture"][1] + 4
    arch = raw[at + 8:at + 8 + struct.unpack_from("<Q", raw, at)[0]].decode()
    gtype, fmt = (6, "<f") if isinstance(value, float) else (4, "<I")
    full = f"{arch}.{key}"
    if full in lay.keys:
        at = lay.keys[full][1]
        assert struct.unpack_from("<i", raw, at)[0] == gtype
        data = bytearray(raw)
        struct.pack_into(fmt, data, at + 4, value)
        raw = bytes(data)
    else:
        raw = rebuild(raw, extra_kv=kv_bytes(full, gtype, struct.pack(fmt, value)))
    path = tmp_path / f"{model}.gguf"
    path.write_bytes(raw)
    return path


def one_error(code, err, *words):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("ggmlrun: error: "), err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize("model,key,value", [
    # a denormal base: base**(-2i/n) overflows float32, rope's angles and the logits NaN
    ("tiny-gpt-oss-mxfp4", "rope.freq_base", 1e-45),
    ("tiny-gemma3-f16", "rope.freq_base_swa", 1e-45),        # added: gemma3 reads it
    # 1/factor and 1/cap are infinite: NaN
    ("tiny-gpt-oss-f16", "rope.scaling.factor", 1e-45),
    ("tiny-gemma4moe-f16", "final_logit_softcapping", 1e-45),
    # cos and sin times 1e30: Q.K overflows float32
    ("tiny-phi3-f16", "rope.scaling.attn_factor", 1e30),
])
def test_a_float_that_would_make_the_logits_nan_is_refused(tmp_path, model, key, value):
    code, out, err = invoke("run", with_key(tmp_path, model, key, value), "--tokens", "1,2,3")
    one_error(code, err, key)


@pytest.mark.parametrize("model,key,value", [
    ("tiny-gemma3-f16", "final_logit_softcapping", 0.0),     # 0: no softcap
    ("tiny-gpt-oss-f16", "rope.freq_base", 1.0),             # the smallest base
    ("tiny-llama-f16", "rope.scaling.factor", 2.0**-20),
])
def test_the_edges_of_those_ranges_still_run(tmp_path, model, key, value):
    code, out, err = invoke("run", with_key(tmp_path, model, key, value), "--tokens", "1,2,3",
                            "--json")
    assert code == 0, err
    summary = json.loads(out)["outputs"]["result_output"]
    assert math.isfinite(summary["sum"]) and math.isfinite(summary["l2"])


def test_gemma4_full_layers_may_rotate_part_of_the_head(tmp_path):
    """rope.dimension_count under the head size: rope_freqs keeps a head's n_embd_head/2
    entries (llama.cpp's shape) and ggml reads the first n_rot/2 (its assert is ne[0] >=
    n_dims/2); the rope kernel broadcast all of them, a ValueError, exit 1."""
    path = with_key(tmp_path, "tiny-gemma4moe-f16", "rope.dimension_count", 8)
    code, out, err = invoke("run", path, "--tokens", "1,2,3", "--json")
    assert code == 0, err
    summary = json.loads(out)["outputs"]["result_output"]
    assert math.isfinite(summary["sum"]) and math.isfinite(summary["l2"])


def test_rope_reads_the_first_n_dims_half_of_longer_freq_factors():
    from tests.test_ops_llm import run

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 2, 16)).astype(np.float32)
    pos = np.array([0, 3, 17, 40], np.int32)
    factors = (1 + rng.random(8) * 3).astype(np.float32)
    params = {"n_dims": 8, "freq_base": 10000.0}
    longer = run("rope", [x, pos, factors], params)
    exact = run("rope", [x, pos, factors[:4].copy()], params)
    np.testing.assert_array_equal(longer, exact)


# --- cards: absurd values for the newer architectures' keys ---------------------------------
@pytest.mark.parametrize("card_name,changes,words", [
    ("gpt-oss-20b-mxfp4", {"n_expert": 0}, "expert_count"),
    ("gpt-oss-20b-mxfp4", {"n_expert": 2**31}, "n_expert"),
    ("gpt-oss-20b-mxfp4", {"n_expert_used": 33}, "expert_used_count 33"),
    ("gpt-oss-20b-mxfp4", {"n_swa": 0}, "sliding_window"),
    ("gpt-oss-20b-mxfp4", {"n_ff_exp": 0}, "expert_feed_forward_length"),
    ("gemma-4-26b-a4b-q4_k_m", {"n_expert_used": 129}, "expert_used_count 129"),
    ("gemma-4-26b-a4b-q4_k_m", {"n_ff_exp": 0}, "expert_feed_forward_length"),
    ("qwen3.5-35b-a3b-q4_k_m", {"n_ff_shexp": 2**31}, "n_ff_shexp"),
    ("qwen3.5-35b-a3b-q4_k_m", {"n_layer_nextn": 40}, "nextn_predict_layers 40"),
    # glm4moe: experts' width n_ff // n_expert_used = 0, and a shared width past 2**24
    ("glm-4.5-air-q4_k_m", {"n_ff_exp": 0, "n_ff": 3}, "feed-forward length must be positive"),
    ("glm-4.5-air-q4_k_m", {"n_ff_exp": 2**24, "n_expert_shared": 1024}, "expert_shared_count"),
])
def test_a_card_with_an_absurd_value_is_one_error_line(tmp_path, card_name, changes, words):
    card = yaml.safe_load((CARDS / f"{card_name}.yaml").read_text())
    card["hparams"].update(changes)
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump(card))
    for command in ("validate", "fit"):
        code, out, err = invoke(command, path)
        one_error(code, err, words)
