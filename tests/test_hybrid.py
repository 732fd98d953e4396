"""Hybrid models (llama_memory_hybrid: a KV cache over the full-attention layers, a recurrent
state over the delta-net ones): the state's bytes per backend, independent of the context,
`fit` counting it, the Qwen3.5-27B card, and the state carried between ubatches. llama.cpp's
own figures for the tiny qwen35 files are compared in tests/test_llamacpp_figures.py and node
by node in tests/test_models_oracle.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.models.cards.reader import read_card
from ggmlrun.models.arch.build import build_graph
from ggmlrun.models.modelfile import read_gguf
from tests.clikit import invoke

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "models"
CARD_27B = ROOT / "ggmlrun" / "models" / "cards" / "qwen3.5-27b-q4_k_m.yaml"
RPC = ROOT / "graphs" / "backends" / "llamacpp_rpc.yaml"


def measure(model, *args) -> dict:
    code, out, err = invoke("measure", model, "--json", *args)
    assert code == 0, err
    return {b["name"]: b for b in json.loads(out)["backends"]}


def test_state_is_two_f32_rows_per_recurrent_layer_whatever_the_context():
    """cache_r_l (n_embd_r = (d_conv - 1)(d_inner + 2 n_group d_state)) and cache_s_l (n_embd_s =
    d_state d_inner) per delta-net layer, one row each (n_seq_max 1), on its layer's backend;
    the KV cache only over the full-attention layers, growing with the context."""
    model = read_gguf(MODELS / "tiny-qwen35-q8_0.gguf")      # layers 0-2 delta-net, 3 attention
    hp = model.hparams
    assert [hp.is_recurrent(il) for il in range(4)] == [True, True, True, False]
    assert (hp.n_embd_r, hp.n_embd_s) == (3 * (64 + 2 * 2 * 16), 16 * 64)
    mg = build_graph(model, 8, 8, 256, 256, False, "f16")
    assert sorted(mg.cache.r) == sorted(mg.cache.s) == [0, 1, 2] and sorted(mg.cache.k) == [3]
    assert mg.cache.r[0].shape == (1, hp.n_embd_r) and mg.cache.s[2].dtype == "f32"
    per_layer = 4 * (hp.n_embd_r + hp.n_embd_s)
    one = ("--parallel", "1")           # one sequence: one row (-np auto: 4)
    small = measure(MODELS / "tiny-qwen35-q8_0.gguf", "--backends", RPC, "--ctx", "256", "--ngl", "3", *one)
    large = measure(MODELS / "tiny-qwen35-q8_0.gguf", "--backends", RPC, "--ctx", "1024", "--ngl", "3", *one)
    # -ngl 3: layers 2 and 3 on the device: one delta-net layer's state there, two on the CPU
    assert (small["RPC0"]["state_bytes"], small["CPU"]["state_bytes"]) == (per_layer, 2 * per_layer)
    assert all(small[b]["state_bytes"] == large[b]["state_bytes"] for b in small)
    assert large["RPC0"]["kv_bytes"] == 4 * small["RPC0"]["kv_bytes"] and small["CPU"]["kv_bytes"] == 0
    nkvo = measure(MODELS / "tiny-qwen35-q8_0.gguf", "--backends", RPC, "--no-kv-offload", *one)
    assert nkvo["RPC0"]["state_bytes"] == 0 and nkvo["CPU"]["state_bytes"] == 3 * per_layer


def test_attention_only_models_have_no_state():
    got = measure(MODELS / "tiny-llama-q8_0.gguf", "--backends", RPC)
    assert all(b["state_bytes"] == 0 for b in got.values())


def test_27b_card_fits_in_a_few_reserves_counting_the_state():
    """The 1 s target is benchmarks/bench_fit.py's; here the work it stands for: few reserves."""
    model = read_card(CARD_27B)
    hp = model.hparams
    assert sum(hp.is_recurrent(il) for il in range(hp.n_layer)) == 48
    assert (hp.n_embd_head_k, hp.n_rot, hp.rope_sections) == (256, 64, (11, 11, 10, 0))
    assert model.tensors["blk.0.ssm_conv1d.weight"].dtype == "f32"
    # attn_qkv (delta-net) and attn_v (attention) share the quantizer's attn_v counter
    assert model.tensors["blk.0.attn_qkv.weight"].dtype == "q6_K"
    assert model.tensors["blk.11.attn_v.weight"].dtype == "q4_K"    # not a more-bits layer
    assert model.tensors["blk.63.attn_v.weight"].dtype == "q6_K"
    code, out, err = invoke("fit", CARD_27B, "--gpu", "16GiB", "--ram", "64GiB", "--ctx", "auto",
                            "--json")
    assert code == 0, err
    got = json.loads(out)
    assert len(got["probes"]) <= 8 and got["ngl"] is not None
    rows = {b["name"]: b for b in got["backends"]}
    state = 48 * 4 * (hp.n_embd_r + hp.n_embd_s) * 4      # a row per -np auto's 4 sequences
    assert sum(b["state_bytes"] for b in rows.values()) == state
    assert all(b["total_bytes"] == b["weights_bytes"] + b["kv_bytes"] + b["state_bytes"]
               + b["arena_bytes"] + b.get("output_bytes", 0) for b in rows.values())


