"""llama.cpp's llm_build_delta_net_base (src/models/delta-net-base.cpp) and the layers the
hybrid Qwen3.5 family shares (src/models/qwen35.cpp, qwen35moe.cpp): llama_memory_hybrid's
recurrent state, the linear-attention layer (conv state, SSM_CONV, L2 norms, the fused
GATED_DELTA_NET, the gated RMS norm) and the gated full-attention layer (a doubled Q
projection: query and gate; Q/K head norms; IMROPE). Their tables are delta_net's. qwen3next
(src/models/qwen3next.cpp) builds the same layers with the differences `Variant` names.

A graph's ubatch holds d.n_seqs sequences of equal length (1 unless a reserve with -np N, whose
n_seq_max rows of state the graph sees whole), with fused gated delta net on (llama.cpp
resolves it on when the op runs on the layer's device, as every ggml backend recorded does)
and no rollback snapshots (n_rs_seq 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ggmlrun.core.util.lazynumpy import np     # graph building only: headers load no NumPy
from ggmlrun.models.gguf.names import MODEL_TENSOR as T


@dataclass(frozen=True)
class Variant:
    """Where qwen3next.cpp's layers differ from qwen35's (the defaults): beta and alpha from one
    ssm_beta_alpha projection ([b, a] per key head), the key heads repeat-interleaved to the
    value heads before the gated delta net (qwen35 broadcasts them inside the fused op), Qcur_full
    reshaped before the query / gate views, and the input embedding's callback name."""
    beta_alpha: bool = False
    repeat_heads: bool = False
    q_reshape: bool = False
    embd_name: str = "model.input_embed"


QWEN35 = Variant()


def ssm_a(d, il: int):
    """LLM_TENSOR_SSM_A_NOSCAN: "blk.N.ssm_a", without a suffix."""
    return d.weight(T.SSM_A, il, "")


def memory_inputs(d) -> None:
    """build_inp_mem_hybrid's recurrent half: rs_s_copy and its views (the ubatch's n_seqs
    states; in a reserve the whole memory of max(1, n_seq_max) rows)."""
    from ggmlrun.models.graph.builder import rs_inputs

    d.inputs.update(rs_inputs(d.b, d.n_rs, d.n_seqs))


def norm_l2(d, x, eps: float):
    """build_gdn_l2_norm: rms_norm with eps / n, then a scale by 1 / sqrt(n) (n = x's rows)."""
    n = np.float32(x.shape[-1])
    cur = d.b.op("rms_norm", [x], x.shape, eps=float(np.float32(eps) / n))
    return d.b.op("scale", [cur], x.shape, s=float(np.float32(1.0) / np.float32(math.sqrt(n))))


def beta_gate(d, cur, il: int, var: Variant):
    """beta (sigmoid) and the decay gate (softplus(alpha + dt) * ssm_a), each (ns, Tn, nvh, 1):
    from ssm_beta / ssm_alpha (qwen35) or split from ssm_beta_alpha (qwen3next)."""
    hp, b, ctx, cb, w = d.hp, d.b, d.ctx, d.b.cb, d.weight
    ns, nkh, nvh = d.n_seqs, hp.ssm_n_group, hp.ssm_dt_rank
    Tn = d.n_tokens // ns
    if var.beta_alpha:
        r = nvh // nkh
        ba = cb(ctx.mul_mat(w(T.SSM_BETA_ALPHA, il), cur), "linear_attn_mixed_ba", il)
        ba = b.reshape(ba, (ns, Tn, nkh, 2 * r))
        st = (*ba.strides[:3], 4)
        beta = cb(b.view(ba, (ns, Tn, nkh, r), st, 0), "b", il)
        alpha = cb(b.view(ba, (ns, Tn, nkh, r), st, r * 4), "a", il)
        beta = b.cont(beta)
        beta = b.op("sigmoid", [beta], beta.shape)
        alpha = b.cont(alpha, (ns, Tn, nvh))
    else:
        beta = ctx.mul_mat(w(T.SSM_BETA, il), cur)
        beta = cb(b.reshape(beta, (ns, Tn, nvh, 1)), "beta", il)
        beta = cb(b.op("sigmoid", [beta], beta.shape), "beta_sigmoid", il)
        alpha = ctx.mul_mat(w(T.SSM_ALPHA, il), cur)
        alpha = cb(b.reshape(alpha, (ns, Tn, nvh)), "alpha", il)
    alpha = b.op("add", [alpha, w(T.SSM_DT, il, "bias")], alpha.shape)
    alpha = cb(b.op("softplus", [alpha], alpha.shape), "a_softplus", il)
    gate = cb(b.op("mul", [alpha, ssm_a(d, il)], alpha.shape), "gate", il)
    if var.beta_alpha:
        beta = b.reshape(beta, (ns, Tn, nvh, 1))
    return beta, b.reshape(gate, (ns, Tn, nvh, 1))


