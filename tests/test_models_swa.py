"""Sliding-window attention (llama_kv_cache_iswa) and the gemma3 / gemma4 hyperparameters, beside
the recorded llama.cpp figures (tests/test_llamacpp_figures.py) that check them end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.gemma3 import swa_pattern
from ggmlrun.models.arch import from_metadata
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.params import ModelOptions, swa_kv_size
from ggmlrun.models.reserve import measure_model
from ggmlrun.models.run import attn_input_values
from ggmlrun.core.ir.graph import Tensor
from tests.clikit import invoke

MODELS = Path(__file__).resolve().parents[1] / "examples" / "models"
BACKENDS = Path(__file__).resolve().parents[1] / "graphs" / "backends" / "llamacpp_rpc.yaml"


def gemma3(**extra):
    keys = {"block_count": 12, "embedding_length": 64, "attention.head_count": 4,
            "feed_forward_length": 128, "vocab_size": 320, "context_length": 2048,
            "attention.layer_norm_rms_epsilon": 1e-6, **extra}
    return from_metadata({f"gemma3.{k}": v for k, v in keys.items()}, "gemma3")


def test_gemma3_slides_by_the_default_pattern_only_with_a_window():
    assert not gemma3().has_swa                                   # no window: the plain cache
    hp = gemma3(**{"attention.sliding_window": 512})
    assert [il for il in range(12) if not hp.is_swa(il)] == [5, 11]   # pattern 6
    hp = gemma3(**{"attention.sliding_window": 512, "attention.sliding_window_pattern": 3})
    assert [il for il in range(12) if not hp.is_swa(il)] == [2, 5, 8, 11]
    assert hp.rope_freq_base_swa == 10000.0
    assert swa_pattern(4, 2, dense_first=True) == (False, True, False, True)
    with pytest.raises(InputError, match="no layer slides"):
        gemma3(**{"attention.sliding_window": 512, "attention.sliding_window_pattern": 1})


def test_swa_cache_size_is_the_window_plus_a_ubatch_padded():
    hp = gemma3(**{"attention.sliding_window": 64})
    assert swa_kv_size(ModelOptions(ctx=1024, ubatch=32, parallel=1), hp) == 256      # PAD(96, 256)
    assert swa_kv_size(ModelOptions(ctx=1024, ubatch=512, parallel=1), hp) == 768     # PAD(576, 256)
    assert swa_kv_size(ModelOptions(ctx=300, ubatch=512, parallel=1), hp) == 512      # min(512, ...)
    assert swa_kv_size(ModelOptions(ctx=1024, ubatch=32, swa_full=True), hp) == 1024
    assert swa_kv_size(ModelOptions(ctx=1024), gemma3()) == 0
    # llama-server's -np auto: one unified cache, 4 windows + a ubatch
    assert swa_kv_size(ModelOptions(ctx=1024, ubatch=32), hp) == 512      # PAD(4*64+32, 256)


def test_swa_mask_hides_tokens_a_window_back():
    inp = {"k_idxs": Tensor("k", (6,), "i64"), "v_idxs": Tensor("v", (6,), "i64"),
           "kq_mask": Tensor("m", (1, 1, 6, 8), "f32")}
    values = attn_input_values(inp, 6, 8, 256, 4, n_swa=3)
    mask = values[inp["kq_mask"]].reshape(6, 8)
    keep = mask == 0
    for p1 in range(6):
        assert [p0 for p0 in range(8) if keep[p1, p0]] == [p0 for p0 in range(p1 + 1)
                                                          if p1 - p0 < 3]
    assert np.isneginf(mask[~keep]).all()


def test_kv_bytes_are_both_caches_and_swa_full_grows_only_the_swa_one():
    model = read_gguf(MODELS / "tiny-gemma3-f16.gguf")      # 5 SWA layers, 1 full; window 64
    from ggmlrun.core.frontend.backends_file import load_backends

    backends = load_backends(BACKENDS)
    per_cell = 2 * 2 * 32 * 2         # K and V, f16, 2 KV heads of 32
    plain = measure_model(model, backends, ModelOptions(ctx=1024, ubatch=32, ngl=0, parallel=1))
    full = measure_model(model, backends, ModelOptions(ctx=1024, ubatch=32, ngl=0, swa_full=True,
                                                       parallel=1))
    assert plain.backends[-1].kv_bytes == (1 * 1024 + 5 * 256) * per_cell
    assert full.backends[-1].kv_bytes == 6 * 1024 * per_cell
    assert plain.backends[-1].kv_linear_bytes == 1024 * per_cell


def test_gemma4_refuses_a_pattern_its_shared_layers_cannot_read():
    keys = {"block_count": 4, "embedding_length": 64, "attention.head_count": 4,
            "feed_forward_length": 128, "vocab_size": 320, "context_length": 2048,
            "attention.layer_norm_rms_epsilon": 1e-6, "attention.sliding_window": 64,
            "attention.key_length_swa": 16, "attention.value_length_swa": 16,
            "embedding_length_per_layer_input": 0, "attention.shared_kv_layers": 1,
            "attention.sliding_window_pattern": [True, False, True, True]}
    with pytest.raises(InputError, match="KV-shared layers read"):
        from_metadata({f"gemma4.{k}": v for k, v in keys.items()}, "gemma4")
    keys["attention.sliding_window_pattern"] = [True, True, False, True]
    hp = from_metadata({f"gemma4.{k}": v for k, v in keys.items()}, "gemma4")
    assert hp.kv_source(3) == 1 and not hp.has_kv(3) and hp.has_kv(2)


def test_swa_full_reaches_measure_and_its_line():
    path = MODELS / "tiny-gemma3-f16.gguf"
    code, out, err = invoke("measure", path, "--ctx", "1024", "--swa-full", "--json",
                            "--backends", BACKENDS)
    assert code == 0, err
    assert "--swa-full" in __import__("json").loads(out)["command"]