@pytest.mark.parametrize("model", ["tiny-qwen35-f16", "tiny-qwen35-q8_0"])
def test_two_ubatches_carry_the_state(tmp_path, model):
    """40 tokens at --ubatch 32 (two ubatches: the caches and the recurrent state carry over) give
    the logits of one ubatch of 40; without the carried state they would not."""
    tokens = ",".join(str((i * 37 + 5) % 320) for i in range(40))
    logits = []
    for ub in ("512", "32"):
        out = tmp_path / f"o{ub}.npz"
        code, _, err = invoke("run", MODELS / f"{model}.gguf", "--tokens", tokens, "--ubatch", ub,
                              "--ctx", "256", "--out", out)
        assert code == 0, err
        logits.append(np.load(out)["result_output"])
    assert np.abs(logits[0] - logits[1]).max() <= 1e-3 * np.abs(logits[0]).max()
    code, _, err = invoke("run", MODELS / f"{model}.gguf", "--tokens", tokens.split(",", 32)[-1],
                          "--ctx", "256", "--out", tmp_path / "tail.npz")
    assert code == 0, err
    tail = np.load(tmp_path / "tail.npz")["result_output"]
    assert np.abs(tail - logits[0]).max() > 1e-2 * np.abs(logits[0]).max()


def _with_kv(tmp_path, extra: bytes, count: int = 1) -> Path:
    from tests.ggufkit import rebuild

    path = tmp_path / "m.gguf"
    path.write_bytes(rebuild((MODELS / "tiny-qwen35-q8_0.gguf").read_bytes(), extra_kv=extra,
                             extra_kv_count=count))
    return path


def test_recurrent_layers_array_is_read_when_the_file_has_it(tmp_path):
    """Newer converters write attention.recurrent_layers (from the model's layer_types): llama.cpp
    takes it over full_attention_interval. The same pattern builds the same graph; another
    pattern is refused where the tensors do not match it."""
    import struct

    from tests.ggufkit import kv_bytes

    def bools(values) -> bytes:
        return kv_bytes("qwen35.attention.recurrent_layers", 9,
                        struct.pack("<iQ", 7, len(values)) + bytes(values))

    same = read_gguf(_with_kv(tmp_path, bools([1, 1, 1, 0])))
    assert [same.hparams.is_recurrent(il) for il in range(4)] == [True, True, True, False]
    assert measure(tmp_path / "m.gguf", "--backends", RPC) == measure(
        MODELS / "tiny-qwen35-q8_0.gguf", "--backends", RPC)
    _with_kv(tmp_path, bools([1, 0, 1, 0]))
    code, _, err = invoke("measure", tmp_path / "m.gguf")
    assert code == 2 and "blk.1." in err
    _with_kv(tmp_path, bools([1, 0]))
    code, _, err = invoke("measure", tmp_path / "m.gguf")
    assert code == 2 and "recurrent_layers must be an array of 4 booleans" in err


