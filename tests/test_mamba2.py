"""The Mamba-2 hybrids (nemotron_h): what the recorded figures (tests/test_llamacpp_figures.py)
cannot name: ssm_scan against ggml-cpu's loops written out in float64, the three layer kinds
the per-layer arrays make, the state each Mamba-2 layer keeps (llama_memory_recurrent's sizes,
whatever the context) and the files refused."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import from_metadata, get_arch
from ggmlrun.models.memory.caches import create_memory
from opkit import node_for, randn, run

F64 = np.float64
MODELS = Path(__file__).resolve().parents[1] / "examples" / "models"


def scan_ref(s, x, dt, A, B, C, ids, K):
    """ggml_compute_forward_ssm_scan_f32, element by element, in float64."""
    S, T, H, P = x.shape
    G, N = B.shape[2], s.shape[-1]
    y = np.zeros((S, T, H, P))
    snaps = np.zeros((K, S, H, P, N))
    for q in range(S):
        state = s[ids[q]].astype(F64).copy()
        for t in range(T):
            for h in range(H):
                d = float(dt[q, t, h])
                soft = d if d > 20 else math.log1p(math.exp(d))
                g = h // (H // G)
                decay = np.exp(soft * A[h].astype(F64))          # [1] or [N]
                for p in range(P):
                    state[h, p] = state[h, p] * decay + B[q, t, g] * x[q, t, h, p] * soft
                    y[q, t, h, p] = state[h, p] @ C[q, t, g].astype(F64)
            if 0 <= T - 1 - t < K:
                snaps[T - 1 - t, q] = state
    return y, snaps


@pytest.mark.parametrize("S, T, H, P, N, G, K, rows, mamba1", [
    (1, 4, 4, 3, 8, 2, 1, 1, False),     # heads sharing their group's B and C
    (2, 3, 2, 2, 4, 1, 1, 3, False),     # two sequences reading rows 2 and 0
    (1, 5, 2, 2, 4, 2, 3, 1, False),     # rollback snapshots (K 3)
    (1, 3, 2, 2, 4, 1, 1, 1, True)])     # Mamba-1's decay per state column
def test_ssm_scan_is_ggmls_loop_y_then_states(S, T, H, P, N, G, K, rows, mamba1):
    s = randn(rows, H, P, N, scale=0.5)
    x, dt = randn(S, T, H, P), randn(S, T, H, scale=2.0)
    A = -np.exp(randn(H, N if mamba1 else 1, scale=0.5))
    B, C = randn(S, T, G, N), randn(S, T, G, N)
    ids = np.array([2, 0][:S] if rows > 1 else [0] * S, np.int32)
    got = run("ssm_scan", [s, x, dt, A, B, C, ids], {"K": K}).reshape(-1)
    assert got.shape == (S * T * H * P + K * S * H * P * N,)
    y, snaps = scan_ref(s, x, dt, A, B, C, ids, K)
    np.testing.assert_allclose(got[:y.size].reshape(y.shape), y, rtol=2e-4, atol=2e-5)
    written = min(T, K)
    np.testing.assert_allclose(got[y.size:].reshape(snaps.shape)[:written], snaps[:written],
                               rtol=2e-4, atol=2e-5)


def test_ssm_scan_refuses_mismatched_shapes():
    s, x, dt = randn(1, 2, 2, 4), randn(1, 3, 2, 2), randn(1, 3, 2)
    B, ids = randn(1, 3, 1, 4), np.zeros(1, np.int32)
    with pytest.raises(InputError, match="ssm_scan"):
        node_for("ssm_scan", [s, x, dt, randn(3, 1), B, B, ids], {"K": 1})   # A of 3 heads
    with pytest.raises(InputError, match="ssm_scan"):
        node_for("ssm_scan", [s, x, dt, randn(2, 4), B, B, ids], {"K": 2})   # Mamba-1, K 2


def fields(kv, ff, **extra) -> dict:
    base = {"block_count": len(kv), "embedding_length": 64, "feed_forward_length": list(ff),
            "vocab_size": 320, "context_length": 512, "attention.head_count": 4,
            "attention.head_count_kv": list(kv), "attention.layer_norm_rms_epsilon": 1e-5,
            "attention.layer_norm_epsilon": 1e-5, "ssm.conv_kernel": 4, "ssm.inner_size": 64,
            "ssm.state_size": 16, "ssm.time_step_rank": 4, "ssm.group_count": 2}
    base.update(extra)
    return {f"nemotron_h.{k}": v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("kv, ff", [((0, 2, 0, 0), (0, 0, 96, 0)), ((2, 0, 0), (0, 96, 0)),
                                    ((0, 0, 1, 0, 0), (0, 0, 0, 96, 0))])
def test_layer_kinds_come_from_kv_heads_and_ffn_widths(kv, ff):
    hp = from_metadata(fields(kv, ff), "nemotron_h")
    table = get_arch("nemotron_h").tensors(hp)
    for il, (h, f) in enumerate(zip(kv, ff)):
        assert hp.is_recurrent(il) == (h == 0 and f == 0)
        assert (f"blk.{il}.ssm_in.weight" in table) == (h == 0 and f == 0)
        assert (f"blk.{il}.attn_q.weight" in table) == (h > 0 and f == 0)
        assert (f"blk.{il}.ffn_up.weight" in table) == (f > 0)


@pytest.mark.parametrize("d_conv, d_inner, d_state, n_group, heads", [
    (4, 64, 16, 2, 4), (2, 128, 8, 1, 8), (5, 96, 32, 3, 6)])
@pytest.mark.parametrize("cells, n_seq_max", [(256, 1), (4096, 3)])
def test_each_mamba2_layer_keeps_a_conv_and_an_ssm_state_per_sequence(
        d_conv, d_inner, d_state, n_group, heads, cells, n_seq_max):
    kv, ff = (0, 2, 0, 0), (0, 0, 96, 0)
    hp = from_metadata(fields(kv, ff, **{"ssm.conv_kernel": d_conv, "ssm.inner_size": d_inner,
                                         "ssm.state_size": d_state, "ssm.group_count": n_group,
                                         "ssm.time_step_rank": heads}), "nemotron_h")
    memory = create_memory(hp, kv_type="f16", cells=cells, flash_attn=True, n_seq_max=n_seq_max)
    conv, ssm = (d_conv - 1) * (d_inner + 2 * n_group * d_state), d_state * d_inner
    assert memory.recurrent.rows == n_seq_max
    assert memory.recurrent.widths == {0: (conv, ssm), 3: (conv, ssm)}
    assert sum(t.nbytes for t in memory.state_tensors()) == 2 * n_seq_max * 4 * (conv + ssm)
    assert sorted(memory.kv.widths) == [1]       # the MLP layer keeps nothing


@pytest.mark.parametrize("change, message", [
    ({"attention.layer_norm_epsilon": None}, "layer_norm_epsilon"),
    ({"ssm.group_count": 3}, "group_count"),
    ({"nextn_predict_layers": 1}, "MTP")])
def test_files_llama_cpp_refuses_or_ggmlrun_does_not_build_are_input_errors(change, message):
    with pytest.raises(InputError, match=message):
        from_metadata(fields((0, 2, 0, 0), (0, 0, 96, 0), **change), "nemotron_h")


def moe_fields(**extra) -> dict:
    out = {k.replace("nemotron_h.", "nemotron_h_moe."): v
           for k, v in fields((0, 2, 0, 0), (0, 0, 32, 0)).items()}
    base = {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32,
            "expert_shared_feed_forward_length": 48}
    base.update(extra)
    out.update({f"nemotron_h_moe.{k}": v for k, v in base.items() if v is not None})
    return out


@pytest.mark.parametrize("latent", [0, 16])
def test_moe_layers_are_ungated_experts_at_the_latent_width_beside_a_shared_expert(latent):
    hp = from_metadata(moe_fields(moe_latent_size=latent), "nemotron_h_moe")
    table = get_arch("nemotron_h_moe").tensors(hp)
    width = latent or 64
    assert table["blk.2.ffn_up_exps.weight"].shape == (8, 32, width)
    assert table["blk.2.ffn_down_exps.weight"].shape == (8, width, 32)
    assert table["blk.2.ffn_up_shexp.weight"].shape == (48, 64)
    assert "blk.2.ffn_gate_exps.weight" not in table
    assert table["blk.2.ffn_latent_down.weight"].required is False


def test_grouped_expert_selection_is_refused():
    with pytest.raises(InputError, match="expert_group_count"):
        from_metadata(moe_fields(expert_group_count=2), "nemotron_h_moe")


def granite_fields(**extra) -> dict:
    base = {"block_count": 4, "embedding_length": 64, "feed_forward_length": 96,
            "vocab_size": 320, "context_length": 512, "attention.head_count": 4,
            "attention.head_count_kv": [0, 2, 0, 0], "attention.layer_norm_rms_epsilon": 1e-5,
            "ssm.conv_kernel": 4, "ssm.inner_size": 128, "ssm.state_size": 16,
            "ssm.time_step_rank": 8, "ssm.group_count": 2}
    base.update(extra)
    return {f"granitehybrid.{k}": v for k, v in base.items() if v is not None}


def test_granite_layers_without_kv_heads_are_mamba2_and_d_inner_must_be_twice_n_embd():
    hp = from_metadata(granite_fields(), "granitehybrid")
    assert [hp.is_recurrent(il) for il in range(4)] == [True, False, True, True]
    with pytest.raises(InputError, match="inner_size"):
        from_metadata(granite_fields(**{"ssm.inner_size": 96}), "granitehybrid")


@pytest.mark.parametrize("finetuned", [None, True, False])
def test_granite_attention_ropes_unless_rope_scaling_finetuned_is_false(finetuned):
    from ggmlrun.models.arch.build import build_graph
    from ggmlrun.models.modelfile import read_gguf

    model = read_gguf(MODELS / "tiny-granitehybrid-f16.gguf")      # rope on (no key)
    hp = from_metadata(granite_fields(**{"rope.scaling.finetuned": finetuned}), "granitehybrid")
    model.hparams = dataclasses.replace(model.hparams, rope_finetuned=hp.rope_finetuned)
    ropes = [n for n in build_graph(model, 8, 1, 256, 256, False, "f16").graph.nodes
             if n.op == "rope"]
    assert len(ropes) == (0 if finetuned is False else 2)     # Q and K of its one attention


@pytest.mark.parametrize("rms, eps", [(1e-5, 1e-6), (None, 1e-6), (None, 3e-5)])
def test_nemotron_h_rms_norms_fall_back_to_the_layer_norm_epsilon(rms, eps):
    """As the converter writes the files (layer_norm_epsilon only) and llama.cpp reads them."""
    hp = from_metadata(fields((0, 2, 0, 0), (0, 0, 96, 0), **{
        "attention.layer_norm_rms_epsilon": rms, "attention.layer_norm_epsilon": eps}),
        "nemotron_h")
    assert hp.norm_rms_eps == pytest.approx(rms or eps, rel=1e-6)
