"""gpt-oss (issue 21): its ops against NumPy written from ggml-cpu's formulas (add_id, the
swiglu_oai glu, attention sinks in soft_max and both flash-attention paths), the MXFP4 type
(gguf's decoder, q8_0 as mul_mat's vec_dot type, CPU_REPACK for 3-D experts) and the graph's
shape (sinks as the extra source, the biased routing, the rows taken before the output norm).

llama.cpp's own figures for the tiny gpt-oss files (bytes, nodes, splits, logits on the grid,
--swa-full, -ot exps=CPU, --n-cpu-moe) are compared in tests/test_llamacpp_figures.py."""

from __future__ import annotations

import re
from pathlib import Path

import gguf.quants as gq
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from ggmlrun.core.backends.repack import repacked
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op, make_node
from ggmlrun.core.ir.ops.quant import storage_view
from ggmlrun.core.ir.types import TYPES, decode_blocks
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.build import build_graph
from ggmlrun.models.modelfile import read_gguf

MODELS = Path(__file__).resolve().parents[1] / "examples" / "models"
RNG = np.random.default_rng(2121)
F16, F32 = np.float16, np.float32


def leaf(name, arr, dtype):
    return Tensor(name=name, shape=arr.shape, dtype=dtype, strides=arr.strides, role="input")


def run_op(kind, pairs, **params):
    """pairs: (array, dtype) per source; the kernel's output."""
    leafs = [leaf(f"s{i}", a, t) for i, (a, t) in enumerate(pairs)]
    node = make_node("n", kind, leafs, params or None)
    out = np.empty(node.shape, node.np_dtype)
    get_op(kind).kernel(out, *(a for a, _ in pairs), **node.params)
    return out


def test_add_id_adds_each_chosen_experts_row():
    T, U, N, E = 5, 3, 16, 7
    a = RNG.standard_normal((T, U, N)).astype(F32)
    b = RNG.standard_normal((E, N)).astype(F32)
    ids = np.stack([RNG.permutation(E)[:U] for _ in range(T)]).astype(np.int32)
    got = run_op("add_id", [(a, "f32"), (b, "f32"), (ids, "i32")])
    want = np.stack([[a[t, i] + b[ids[t, i]] for i in range(U)] for t in range(T)])
    np.testing.assert_array_equal(got, want)
    with pytest.raises(InputError, match="add_id"):
        make_node("n", "add_id", [leaf("a", a, "f32"), leaf("b", b[:, :8], "f32"),
                                  leaf("i", ids, "i32")])


def test_swiglu_oai_caps_the_gate_and_clamps_the_up():
    x = np.linspace(-12, 12, 97, dtype=F32).reshape(1, 97)
    g = np.linspace(9, -9, 97, dtype=F32).reshape(1, 97)
    got = run_op("glu", [(x, "f32"), (g, "f32")], op="swiglu_oai", alpha=1.702, limit=7.0)
    xc, gc = np.minimum(x.astype(np.float64), 7.0), np.clip(g.astype(np.float64), -7.0, 7.0)
    want = xc / (1 + np.exp(-1.702 * xc)) * (gc + 1)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def softmax_with_sinks(scores: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """In f64: softmax over each row and the head's sink logit, the sink's share dropped."""
    s = sinks.reshape(-1, 1, 1).astype(np.float64)
    top = np.maximum(scores.max(axis=-1, keepdims=True), s)
    e = np.exp(scores - top)
    return e / (e.sum(axis=-1, keepdims=True) + np.exp(s - top))


def test_soft_max_sinks_take_a_share_of_each_row():
    H, T, KV = 4, 5, 32
    a = RNG.standard_normal((1, H, T, KV)).astype(F32)
    mask = np.zeros((1, 1, 8, KV), F32)
    mask[..., 20:] = -np.inf
    sinks = np.array([-1.0, 0.5, 3.0, 40.0], F32)        # the last dominates its rows
    got = run_op("soft_max", [(a, "f32"), (mask, "f32"), (sinks, "f32")], scale=0.5)
    want = softmax_with_sinks(0.5 * a.astype(np.float64) + mask[..., :T, :], sinks)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert (got.sum(axis=-1) < 1).all() and got[0, 3].max() < 1e-10
    with pytest.raises(InputError, match="sinks"):
        make_node("n", "soft_max", [leaf("a", a, "f32"), leaf("m", mask, "f32"),
                                    leaf("s", sinks[:3], "f32")])


@pytest.mark.parametrize("n_tokens", [7, 64])     # ggml-cpu's per-row path, then its tiled one
def test_flash_attn_ext_sinks_on_both_paths(n_tokens):
    H, Hkv, KV, D = 4, 2, 128, 32
    q = RNG.standard_normal((1, H, n_tokens, D)).astype(F32)
    k = RNG.standard_normal((1, Hkv, KV, D)).astype(F16)
    v = RNG.standard_normal((1, Hkv, KV, D)).astype(F16)
    mask = np.zeros((1, 1, n_tokens, KV), F16)
    for t in range(n_tokens):
        mask[0, 0, t, 40 + t:] = -np.inf
    sinks = np.array([0.0, 2.0, -3.0, 25.0], F32)
    got = run_op("flash_attn_ext", [(q, "f32"), (k, "f16"), (v, "f16"), (mask, "f16"),
                                    (sinks, "f32")], scale=0.2)
    kk = np.repeat(k[0].astype(np.float64), 2, axis=0)
    vv = np.repeat(v[0].astype(np.float64), 2, axis=0)
    scores = 0.2 * q[0].astype(np.float64) @ kk.transpose(0, 2, 1) + mask[0, 0]
    want = np.swapaxes(softmax_with_sinks(scores, sinks) @ vv, 0, 1)[None]   # [S, T, H, D]
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-3)
    assert np.abs(got[0, :, 3]).max() < 1e-6           # a sink of 25 takes nearly all