def test_mtp_blocks_count_for_ngl_but_are_never_loaded(tmp_path):
    """nextn_predict_layers: the last blocks are MTP blocks (tiny-qwen35moe-q8_0's block 4):
    counted by -ngl (-ngl 2 is the MTP block and the output), never loaded, no KV cache or
    state; llama.cpp's figures for that file are in tests/test_llamacpp_figures.py. A count
    that leaves no trunk is refused."""
    from tests.ggufkit import u32_kv

    model = read_gguf(MODELS / "tiny-qwen35moe-q8_0.gguf")
    hp = model.hparams
    assert (hp.n_layer, hp.n_layer_all, hp.is_recurrent(4)) == (4, 5, False)
    mg = build_graph(model, 8, 8, 256, 256, False, "f16")
    assert sorted(mg.cache.k) == [3] and sorted(mg.cache.r) == [0, 1, 2]
    assert not any(n.name.startswith("blk.4.") for n in mg.graph.leafs if n.role == "weight")
    two = measure(MODELS / "tiny-qwen35moe-q8_0.gguf", "--backends", RPC, "--ngl", "2")
    one = measure(MODELS / "tiny-qwen35moe-q8_0.gguf", "--backends", RPC, "--ngl", "1")
    assert two["RPC0"] == one["RPC0"] and two["RPC0"]["kv_bytes"] == 0
    path = _with_kv(tmp_path, u32_kv("qwen35.nextn_predict_layers", 4))
    code, _, err = invoke("measure", path)
    assert code == 2 and "nextn_predict_layers 4 leaves no layers" in err


# --- qwen35moe: the hybrid layers with routed experts and a gated shared expert ----------------
CARD_35B = ROOT / "ggmlrun" / "models" / "cards" / "qwen3.5-35b-a3b-q4_k_m.yaml"


def test_qwen35moe_graph_has_the_gated_shared_expert():
    """Per layer: build_moe_ffn, then the shared expert (build_ffn on *_shexp) times the sigmoid
    of the 1-D gate row's product with the input, one gate per token ([T, 1], broadcast)."""
    model = read_gguf(MODELS / "tiny-qwen35moe-f16.gguf")
    hp = model.hparams
    # the f16 file has no feed_forward_length, as the real ones: the widths are the experts' own
    assert (hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp, hp.n_expert, hp.n_expert_used) == (0, 32, 64, 8, 2)
    q8 = read_gguf(MODELS / "tiny-qwen35moe-q8_0.gguf").hparams
    assert (q8.n_ff, q8.n_ff_shexp) == (96, 96)        # no shared key: feed_forward_length
    mg = build_graph(model, 5, 5, 256, 256, False, "f16")
    by_name = {n.name: n for n in mg.graph.nodes}
    gate = by_name["shared_expert_gate_sigmoid-0"]
    assert gate.op == "sigmoid" and gate.shape == (5, 1)
    gated = by_name["ffn_shexp_gated-0"]
    assert gated.op == "mul" and gated.shape == (5, 64)


def test_qwen35moe_without_any_ffn_width_is_an_input_error(tmp_path):
    from tests.ggufkit import rebuild

    path = tmp_path / "m.gguf"
    raw = (MODELS / "tiny-qwen35moe-q8_0.gguf").read_bytes()
    path.write_bytes(rebuild(raw, drop_key="qwen35moe.feed_forward_length"))
    code, _, err = invoke("measure", path)
    assert code == 2 and "expert_shared_feed_forward_length" in err and "Traceback" not in err


