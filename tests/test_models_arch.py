"""The architecture registry (ggmlrun/models/arch/): what is accepted, tensor tables from gguf's
names, each architecture's own hyperparameters and graph features, the Qwen3 cards.

llama.cpp's own figures for the tiny model of every architecture are compared in
tests/test_llamacpp_figures.py (bytes, nodes, splits, logits) and tests/test_models_oracle.py
(node by node); this file checks what those cannot see.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.ir.ops import OPS
from ggmlrun.core.ir.ops.registry import make_node
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import ARCHITECTURES, get_arch
from ggmlrun.models.gguf.names import MODEL_TENSOR, tn
from ggmlrun.models.cards.reader import read_card
from ggmlrun.models.arch.build import build_graph
from ggmlrun.models.arch import from_metadata
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.hparams.rope import rope_params
from tests.clikit import invoke

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
CARDS = ROOT / "ggmlrun" / "models" / "cards"
TINY = sorted(MODELS.glob("tiny-*.gguf"))


def test_registry_lists_the_recorded_architectures_in_order():
    assert ARCHITECTURES[0] == "llama"
    assert set(ARCHITECTURES) <= {"llama", "qwen2", "qwen3", "mistral3", "phi3", "gemma3",
                                  "gemma4", "qwen35", "qwen3moe", "glm4moe", "gpt-oss",
                                  "qwen35moe", "deepseek2", "qwen3vl", "qwen3vlmoe", "lfm2",
                                  "lfm2moe", "nemotron_h", "nemotron_h_moe",
                                  "granitehybrid", "minimax-m2", "llama4", "seed_oss", "olmo2",
                                  "smollm3", "qwen3next", "mistral4"}
    for name in ARCHITECTURES:
        assert get_arch(name).name == name
    # every architecture has its tiny models, and they are what the tests compare
    assert {read_gguf(p).arch for p in TINY} == set(ARCHITECTURES)


def test_unknown_architecture_exits_2_listing_the_supported_ones(tmp_path):
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    code, out, err = invoke("measure", path)
    assert code == 2 and "architecture 'mamba' is not supported" in err
    assert ", ".join(ARCHITECTURES) in err
    with pytest.raises(InputError, match="not supported"):
        get_arch("mamba")


# keys an architecture requires beyond the common ones (its load_arch_hparams reads them
# without a default)
REQUIRED_KEYS = {"qwen3moe": {"expert_count": 8, "expert_used_count": 2},
                 "qwen3vl": {"rope.dimension_sections": [3, 3, 2, 0]},
                 "lfm2": {"shortconv.l_cache": 3, "attention.head_count_kv": [0, 4]},
                 "nemotron_h": {"attention.head_count_kv": [0, 4],
                                "attention.layer_norm_epsilon": 1e-5},
                 "granitehybrid": {"attention.head_count_kv": [0, 4], "ssm.inner_size": 128,
                                   "expert_count": 8, "expert_used_count": 2,
                                   "expert_shared_feed_forward_length": 32},
                 "nemotron_h_moe": {"attention.head_count_kv": [0, 4],
                                    "attention.layer_norm_epsilon": 1e-5, "expert_count": 8,
                                    "expert_used_count": 2, "expert_feed_forward_length": 32,
                                    "moe_latent_size": 32},
                 "lfm2moe": {"shortconv.l_cache": 3, "attention.head_count_kv": [0, 4],
                             "expert_count": 8, "expert_used_count": 2,
                             "expert_feed_forward_length": 32, "expert_gating_func": 2},
                 "qwen3vlmoe": {"expert_count": 8, "expert_used_count": 2,
                                "rope.dimension_sections": [3, 3, 2, 0]},
                 "qwen35moe": {"expert_count": 8, "expert_used_count": 2},
                 "qwen3next": {"expert_count": 8, "expert_used_count": 2},
                 "glm4moe": {"expert_count": 8, "expert_used_count": 2,
                             "expert_feed_forward_length": 32, "expert_shared_count": 1},
                 "deepseek2": {"expert_count": 8, "expert_used_count": 2,
                               "expert_feed_forward_length": 32, "expert_shared_count": 1,
                               "attention.head_count_kv": 1, "attention.key_length": 48,
                               "attention.value_length": 32, "rope.dimension_count": 16,
                               "attention.q_lora_rank": 32, "attention.kv_lora_rank": 32,
                               "attention.key_length_mla": 48, "attention.value_length_mla": 32},
                 "gemma4": {"attention.sliding_window_pattern": [True, False],
                            "attention.sliding_window": 64, "attention.key_length_swa": 16,
                            "attention.value_length_swa": 16,
                            "embedding_length_per_layer_input": 0},
                 "gpt-oss": {"expert_count": 8, "expert_used_count": 2,
                             "expert_feed_forward_length": 32, "attention.sliding_window": 64},
                 "minimax-m2": {"expert_count": 8, "expert_used_count": 2,
                                "expert_feed_forward_length": 32, "expert_gating_func": 2},
                 "llama4": {"expert_count": 8, "expert_used_count": 2,
                            "expert_feed_forward_length": 32, "interleave_moe_layer_step": 2}}
REQUIRED_KEYS["mistral4"] = REQUIRED_KEYS["deepseek2"]     # deepseek2's load_arch_hparams
# create_tensor(output, 0): no tied output
OUTPUT_REQUIRED = {"gpt-oss", "minimax-m2", "olmo2"}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tensor_tables_use_gguf_names(arch):
    """Every name in a table is gguf's (TENSOR_NAMES of a tensor MODEL_TENSORS lists for the
    architecture); asking for one it does not list is an error, not a retyped string."""
    hybrid = get_arch(arch).hybrid       # delta-net layers: their SSM sizes too
    ssm = {"ssm.conv_kernel": 4, "ssm.inner_size": 64, "ssm.state_size": 16,
           "ssm.time_step_rank": 4, "ssm.group_count": 2,
           "rope.dimension_sections": [3, 3, 2, 0]} if hybrid else {}
    hp = from_metadata({f"{arch}.{k}": v for k, v in dict(
        block_count=2, embedding_length=64, **{"attention.head_count": 4}, feed_forward_length=96,
        vocab_size=320, context_length=512, **{"attention.layer_norm_rms_epsilon": 1e-5},
        **ssm | REQUIRED_KEYS.get(arch, {})).items()}, arch)
    table = get_arch(arch).tensors(hp)
    assert "token_embd.weight" in table
    assert table["output.weight"].required is (arch in OUTPUT_REQUIRED)
    # LLM_TENSOR_SSM_A_NOSCAN and SSM_D are the names without a suffix ("blk.N.ssm_a"); lfm2's
    # short-conv tensors the ones with a dot in their class ("blk.N.shortconv.conv")
    assert all(re.fullmatch(r"(blk\.\d+\.)?(shortconv\.)?[a-z_]+[a-z0-9_]*\.(weight|bias)", name)
               or hybrid and re.fullmatch(r"blk\.\d+\.ssm_[ad]", name) for name in table)
    if not hybrid:
        with pytest.raises(KeyError):
            tn(arch, MODEL_TENSOR.SSM_A, "weight", 0)


@pytest.mark.parametrize("path", TINY, ids=[p.stem for p in TINY])
@pytest.mark.parametrize("flash_attn", [False, True])
def test_builder_agrees_with_the_op_registry(path, flash_attn):
    """Every node of every architecture's graph re-infers to the builder's shape and layout."""
    model = read_gguf(path)
    for node in build_graph(model, 32, 32, 256, 256, flash_attn, "f16").graph.nodes:
        spec = OPS.get(node.op)
        if spec is None or (node.op == "cont" and "shape" not in spec.params):
            continue
        if node.op == "scale" and node.view_src is not None:
            continue         # ggml_scale_inplace (build_rs's state clearing): a view of its source
        made = make_node(node.name, node.op, node.src, node.params)
        assert (made.shape, made.dtype, made.strides, made.view_src, made.view_offset) == \
            (node.shape, node.dtype, node.strides, node.view_src, node.view_offset), node.name


def test_qwen2_biases_and_tied_output():
    model = read_gguf(MODELS / "tiny-qwen2-f16.gguf")
    assert "output.weight" not in model.tensors and "blk.0.attn_q.bias" in model.tensors
    mg = build_graph(model, 8, 8, 256, 256, False, "f16")
    adds = [n for n in mg.graph.nodes if n.op == "add" and n.src[1].name.endswith(".bias")]
    assert [n.name for n in adds[:3]] == ["Qcur-0", "Vcur-0", "Kcur-0"]   # expanded q, v, k
    assert len(adds) == 3 * model.hparams.n_layer
    assert mg.output_weight.name == "token_embd.weight" and mg.output_weight is not \
        mg.weights["token_embd.weight"]
    assert get_arch("qwen2").rope_type == 2


def test_qwen3_head_size_and_pinned_head_norms():
    model = read_gguf(MODELS / "tiny-qwen3-f16.gguf")
    hp = model.hparams
    assert (hp.n_embd, hp.n_head, hp.n_embd_head_k, hp.n_rot) == (64, 4, 32, 32)
    mg = build_graph(model, 8, 8, 256, 256, False, "f16")
    names = [n.name for n in mg.graph.nodes]
    assert "Qcur_normed-0" in names and "Kcur_normed-0" in names
    # build_norm names the head norms "norm-<il>": four pinned norms a layer, as in llama.cpp
    assert sum(1 for t, il in mg.norm_pins if il == 0) == 4
    assert all(t.op == "rms_norm" for t, _ in mg.norm_pins)
    assert model.tensors["blk.0.attn_q.weight"].shape == (128, 64)
    assert model.tensors["blk.0.attn_output.weight"].shape == (64, 128)


def test_mistral3_temperature_input_and_yarn():
    model = read_gguf(MODELS / "tiny-mistral3-f16.gguf")
    hp = model.hparams
    assert (hp.rope_scaling, hp.n_ctx_orig_yarn, hp.attn_temp_scale, hp.n_attn_temp_floor_scale) \
        == ("yarn", 512, pytest.approx(0.1), 512)
    rope = rope_params(hp)
    assert rope["ext_factor"] == 1.0 and rope["freq_scale"] == 0.25 and rope["n_ctx_orig"] == 512
    # log multiplier 1: mscale / mscale = 1, then the 1 / (1 + 0.1 ln 4) ggml-cpu undoes
    assert rope["attn_factor"] == pytest.approx(1.0 / (1.0 + 0.1 * math.log(4.0)), rel=1e-6)
    mg = build_graph(model, 8, 8, 256, 256, False, "f16")
    scale = mg.inputs["attn_scale"]
    assert scale.name == "inp_attn_scale" and scale.shape == (8, 1, 1)
    assert "Qcur_attn_temp_scaled-0" in [n.name for n in mg.graph.nodes]
    values = mg.extra_inputs[scale]([0, 511, 512, 2000])
    want = np.log(np.floor(np.array([0, 511, 512, 2000]) / 512) + 1) * 0.1 + 1
    assert np.allclose(values.reshape(-1), want)
    plain = read_gguf(MODELS / "tiny-mistral3-q8_0.gguf")
    assert "attn_scale" not in build_graph(plain, 8, 8, 256, 256, False, "f16").inputs
    assert rope_params(plain.hparams)["ext_factor"] == 0.0


def test_rope_scaling_type_none_never_scales_and_unknown_types_are_refused():
    base = {"llama.block_count": 1, "llama.embedding_length": 64, "llama.attention.head_count": 4,
            "llama.feed_forward_length": 96, "llama.vocab_size": 320, "llama.context_length": 512,
            "llama.rope.scaling.factor": 4.0, "llama.attention.layer_norm_rms_epsilon": 1e-5}
    assert rope_params(from_metadata(base))["freq_scale"] == 0.25
    none = from_metadata(base | {"llama.rope.scaling.type": "none"})
    assert rope_params(none)["freq_scale"] == 1.0
    with pytest.raises(InputError, match="rope.scaling.type must be one of none, linear, yarn, longrope"):
        from_metadata(base | {"llama.rope.scaling.type": "llama3"})
    # llama.cpp's load_arch_hparams reads the RMS epsilon without a default
    del base["llama.attention.layer_norm_rms_epsilon"]
    with pytest.raises(InputError, match="lacks 'llama.attention.layer_norm_rms_epsilon'"):
        from_metadata(base)


# --- cards ----------------------------------------------------------------------------------
def _bytes(model) -> int:
    return sum(TYPES[t.dtype].row_bytes(math.prod(t.shape)) for t in model.tensors.values())


def test_qwen3_cards_hyperparameters_and_q4_k_m_mix():
    m8 = read_card(CARDS / "qwen3-8b-q4_k_m.yaml")
    hp = m8.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_embd_head_k, hp.n_ff, hp.n_vocab,
            hp.n_ctx_train) == (36, 4096, 32, 8, 128, 12288, 151936, 40960)
    assert m8.tensors["blk.0.attn_q_norm.weight"].dtype == "f32"
    assert m8.tensors["output.weight"].dtype == "q6_K"
    # 18 use_more_bits layers of 36: attn_v and ffn_down q6_K there, plus the output
    assert sum(t.dtype == "q6_K" for t in m8.tensors.values()) == 37
    # Qwen's Qwen3-8B-Q4_K_M.gguf is 5.03 GB with its metadata and vocabulary
    assert _bytes(m8) == 5_021_827_072
    m32 = read_card(CARDS / "qwen3-32b-q4_k_m.yaml")
    hp = m32.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_embd_head_k) == (64, 5120, 64, 128)
    assert m32.tensors["blk.0.attn_q.weight"].shape == (8192, 5120)
    assert _bytes(m32) == 19_756_174_336          # the 19.8 GB file


@pytest.mark.parametrize("card", ["qwen3-8b-q4_k_m.yaml", "qwen3-32b-q4_k_m.yaml"])
def test_fit_on_the_qwen3_cards_takes_one_reserve(card, tmp_path):
    """The 1 s target is benchmarks/bench_fit.py's; here the work it stands for."""
    backends = tmp_path / "b.yaml"
    backends.write_text("backends:\n  - {name: GPU0, kind: sim, memory: 24GiB}\n"
                        "  - {name: CPU, kind: cpu, memory: 64GiB}\n")
    code, out, err = invoke("fit", CARDS / card, "--backends", backends, "--json")
    assert code == 0, err
    assert len(__import__("json").loads(out)["probes"]) <= 2