def test_mxfp4_decodes_as_gguf_and_multiplies_through_q8_0():
    assert (TYPES["mxfp4"].block_size, TYPES["mxfp4"].type_size) == (32, 17)
    w = RNG.standard_normal((8, 64)).astype(F32)
    raw = gq.quantize(w, Q.MXFP4)
    w32 = decode_blocks(raw, "mxfp4")
    np.testing.assert_array_equal(w32, gq.dequantize(raw, Q.MXFP4))
    # ggml's dequantize_row_mxfp4 by hand: kvalues_mxfp4 (E2M1, doubled) of the low nibbles,
    # then of the high ones, times GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128) for e >= 2
    blocks = np.asarray(raw, np.uint8).reshape(-1, 17)
    table = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float64)
    assert (blocks[:, 0] >= 2).all()
    nibbles = np.concatenate([blocks[:, 1:] & 15, blocks[:, 1:] >> 4], axis=1)
    by_hand = table[nibbles] * np.exp2(blocks[:, :1].astype(np.float64) - 128)
    np.testing.assert_array_equal(w32.reshape(-1, 32), by_hand)
    b = RNG.standard_normal((3, 64)).astype(F32)
    a_leaf = Tensor(name="w", shape=(8, 64), dtype="mxfp4", role="weight")
    a_arr = storage_view(np.frombuffer(raw.tobytes(), np.uint8).copy(), 0, a_leaf.shape,
                         a_leaf.strides, TYPES["mxfp4"])
    node = make_node("n", "mul_mat", [a_leaf, leaf("b", b, "f32")])
    out = np.empty(node.shape, F32)
    get_op("mul_mat").kernel(out, a_arr, b)
    b8 = gq.dequantize(gq.quantize(b, Q.Q8_0), Q.Q8_0)       # ggml's vec_dot type for mxfp4
    np.testing.assert_allclose(out, b8 @ w32.T, rtol=1e-5, atol=1e-5)


def test_mxfp4_experts_go_to_cpu_repack_on_avx2():
    """ggml-cpu's extra buffer takes 3-D MXFP4 experts read by MUL_MAT_ID (rows % 8)."""
    assert repacked("avx2", "mxfp4", (32, 2880, 2880))
    assert repacked("avx2", "mxfp4", (8, 64, 64)) and not repacked("avx2", "mxfp4", (8, 60, 64))
    assert not repacked("none", "mxfp4", (8, 64, 64))
    assert not repacked("avx2", "q8_0", (8, 64, 64))


