"""deepseek2 (issue 21): multi-head latent attention's hyperparameters as llama.cpp reads them
(the shape-based gating and lite rules, the MLA key sizes), its K-only cache in every count of
KV bytes, the DeepSeek-V3 and GLM-4.7-Flash cards (types, bytes, fit's --n-cpu-moe edge).

llama.cpp's own figures for the tiny deepseek2 files (bytes, nodes, splits, logits on the grid,
-ot exps=CPU, --n-cpu-moe, -nkvo) are compared in tests/test_llamacpp_figures.py, its node lists
in tests/test_models_oracle.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.cards.reader import read_card
from ggmlrun.models.arch import from_metadata
from tests.clikit import invoke
from tests.test_moe import measure_without_nextn

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
CARDS = ROOT / "ggmlrun" / "models" / "cards"
RPC = ROOT / "graphs" / "backends" / "llamacpp_rpc.yaml"
GiB = 1 << 30


def fields(**over) -> dict:
    """GLM-4.7-Flash's metadata as its GGUF carries it (no expert_gating_func key)."""
    base = {"block_count": 48, "nextn_predict_layers": 1, "embedding_length": 2048,
            "attention.head_count": 20, "attention.head_count_kv": 1,
            "attention.key_length": 576, "attention.value_length": 512,
            "rope.dimension_count": 64, "feed_forward_length": 10240, "vocab_size": 154880,
            "context_length": 202752, "attention.layer_norm_rms_epsilon": 1e-5,
            "expert_count": 64, "expert_used_count": 4, "expert_feed_forward_length": 1536,
            "expert_shared_count": 1, "leading_dense_block_count": 1,
            "attention.q_lora_rank": 768, "attention.kv_lora_rank": 512,
            "attention.key_length_mla": 256, "attention.value_length_mla": 256}
    base.update(over)
    return {f"deepseek2.{k}": v for k, v in base.items() if v is not None}


def test_gating_without_the_key_is_chosen_by_shape_as_llama_cpp_does():
    """No expert_gating_func: sigmoid for 47 or 48 trunk layers with a vocabulary of 154,880
    (GLM-4.7-Flash), softmax otherwise (DeepSeek-V2's files); the key, when there, wins."""
    assert from_metadata(fields(), "deepseek2").gating == "sigmoid"
    assert from_metadata(fields(block_count=49), "deepseek2").gating == "sigmoid"   # 48 trunk
    assert from_metadata(fields(vocab_size=154881), "deepseek2").gating == "softmax"
    assert from_metadata(fields(block_count=50), "deepseek2").gating == "softmax"
    assert from_metadata(fields(expert_gating_func=1), "deepseek2").gating == "softmax"


def test_lite_shapes_read_no_q_lora_rank():
    """26 or 27 trunk layers (DeepSeek-V2-Lite), or 48 with a vocabulary of 128,256: q_lora_rank
    is not read, so attn_q replaces attn_q_a / attn_q_b; any other shape needs the key."""
    from ggmlrun.models.arch.deepseek2 import tensors

    hp = from_metadata(fields(block_count=27, nextn_predict_layers=0), "deepseek2")
    assert hp.n_lora_q == 0
    table = tensors(hp)
    assert "blk.0.attn_q.weight" in table and "blk.0.attn_q_a.weight" not in table
    assert table["blk.0.attn_q.weight"].shape == (20 * 256, 2048)
    assert from_metadata(fields(block_count=48, nextn_predict_layers=0, vocab_size=128256),
                         "deepseek2").n_lora_q == 0
    with pytest.raises(InputError, match="q_lora_rank"):
        from_metadata(fields(**{"attention.q_lora_rank": None}), "deepseek2")


@pytest.mark.parametrize("over,words", [
    ({"attention.key_length_mla": None}, "legacy"),
    ({"attention.head_count_kv": 20}, "head_count_kv must be 1"),
    ({"attention.key_length": 512}, "kv_lora_rank \\+ rope.dimension_count"),
    ({"attention.key_length_mla": 64}, "key_length_mla 64 must be more than"),
    ({"expert_gating_func": 3}, "expert_gating_func 3"),
])
def test_what_is_not_built_is_refused_by_name(over, words):
    with pytest.raises(InputError, match=words):
        from_metadata(fields(**over), "deepseek2")


def test_kv_is_one_k_row_per_token_and_no_v():
    """MLA's cache: K rows of kv_lora_rank + n_rot (f16), no V tensor, on whichever backend
    holds the layer; the K-only reserve is what llama.cpp measured (figures.json)."""
    code, out, err = invoke("measure", MODELS / "tiny-deepseek2-q8_0.gguf", "--backends", RPC,
                            "--ctx", "1024", "--ubatch", "32", "--ngl", "2", "--json")
    assert code == 0, err
    kv = {b["name"]: b["kv_bytes"] for b in json.loads(out)["backends"]}
    row = (32 + 16) * 2
    assert kv == {"RPC0": 1 * 1024 * row, "CPU": 3 * 1024 * row}