def test_phi3_fused_views_and_longrope_factors_by_context():
    model = read_gguf(MODELS / "tiny-phi3-f16.gguf")
    assert "blk.0.attn_qkv.weight" in model.tensors and "blk.0.ffn_gate.weight" not in model.tensors
    for n_ctx, want in ((256, "rope_factors_short.weight"), (1024, "rope_factors_long.weight")):
        mg = build_graph(model, 8, 8, n_ctx, n_ctx, False, "f16")
        assert mg.rope_freqs_name == want
        ropes = [n for n in mg.graph.nodes if n.op == "rope"]
        assert all(n.src[2].name == want for n in ropes) and len(ropes) == 2 * model.hparams.n_layer
        # Q, K, V are strided views of the one QKV product
        q = ropes[0].src[0]
        assert q.op == "view" and q.src[0].name == "wqkv-0" and not q.is_contiguous
    glu = [n for n in mg.graph.nodes if n.op == "glu"]
    assert len(glu[0].src) == 1 and glu[0].shape[-1] == model.hparams.n_ff


CARD_OF_TINY = {   # cards describing the tiny mistral3 / phi3 files, with their own hparams
    "tiny-mistral3-f16": """architecture: mistral3
hparams: {n_layer: 4, n_embd: 64, n_head: 4, n_head_kv: 2, n_ff: 192, n_vocab: 320,
          n_ctx_train: 2048, rope_scaling: yarn, rope_scaling_factor: 4.0, n_ctx_orig: 512,
          attn_temp_scale: 0.1, yarn_log_mul: 1.0}
weights: f16
""",
    "tiny-phi3-f16": """architecture: phi3
hparams: {n_layer: 4, n_embd: 64, n_head: 4, n_head_kv: 2, n_ff: 96, n_vocab: 320,
          n_ctx_train: 2048, rope_scaling: longrope, n_ctx_orig: 512,
          rope_attn_factor: 1.1902380714238083}
weights: f16
""",
    "tiny-glm4moe-f16": """architecture: glm4moe
hparams: {n_layer: 4, n_layer_nextn: 1, n_embd: 64, n_head: 4, n_head_kv: 2, n_embd_head_k: 32,
          n_rot: 16, n_ff: 128, n_expert: 8, n_expert_used: 2, n_ff_exp: 32, n_expert_shared: 1,
          n_layer_dense_lead: 1, expert_weights_scale: 2.5, expert_weights_norm: true,
          expert_gating_func: 2, n_vocab: 320, n_ctx_train: 2048}
weights: f16
""",
    "tiny-qwen3moe-f16": """architecture: qwen3moe
hparams: {n_layer: 4, n_embd: 64, n_head: 4, n_head_kv: 2, n_embd_head_k: 32, n_ff: 64,
          n_expert: 8, n_expert_used: 2, n_ff_exp: 32, n_vocab: 320, n_ctx_train: 2048}
weights: f16
""",
    "tiny-qwen35moe-f16": """architecture: qwen35moe
hparams: {n_layer: 4, n_embd: 64, n_head: 4, n_head_kv: 2, n_embd_head_k: 32, n_rot: 16,
          rope_sections: [3, 3, 2, 0], ssm_d_conv: 4, ssm_d_state: 16, ssm_n_group: 2,
          ssm_dt_rank: 4, ssm_d_inner: 64, full_attention_interval: 2, n_expert: 8,
          n_expert_used: 2, n_ff_exp: 32, n_ff_shexp: 64, n_vocab: 320, n_ctx_train: 2048}
weights: f16
""",
    "tiny-qwen35moe-q8_0": """architecture: qwen35moe
hparams: {n_layer: 5, n_layer_nextn: 1, n_embd: 64, n_head: 4, n_head_kv: 2, n_embd_head_k: 32,
          n_rot: 16, rope_sections: [3, 3, 2, 0], ssm_d_conv: 4, ssm_d_state: 16, ssm_n_group: 2,
          ssm_dt_rank: 4, ssm_d_inner: 64, n_ff: 96, n_expert: 8, n_expert_used: 2, n_ff_exp: 32,
          n_vocab: 320, n_ctx_train: 2048}
weights: q8_0
""",
}