def test_gpt_oss_graph_has_sinks_biased_routing_and_rows_before_the_norm():
    model = read_gguf(MODELS / "tiny-gpt-oss-mxfp4.gguf")
    hp = model.hparams
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_swa) == (8, 2, 64, 64)
    assert hp.swa_layers == (True, False, True, False)          # pattern 2
    assert hp.rope_freq_base_swa == hp.rope_freq_base == 150000.0
    assert hp.rope_freq_scale_swa == hp.rope_freq_scale == 0.25
    assert model.tensors["blk.0.ffn_up_exps.weight"].dtype == "mxfp4"
    for fa in (False, True):
        g = build_graph(model, 32, 32, 256, 256, fa, "f16", swa_size=256, swa_n_kv=256).graph
        by = {n.name: n for n in g.nodes}
        attn = [n for n in g.nodes if n.op == ("flash_attn_ext" if fa else "soft_max")
                and len(n.src) == (5 if fa else 3)]
        assert len(attn) == hp.n_layer
        assert attn[0].src[-1].name == "blk.0.attn_sinks.weight"
        assert by["ffn_moe_probs-0"].op == "add"        # the biased logits, no soft_max
        assert by["ffn_moe_weights_softmax-0"].src[0].op == "soft_max"
        biased = [n for n in g.nodes if n.op == "add_id"]
        assert [n.name for n in biased[:3]] == ["ffn_moe_gate_biased-0", "ffn_moe_up_biased-0",
                                                "ffn_moe_down_biased-0"]
        act = by["ffn_moe_swiglu_oai-0"]
        assert (act.params["op"], act.params["alpha"], act.params["limit"]) == \
            ("swiglu_oai", 1.702, 7.0)
        last = by[f"l_out-{hp.n_layer - 1}"]
        assert last.shape == (32, hp.n_embd) and last.is_output   # every row: t_h_nextn
        rows = by["norm"].src[0]
        assert rows.op == "get_rows" and rows.src[0] is last


CARDS = Path(__file__).resolve().parents[1] / "ggmlrun" / "models" / "cards"


@pytest.mark.parametrize("card,gib", [("gpt-oss-20b-mxfp4.yaml", 11.27),
                                      ("gpt-oss-120b-mxfp4.yaml", 59.02)])
def test_gpt_oss_cards_weigh_what_llama_bench_reports(card, gib):
    """llama-bench's model size for ggml-org's files (11.27 GiB, 59.02 GiB): MXFP4 experts,
    q8_0 matrices, f32 router, biases (the 2-D expert biases too), sinks and norms."""
    from ggmlrun.models.cards.reader import read_card

    model = read_card(CARDS / card)
    types = {re.sub(r"^blk\.\d+\.", "", name): t.dtype for name, t in model.tensors.items()}
    assert (types["ffn_up_exps.weight"], types["ffn_down_exps.bias"], types["attn_q.weight"],
            types["token_embd.weight"], types["output.weight"], types["ffn_gate_inp.weight"],
            types["attn_sinks.weight"]) == ("mxfp4", "f32", "q8_0", "q8_0", "q8_0", "f32", "f32")
    total = sum(TYPES[t.dtype].contiguous_bytes(t.shape) for t in model.tensors.values())
    assert round(total / 2**30, 2) == gib


def test_fit_on_the_120b_card_answers_n_cpu_moe_in_a_few_reserves():
    """The whole command in a fresh interpreter, as a user runs it; the 1 s target itself is
    measured by benchmarks/bench_fit.py (a timing here would fail on a loaded host), so this
    holds the work behind it: a handful of reserves."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ggmlrun", "fit", str(CARDS / "gpt-oss-120b-mxfp4.yaml"),
                           "--gpu", "24GiB", "--ram", "96GiB", "--ctx", "32768", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["command"].startswith("-ngl 37 -c 32768 --n-cpu-moe ")   # -fa auto: unwritten
    assert len(got["probes"]) <= 4, got["probes"]


def test_gpt_oss_metadata_needs_its_window_and_expert_width():
    from ggmlrun.models.arch import from_metadata

    base = {f"gpt-oss.{k}": v for k, v in dict(
        block_count=2, embedding_length=64, feed_forward_length=64, vocab_size=320,
        context_length=512, expert_count=8, expert_used_count=2,
        **{"attention.head_count": 4, "attention.layer_norm_rms_epsilon": 1e-5,
           "attention.sliding_window": 64, "expert_feed_forward_length": 64}).items()}
    assert from_metadata(base, "gpt-oss").swa_layers == (True, False)
    for key, match in (("gpt-oss.attention.sliding_window", "sliding_window"),
                       ("gpt-oss.expert_feed_forward_length", "expert_feed_forward_length")):
        with pytest.raises(InputError, match=match):
            from_metadata({k: v for k, v in base.items() if k != key}, "gpt-oss")
    with pytest.raises(InputError, match="sliding_window"):
        from_metadata(base | {"gpt-oss.attention.sliding_window": 0}, "gpt-oss")