def test_deepseek_v3_card_types_and_bytes():
    """Q4_K_M as llama.cpp's quantizer makes it: attn_k_b's rows of 128 fall back from q4_K to
    q5_0, every ffn_down q6_K in use_more_bits' layers of 61, the routers and the selection
    bias f32, the output q6_K; about 404 GB in all, as the published Q4_K_M files are."""
    m = read_card(CARDS / "deepseek-v3-q4_k_m.yaml")
    hp, t = m.hparams, m.tensors
    assert (hp.n_layer, hp.n_lora_q, hp.n_lora_kv, hp.n_embd_k_gqa, hp.gating) == (
        61, 1536, 512, 576, "sigmoid")
    assert hp.rope_yarn_log_mul == 1.0                       # 0.1 / 0.1 (the fix's division)
    assert t["blk.3.attn_k_b.weight"].shape == (128, 512, 128)
    assert t["blk.3.attn_k_b.weight"].dtype == "q5_0"
    assert t["blk.3.attn_v_b.weight"].dtype == "q4_K"
    assert (t["blk.0.ffn_down.weight"].dtype, t["blk.3.ffn_down_exps.weight"].dtype,
            t["blk.10.ffn_down_exps.weight"].dtype, t["blk.3.ffn_down_shexp.weight"].dtype) == (
        "q6_K", "q6_K", "q4_K", "q6_K")
    assert t["blk.3.ffn_gate_inp.weight"].dtype == "f32"
    assert t["blk.3.exp_probs_b.bias"].dtype == "f32"
    assert t["output.weight"].dtype == "q6_K" and "blk.61.attn_norm.weight" not in t
    total = sum(TYPES[i.dtype].row_bytes(int(np.prod(i.shape))) for i in t.values())
    assert 400e9 < total < 408e9


def test_glm_flash_card_carries_the_nextn_block_and_gates_by_shape():
    m = read_card(CARDS / "glm-4.7-flash-q4_k_m.yaml")
    hp, t = m.hparams, m.tensors
    assert (hp.n_layer, hp.n_layer_all, hp.gating, hp.expert_weights_scale) == (
        47, 48, "sigmoid", 1.8)
    assert "blk.47.nextn.eh_proj.weight" in t and "blk.47.attn_kv_a_mqa.weight" in t
    got = measure_without_nextn(CARDS / "glm-4.7-flash-q4_k_m.yaml", t, 47, "64GiB")
    assert sum(b["kv_bytes"] for b in got["backends"]) == 47 * 4096 * 576 * 2


@pytest.mark.parametrize("card,gpu,ctx", [("deepseek-v3-q4_k_m.yaml", "24GiB", "8192"),
                                          ("glm-4.7-flash-q4_k_m.yaml", "12GiB", "32768")])
def test_fit_answers_n_cpu_moe_at_the_edge(card, gpu, ctx):
    """Every layer on the device and the fewest expert layers on the CPU: one fewer does not
    fit (measured), and measuring the answer gives fit's own figures."""
    base = ["--gpu", gpu, "--ram", "512GiB", "--ctx", ctx, "--json"]
    code, out, err = invoke("fit", CARDS / card, *base)
    assert code == 0, err
    got = json.loads(out)
    assert got["ngl"] == got["n_layer"] + 1 and 0 < got["n_cpu_moe"] < got["n_layer"]
    fewer = str(got["n_cpu_moe"] - 1)
    code, out, err = invoke("measure", CARDS / card, *base, "--n-cpu-moe", fewer)
    assert code in (0, 1), err
    assert any(b["weights_bytes"] + b["kv_bytes"] + b["arena_bytes"] > b["memory_bytes"] - GiB
               for b in json.loads(out)["backends"] if b["kind"] != "cpu")
    code, out, err = invoke("measure", CARDS / card, *base, "--n-cpu-moe", str(got["n_cpu_moe"]))
    same = {b["name"]: b["weights_bytes"] + b["kv_bytes"] + b["arena_bytes"]
            + b.get("output_bytes", 0) for b in json.loads(out)["backends"]}
    assert same == {b["name"]: b["total_bytes"] for b in got["backends"]}


def test_fit_context_grows_the_k_only_cache():
    """--ctx auto: the context grows 256 cells at a time while MLA's K rows (576 f16 values a
    layer, no V) fit; the answer is the edge."""
    card = CARDS / "glm-4.7-flash-q4_k_m.yaml"
    code, out, err = invoke("fit", card, "--gpu", "20GiB", "--ram", "64GiB", "--ctx", "auto",
                            "--json")
    assert code == 0, err
    ctx = json.loads(out)["ctx"]
    for c, fits in ((ctx, True), (ctx + 256, False)):
        code, out, err = invoke("measure", card, "--gpu", "20GiB", "--ram", "64GiB", "--ctx",
                                str(c), "--json")
        dev = json.loads(out)["backends"][0]
        assert dev["kv_bytes"] == 47 * c * 576 * 2
        need = dev["weights_bytes"] + dev["kv_bytes"] + dev["arena_bytes"]
        assert (need <= dev["memory_bytes"] - GiB) == fits