@pytest.mark.parametrize("tiny", sorted(CARD_OF_TINY))
@pytest.mark.parametrize("ctx", [256, 1024])
def test_a_card_with_the_architectures_own_fields_gives_llama_cpps_figures(tmp_path, tiny, ctx):
    """The card format takes each architecture's fields (rope scaling, mistral3's temperature):
    a card of a tiny model gives llama.cpp's recorded device bytes, CPU KV and compute, nodes
    and splits (its CPU model bytes are per-tensor, a card having no file offsets)."""
    import json

    card = tmp_path / "card.yaml"
    card.write_text(CARD_OF_TINY[tiny])
    cfg_id = f"{tiny}/c{ctx}/ub32/fa0/ngl2"
    recorded = {c["id"]: c for c in json.loads(
        (ROOT / "tests/data/llamacpp/figures.json").read_text())["configs"]}[cfg_id]
    code, out, err = invoke("measure", card, "--json", "--backends",
                            ROOT / "graphs/backends/llamacpp_rpc.yaml", "--ctx", str(ctx),
                            "--ubatch", "32", "--ngl", "2", "--flash-attn", "off", "--parallel", "1")
    assert code == 0, err
    got = json.loads(out)
    assert (got["n_nodes"], got["n_splits"]) == (recorded["n_nodes"], recorded["n_splits"])
    by = {b["name"]: b for b in got["backends"]}
    assert {k: by["RPC0"][k] for k in recorded["backends"]["RPC0"]} == recorded["backends"]["RPC0"]
    assert (by["CPU"]["kv_bytes"], by["CPU"]["arena_bytes"]) == \
        (recorded["backends"]["CPU"]["kv_bytes"], recorded["backends"]["CPU"]["arena_bytes"])


def test_per_layer_arrays_of_one_value_are_read_and_others_refused():
    base = {"llama.block_count": 2, "llama.embedding_length": 64, "llama.feed_forward_length": 96,
            "llama.vocab_size": 320, "llama.context_length": 512,
            "llama.attention.layer_norm_rms_epsilon": 1e-5}
    hp = from_metadata(base | {"llama.attention.head_count": [4, 4],
                               "llama.attention.head_count_kv": [2, 2]})
    assert (hp.n_head, hp.n_head_kv) == (4, 2)
    with pytest.raises(InputError, match="differs between layers"):
        from_metadata(base | {"llama.attention.head_count": 4,
                              "llama.feed_forward_length": [96, 128]})