def repeat_heads(d, x):
    """qwen3next's repeat interleave of the key heads to the value heads: (hd, 1, nkh, T) tiled
    to (hd, r, nkh, T), so value head h reads key head h // r."""
    hp, b = d.hp, d.b
    ns, S, nkh, nvh = d.n_seqs, hp.ssm_d_state, hp.ssm_n_group, hp.ssm_dt_rank
    Tn = d.n_tokens // ns
    x = b.reshape(x, (Tn * ns, nkh, 1, S))
    shape = (Tn * ns, nkh, nvh // nkh, S)
    x = b.op("repeat", [x], shape, shape=list(shape))
    return b.reshape(x, (ns, Tn, nvh, S))


def linear_attn(d, cur, il: int, var: Variant = QWEN35):
    """build_layer_attn_linear: projections, the conv state through SSM_CONV, the fused gated
    delta net with the delta state, the gated norm and ssm_out; Tn tokens per sequence of the
    ubatch's ns sequences."""
    from ggmlrun.models.graph.builder import build_rs

    hp, b, ctx = d.hp, d.b, d.ctx
    cb, w = b.cb, d.weight
    ns, S = d.n_seqs, hp.ssm_d_state
    Tn = d.n_tokens // ns
    nkh, nvh = hp.ssm_n_group, hp.ssm_dt_rank
    conv_dim = 2 * S * nkh + hp.ssm_d_inner
    d.cache.add_recurrent(il)
    r_l, s_l = d.cache.r[il], d.cache.s[il]
    qkv = ctx.mul_mat(w(T.ATTN_QKV, il), cur)
    qkv = cb(b.reshape(qkv, (ns, Tn, conv_dim)), "linear_attn_qkv_mixed", il)
    z = cb(ctx.mul_mat(w(T.ATTN_GATE, il), cur), "z", il)
    beta, gate = beta_gate(d, cur, il, var)
    # build_conv_state (n_rs_seq 0): the conv state's columns before the ubatch's
    states = cb(build_rs(b, d.inputs, r_l, hp.n_embd_r, ns, d.n_rs, 0, d.rs_zero),
                "conv_states", il)
    states = cb(b.reshape(states, (ns, conv_dim, hp.ssm_d_conv - 1)), "conv_states_reshaped", il)
    qkv_t = cb(b.transpose(qkv), "qkv_mixed_transposed", il)
    conv_in = cb(b.op("concat", [states, qkv_t], (ns, conv_dim, hp.ssm_d_conv - 1 + Tn), axis=2),
                 "conv_input", il)
    last = cb(b.view(conv_in, (ns, conv_dim, hp.ssm_d_conv - 1),
                     (conv_in.strides[0], conv_in.strides[1], 4), Tn * 4), "conv_state_last", il)
    update = cb(b.view(r_l, (ns, hp.n_embd_r), (r_l.strides[0], 4), 0), "conv_state_update", il)
    b.expand(b.cpy(last, update))
    state = build_rs(b, d.inputs, s_l, hp.n_embd_s, ns, d.n_rs, 0, d.rs_zero)
    state = cb(b.reshape(state, (ns, nvh, S, S)), "state_predelta", il)
    conv = cb(b.op("ssm_conv", [conv_in, w(T.SSM_CONV1D, il)], (ns, Tn, conv_dim)),
              "conv_output_raw", il)
    conv = cb(b.op("silu", [conv], conv.shape), "conv_output_silu", il)
    row = conv.strides[-2]

    def heads(n_head, offset):
        return b.view(conv, (ns, Tn, n_head, S), (row * Tn, row, S * 4, 4), offset)

    q = cb(heads(nkh, 0), "q_conv", il)
    k = cb(heads(nkh, S * nkh * 4), "k_conv", il)
    val = cb(heads(nvh, 2 * S * nkh * 4), "v_conv", il)
    q = norm_l2(d, q, hp.norm_rms_eps)
    k = norm_l2(d, k, hp.norm_rms_eps)
    if var.repeat_heads and nkh != nvh:
        q, k = repeat_heads(d, q), repeat_heads(d, k)
    cb(q, "q_conv_predelta", il)
    cb(k, "k_conv_predelta", il)
    cb(val, "v_conv_predelta", il)
    # build_recurrent_attn -> build_delta_net_fused (K = 1)
    gdn = b.op("gated_delta_net", [q, k, val, gate, beta, state], ((Tn + S) * ns, S * nvh), K=1)
    out = b.view(gdn, (ns, Tn, nvh, S), (S * nvh * Tn * 4, S * nvh * 4, S * 4, 4), 0)
    new = b.view(gdn, (ns, nvh, S, S), (S * S * nvh * 4, S * S * 4, S * 4, 4),
                 S * nvh * Tn * ns * 4)
    cb(out, "attn_output", il)
    cb(new, "new_state", il)
    b.expand(b.cpy(new, b.view(s_l, (ns, hp.n_embd_s), (s_l.strides[0], 4), 0)))
    # build_norm_gated: rms_norm "norm" * ssm_norm, times silu(z)
    z4 = b.reshape(z, (ns, Tn, nvh, S))
    normed = d.norm(out, w(T.SSM_NORM, il), il)
    cur = b.op("mul", [normed, b.op("silu", [z4], z4.shape)], normed.shape)
    cur = cb(b.reshape(cur, (ns, Tn, nvh * S)), "final_output", il)
    cur = cb(ctx.mul_mat(w(T.SSM_OUT, il), cur), "linear_attn_out", il)
    return b.reshape(cur, (Tn * ns, hp.n_embd))


def gated_attn(d, cur, il: int, var: Variant = QWEN35):
    """build_layer_attn: Q and its gate from one doubled projection, Q/K head norms, IMROPE,
    attention over the KV cache, the output times sigmoid(gate), then wo."""
    from ggmlrun.models.graph.attention import build_attn_kv

    hp, b, ctx = d.hp, d.b, d.ctx
    cb, w = b.cb, d.weight
    hd, Tn = hp.n_embd_head_k, d.n_tokens
    d.add_kv_layer(il)
    q_full = cb(ctx.mul_mat(w(T.ATTN_Q, il), cur), "Qcur_full", il)
    k = cb(ctx.mul_mat(w(T.ATTN_K, il), cur), "Kcur", il)
    v = cb(ctx.mul_mat(w(T.ATTN_V, il), cur), "Vcur", il)
    if var.q_reshape:     # ggml_reshape_4d, then views of it (the same bytes as qwen35's)
        q_full = b.reshape(q_full, (Tn, hp.n_head, 2 * hd))
    row = q_full.strides[0]
    q = cb(b.view(q_full, (Tn, hp.n_head, hd), (row, hd * 2 * 4, 4), 0),
           "Qcur_view" if var.q_reshape else "Qcur_reshaped", il)
    q = cb(d.norm(q, w(T.ATTN_Q_NORM, il), il), "Qcur_normed", il)
    k = b.reshape(k, (Tn, hp.n_head_kv, hd))
    k = cb(d.norm(k, w(T.ATTN_K_NORM, il), il), "Kcur_normed", il)
    gate = b.view(q_full, (Tn, hp.n_head, hd), (row, hd * 2 * 4, 4), hd * 4)
    if var.q_reshape:
        gate = b.cont(cb(gate, "gate", il), (Tn, hp.n_head * hd))
    else:
        gate = cb(b.cont(gate, (Tn, hp.n_head * hd)), "gate_reshaped", il)
    v = b.reshape(v, (Tn, hp.n_head_kv, hd))
    q = cb(d.rope_ext(q, None), "Qcur", il)
    k = cb(d.rope_ext(k, None), "Kcur", il)
    cb(v, "Vcur", il)
    scale = 1.0 / math.sqrt(float(hd))
    cur = cb(build_attn_kv(ctx, d.cache, d.inputs, None, q, k, v, scale, il), "attn_pregate", il)
    g = cb(b.op("sigmoid", [gate], gate.shape), "gate_sigmoid", il)
    cur = cb(b.op("mul", [cur, g], cur.shape), "attn_gated", il)
    return cb(ctx.mul_mat(w(T.ATTN_OUT, il), cur), "attn_output", il)


def build(d, ffn, var: Variant = QWEN35) -> object:
    """The qwen35 / qwen35moe layer loop; `ffn(d, cur, il)` is the FFN (dense or MoE). The
    output rows are picked after the final norm (embeddings_nextn_masked is off). The FFN's
    residual (qwen35moe names it "post_moe") is renamed l_out at once, as in llama.cpp."""
    hp, b = d.hp, d.b
    memory_inputs(d)
    inpL = b.cb(d.inpL, var.embd_name, -1)
    for il in range(hp.n_layer):
        inpSA = inpL
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        b.expand(cur)
        cur = linear_attn(d, cur, il, var) if hp.is_recurrent(il) else gated_attn(d, cur, il, var)
        cur = b.cb(d.add(cur, inpSA), "attn_residual", il)
        residual = cur
        cur = b.cb(d.norm(cur, d.weight(T.ATTN_POST_NORM, il), il), "attn_post_norm", il)
        cur = b.cb(ffn(d, cur, il), "ffn_out", il)
        cur = b.cb(d.add(cur, residual), "post_ffn", il)
        inpL = b.cb(cur, "l_out", il)
    return inpL
