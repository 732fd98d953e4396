"""Gemma 4's mixture of experts (issue 21): the MoE layer's graph (the router on the attention
output, fused gate/up experts, the per-expert scale, the dense and expert branches added), a
dense layer beside MoE ones, the refusals, and the Gemma-4-26B-A4B card (its Q4_K_M mix, and
fit's --n-cpu-moe at the edge).

llama.cpp's own figures for the tiny gemma4moe files (bytes, nodes, splits, logits; the grid,
--swa-full, -ot exps=CPU, --cpu-moe, --n-cpu-moe) are compared in
tests/test_llamacpp_figures.py, and its node list in tests/test_models_oracle.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.cards.reader import read_card
from ggmlrun.models.arch.build import build_graph
from ggmlrun.models.arch import from_metadata
from ggmlrun.models.modelfile import read_gguf
from tests.clikit import invoke
from tests.test_moe import test_fit_answers_n_cpu_moe_at_the_edge as fit_at_the_edge

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
CARD = ROOT / "ggmlrun" / "models" / "cards" / "gemma-4-26b-a4b-q4_k_m.yaml"


def nodes_of(name: str):
    model = read_gguf(MODELS / f"{name}.gguf")
    return model, build_graph(model, 32, 32, 256, 256, False, "f16").graph.nodes


def test_moe_layer_routes_the_attention_output_and_adds_both_branches():
    model, nodes = nodes_of("tiny-gemma4moe-f16")
    hp = model.hparams
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (8, 2, 32)
    by = {n.name: n for n in nodes}
    # the router: rms_norm of attn_out (no weight), 1/sqrt(n_embd), the router's input scale
    logits = by["ffn_moe_logits-1"]
    mul = logits.src[1]
    scale = mul.src[0]
    assert mul.op == "mul" and mul.src[1].name == "blk.1.ffn_gate_inp.scale"
    assert scale.op == "scale" and scale.params["s"] == pytest.approx(1 / 8)
    assert scale.src[0].op == "rms_norm" and scale.src[0].src[0] is by["attn_out-1"]
    assert by["ffn_moe_argsort-1"].src[0] is by["ffn_moe_probs-1"]
    # one product for gate and up, its halves as views, GEGLU, the down product scaled per expert
    gate_up, gate, up = by["ffn_moe_gate_up-1"], by["ffn_moe_gate-1"], by["ffn_moe_up-1"]
    assert gate_up.op == "mul_mat_id" and gate_up.shape == (32, 2, 64)
    assert (gate.op, up.op) == ("view", "view") and gate.src[0] is up.src[0] is gate_up
    assert (gate.params["offset"], up.params["offset"]) == (0, 32 * 4)
    assert by["ffn_moe_geglu-1"].params["op"] == "geglu"
    down = by["ffn_moe_down_scaled-1"]
    rows = down.src[1]
    assert down.op == "mul" and rows.op == "get_rows" and rows.src[1] is by["ffn_moe_topk-1"]
    assert rows.src[0].op == "repeat" and rows.src[0].shape == (32, 8, 1)
    assert by["ffn_moe_weighted-1"].src[0] is down
    # each branch normed on its own, then added before the layer's post-FFN norm
    combined = by["ffn_moe_combined-1"]
    assert [s.name for s in combined.src] == ["ffn_mlp-1", "ffn_moe-1"]
    assert by["ffn_post_norm-1"].src[0].src[0] is combined
    assert sum(n.op == "mul_mat_id" for n in nodes) == 2 * hp.n_layer


def test_a_layer_without_a_router_stays_dense():
    """llama.cpp's is_moe_layer is the file's: the q8_0 file's layer 0 has no ffn_gate_inp,
    and no per-expert scale anywhere (the down product is unscaled)."""
    _, nodes = nodes_of("tiny-gemma4moe-q8_0")
    names = {n.name for n in nodes}
    assert "ffn_out-0" in names and "ffn_moe_combined-0" not in names
    assert "ffn_moe_combined-1" in names and "ffn_moe_down-1" in names
    assert not any(n.op == "repeat" for n in nodes)


def test_a_router_without_its_experts_is_refused_by_name():
    model = read_gguf(MODELS / "tiny-gemma4moe-f16.gguf")
    tensors = {k: v for k, v in model.tensors.items() if k != "blk.3.ffn_gate_up_exps.weight"}
    with pytest.raises(InputError, match="blk.3.ffn_gate_up_exps.weight"):
        build_graph(dataclasses.replace(model, tensors=tensors), 32, 32, 256, 256, False, "f16")


def test_expert_counts_are_checked():
    base = {f"gemma4.{k}": v for k, v in {
        "block_count": 2, "embedding_length": 64, "feed_forward_length": 128,
        "vocab_size": 320, "context_length": 512, "attention.head_count": 4,
        "attention.layer_norm_rms_epsilon": 1e-6, "attention.key_length": 32,
        "attention.value_length": 32, "attention.sliding_window": 64,
        "attention.sliding_window_pattern": (True, False),
        "attention.key_length_swa": 16, "attention.value_length_swa": 16,
        "rope.dimension_count_swa": 16,
        "embedding_length_per_layer_input": 0, "expert_count": 8}.items()}
    with pytest.raises(InputError, match="expert_used_count 9"):
        from_metadata(base | {"gemma4.expert_used_count": 9,
                              "gemma4.expert_feed_forward_length": 32}, "gemma4")
    with pytest.raises(InputError, match="expert_feed_forward_length"):
        from_metadata(base | {"gemma4.expert_used_count": 2}, "gemma4")
    hp = from_metadata(base | {"gemma4.expert_used_count": 2,
                               "gemma4.expert_feed_forward_length": 32}, "gemma4")
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (8, 2, 32)


def test_the_26b_a4b_card_has_llama_cpps_q4_k_m_mix():
    t = read_card(CARD).tensors
    assert t["blk.0.ffn_gate_up_exps.weight"].shape == (128, 2 * 704, 2816)
    assert t["blk.0.ffn_gate_up_exps.weight"].dtype == "q4_K"
    # rows of 704 and 2112: q6_K falls back to q8_0 (use_more_bits' layers), q4_K to q5_0
    assert ([t[f"blk.{i}.ffn_down_exps.weight"].dtype for i in (0, 5, 6)]
            == [t[f"blk.{i}.ffn_down.weight"].dtype for i in (0, 5, 6)] == ["q8_0", "q8_0", "q5_0"])
    assert t["blk.0.ffn_gate_inp.weight"].dtype == "f32"
    assert t["blk.0.ffn_down_exps.scale"].shape == (128,)
    assert t["blk.0.ffn_gate_inp.scale"].shape == (2816,)
    assert "blk.5.attn_v.weight" not in t and t["blk.0.attn_v.weight"].dtype == "q6_K"
    assert t["token_embd.weight"].dtype == "q6_K" and "output.weight" not in t
    total = sum(TYPES[i.dtype].row_bytes(int(np.prod(i.shape))) for i in t.values())
    assert total == 16_780_192_888      # 15.63 GiB of weights


@pytest.mark.parametrize("gpu,ctx", [("8GiB", "auto"), ("12GiB", "32768")])
def test_fit_answers_n_cpu_moe_at_the_edge_for_the_26b_a4b(gpu, ctx):
    fit_at_the_edge(CARD.name, gpu, ctx)


def test_cpu_moe_is_every_layers_experts_on_the_cpu():
    """--cpu-moe and --n-cpu-moe 30 move the same tensors: every layer's fused gate/up and down
    experts and the down experts' scale (LLM_FFN_EXPS_REGEX matches "ffn_down_exps.scale")."""
    figures = {}
    for extra in (["--cpu-moe"], ["--n-cpu-moe", "30"], ["--n-cpu-moe", "29"]):
        code, out, err = invoke("measure", CARD, "--gpu", "24GiB", "--ram", "64GiB", "--ctx",
                                "4096", "--json", *extra)
        assert code == 0, err
        figures[extra[-1]] = {b["name"]: b["weights_bytes"] for b in json.loads(out)["backends"]}
    assert figures["--cpu-moe"] == figures["30"]
    t = read_card(CARD).tensors
    last = sum(TYPES[i.dtype].row_bytes(int(np.prod(i.shape))) for n, i in t.items()
               if n.startswith("blk.29.ffn_") and "_exps." in n)
    assert figures["29"]["GPU0"] - figures["30"]["GPU0"] >= last