def test_35b_a3b_card_types_and_fit_with_n_cpu_moe():
    """The card as llama.cpp's quantizer makes Q4_K_M: attn_qkv and attn_v share the attn_v
    counter (40 of them, one per layer), the down experts (routed and shared) follow ffn_down's
    rule by layer, routers and the shared expert's gate row stay f32. fit puts every layer on
    the device and the fewest expert layers on the CPU (that N fits, N - 1 does not), within a
    second."""
    model = read_card(CARD_35B)
    hp = model.hparams
    assert sum(hp.is_recurrent(il) for il in range(hp.n_layer)) == 30
    assert (hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp) == (0, 512, 512)
    types = {name: t.dtype for name, t in model.tensors.items()}
    assert len(types) == 40 * 19 - 10 * 3 + 3           # 30 delta-net layers of 19, 10 of 16
    # use_more_bits(i, 40): i < 5, i >= 35, (i - 5) % 3 == 2
    assert [types[f"blk.{il}.attn_v.weight"] for il in (3, 7, 11, 15, 19, 35)] == \
        ["q6_K", "q6_K", "q4_K", "q4_K", "q6_K", "q6_K"]
    assert types["blk.0.attn_qkv.weight"] == types["blk.10.attn_qkv.weight"] == "q6_K"
    assert types["blk.9.attn_qkv.weight"] == "q4_K"
    assert types["blk.7.ffn_down_exps.weight"] == types["blk.7.ffn_down_shexp.weight"] == "q6_K"
    assert types["blk.8.ffn_down_exps.weight"] == "q4_K"
    assert types["blk.8.ffn_gate_inp.weight"] == types["blk.8.ffn_gate_inp_shexp.weight"] == "f32"
    assert types["blk.0.ssm_conv1d.weight"] == "f32"
    code, out, err = invoke("fit", CARD_35B, "--gpu", "12GiB", "--ram", "64GiB", "--ctx", "32768",
                            "--json")
    assert code == 0, err
    got = json.loads(out)
    assert len(got["probes"]) <= 6       # the 1 s target: benchmarks/bench_fit.py
    n = got["n_cpu_moe"]
    assert got["ngl"] == 41 and 0 < n < 40
    common = ("--gpu", "12GiB", "--ram", "64GiB", "--ctx", "32768", "--ngl", "41", "--json")
    for ncm, fits in ((n, True), (n - 1, False)):
        code, out, err = invoke("measure", CARD_35B, *common, "--n-cpu-moe", str(ncm))
        assert code == 0, err
        device = json.loads(out)["memory"][0]
        assert (device["need_bytes"] + 2**30 <= device["memory_bytes"]) == fits


@pytest.mark.parametrize("model", ["tiny-qwen35-q8_0", "tiny-qwen35moe-f16"])
def test_parallel_sequences_get_a_state_row_each(model):
    """-np N: max(1, n_seq_max) rows of recurrent state per delta-net layer (wherever its layer
    is), the reserve's ubatch split into N sequences; llama.cpp's bytes for -np 2, 3 and 4 are
    compared in tests/test_llamacpp_figures.py."""
    one = measure(MODELS / f"{model}.gguf", "--backends", RPC, "--ngl", "2", "--parallel", "1")
    for n in (2, 3):
        many = measure(MODELS / f"{model}.gguf", "--backends", RPC, "--ngl", "2", "--parallel", str(n))
        assert all(many[b]["state_bytes"] == n * one[b]["state_bytes"] for b in one)
    graph = build_graph(read_gguf(MODELS / f"{model}.gguf"), 33, 33, 256, 256, False, "f16",
                        n_seqs=3)
    gdn = next(n for n in graph.graph.nodes if n.op == "gated_delta_net")
    assert gdn.src[0].shape[:2] == (3, 11)        # [n_seqs, tokens per sequence, heads, S]


def test_a_card_with_the_mtp_block(tmp_path):
    """n_layer_nextn: 1 with n_layer 41 is the file Qwen3.6's converters write (753 tensors: the
    MTP block's attention, experts and nextn.* too); llama.cpp's quantizer counts that block, here
    with the same types for the trunk; -ngl counts it, nothing of it is loaded."""
    text = CARD_35B.read_text().replace("  n_layer: 40\n", "  n_layer: 41\n  n_layer_nextn: 1\n")
    card = tmp_path / "mtp.yaml"
    card.write_text(text)
    plain, mtp = read_card(CARD_35B), read_card(card)
    assert (mtp.hparams.n_layer, mtp.hparams.n_layer_all) == (40, 41)
    assert len(mtp.tensors) == 753 and "blk.40.nextn.eh_proj.weight" in mtp.tensors
    assert all(mtp.tensors[name].dtype == t.dtype for name, t in plain.tensors.items())
    args = ("--gpu", "24GiB", "--ram", "64GiB", "--ctx", "8192", "--json")
    without = measure(CARD_35B, *args, "--ngl", "all")
    with_mtp = measure(card, *args, "--ngl", "all")
    assert with_mtp == without
