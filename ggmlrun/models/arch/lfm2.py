"""llama.cpp's lfm2 graph (src/models/lfm2.cpp; LiquidAI's LFM2 / LFM2.5 dense): a hybrid
(llama_memory_hybrid) whose recurrent layers are short convs (models/graph/shortconv.py) and
whose other layers are attention with Q/K head norms and NeoX rope. Which is which comes from
the per-layer attention.head_count_kv: 0 KV heads make a short-conv layer. Every layer then
adds a dense SwiGLU FFN. The output norm is named token_embd_norm (llama.cpp's
LLM_TENSOR_OUTPUT_NORM_LFM2, of the output layer). lfm2moe (models/arch/lfm2moe.py) is the same
loop with routed experts in place of the FFN after its leading dense layers. Not built: a
sliding window (llama.cpp's iSWA hybrid).
"""

from __future__ import annotations

import math

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, TensorSpec, moe_tensors
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams

NAME = "lfm2"


def read_hparams(get, common: dict, **extra) -> HParams:
    """load_arch_hparams (`extra`: lfm2moe's experts; lfm2's layers are all dense: llama.cpp
    sets n_layer_dense_lead to n_layer)."""
    n_layer = common["n_layer"]
    arch = common["arch"]
    kv = get.arrays.get("attention.head_count_kv", (common["n_head_kv"],) * n_layer)
    if get("attention.sliding_window", 0, required=False):
        raise InputError(f"{arch}.attention.sliding_window: {arch} with sliding-window "
                         f"attention (llama.cpp's iSWA hybrid memory) is not built")
    if any(common["n_head"] % h for h in kv if h):
        raise InputError(f"{arch}.attention.head_count {common['n_head']} must be a multiple "
                         f"of every attention layer's KV heads {sorted(set(kv) - {0})}")
    if common["n_embd_head_k"] * common["n_head"] != common["n_embd"]:
        raise InputError(f"{arch}: attn_q and attn_output are n_embd x n_embd, so the heads "
                         f"({common['n_head']} of {common['n_embd_head_k']}) must fill "
                         f"embedding_length {common['n_embd']}")
    extra.setdefault("n_layer_dense_lead", n_layer)
    return HParams(**common, n_head_kv_arr=tuple(kv), recurrent_layers=tuple(h == 0 for h in kv),
                   n_shortconv_l_cache=get("shortconv.l_cache"),
                   output_norm=tn(arch, T.TOKEN_EMBD_NORM), **extra)


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    """load_arch_tensors' order: token_embd, the output norm, the optional output; per layer
    the FFN, attn_norm ("operator_norm"), then the attention or short-conv tensors; the
    optional dense_2_out head (LFM2-ColBert, of n_embd here)."""
    name = lambda t, s="weight", bid=None: tn(hp.arch, t, s, bid)   # noqa: E731
    n, hd = hp.n_embd, hp.n_embd_head_k
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n)),
           name(T.TOKEN_EMBD_NORM): TensorSpec((n,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n), False)}
    for il in range(hp.n_layer):
        out[name(T.FFN_NORM, bid=il)] = TensorSpec((n,))
        if il >= hp.n_layer_dense_lead:      # lfm2moe: the router, experts, selection bias
            out.update(moe_tensors(hp, name, il))
            out[name(T.FFN_EXP_PROBS_B, "bias", il)] = TensorSpec((hp.n_expert,))
        else:
            out[name(T.FFN_GATE, bid=il)] = TensorSpec((hp.n_ff, n))
            out[name(T.FFN_DOWN, bid=il)] = TensorSpec((n, hp.n_ff))
            out[name(T.FFN_UP, bid=il)] = TensorSpec((hp.n_ff, n))
        out[name(T.ATTN_NORM, bid=il)] = TensorSpec((n,))
        if hp.is_recurrent(il):
            out[name(T.SHORTCONV_CONV, bid=il)] = TensorSpec((n, hp.n_shortconv_l_cache))
            out[name(T.SHORTCONV_INPROJ, bid=il)] = TensorSpec((3 * n, n))
            out[name(T.SHORTCONV_OUTPROJ, bid=il)] = TensorSpec((n, n))
            continue
        out[name(T.ATTN_Q_NORM, bid=il)] = TensorSpec((hd,))
        out[name(T.ATTN_K_NORM, bid=il)] = TensorSpec((hd,))
        kv = hp.n_embd_k_gqa_l(il)
        for t, rows in ((T.ATTN_Q, n), (T.ATTN_K, kv), (T.ATTN_V, kv)):
            out[name(t, bid=il)] = TensorSpec((rows, n))
        for t, rows in ((T.ATTN_Q, n), (T.ATTN_K, kv), (T.ATTN_V, kv)):
            out[name(t, "bias", il)] = TensorSpec((rows,), False)
        out[name(T.ATTN_OUT, bid=il)] = TensorSpec((n, n))
    out[name(T.DENSE_2_OUT)] = TensorSpec((n, n), False)
    out[name(T.DENSE_2_OUT, "bias")] = TensorSpec((n,), False)
    return out


def attention(d, cur, il: int):
    """build_attn_block: Q/K/V, their head norms, NeoX rope, attention over the KV cache."""
    hp, cb = d.hp, d.b.cb
    d.add_kv_layer(il)
    q, k, v = d.qkv(il, cur, hp.n_embd_head_k, hp.n_head, hp.heads_kv(il))
    q = cb(d.norm(q, d.weight(T.ATTN_Q_NORM, il), il), "model.layers.{}.self_attn.q_layernorm", il)
    k = cb(d.norm(k, d.weight(T.ATTN_K_NORM, il), il), "model.layers.{}.self_attn.k_layernorm", il)
    q, k = d.rope_ext(q, None), d.rope_ext(k, None)
    cur = d.attn(il, q, k, v, 1.0 / math.sqrt(float(hp.n_embd_head_k)))
    return cb(cur, "model.layers.{}.self_attn.out_proj", il)


def build(d):
    """The layer loop: operator_norm, the short conv or the attention, the residual (the
    layer's input first), ffn_norm, the dense FFN (lfm2moe past its leading dense layers: the
    experts, sigmoid or softmax routing with a selection bias, weights normalised) and the
    second residual. llama.cpp names the
    FFN's input "ffn_out" (its cb takes ffn_norm_out): kept."""
    from ggmlrun.models.graph.shortconv import memory_inputs, shortconv

    hp, b = d.hp, d.b
    cur = b.cb(d.inpL, "model.embed_tokens", -1)
    memory_inputs(d)
    for il in range(hp.n_layer):
        prev = cur
        cur = b.cb(d.norm(cur, d.weight(T.ATTN_NORM, il), il), "model.layers.{}.operator_norm", il)
        cur = shortconv(d, cur, il) if hp.is_recurrent(il) else attention(d, cur, il)
        cur, prev = d.last_rows(il, cur, prev)
        cur = d.add(prev, cur)
        normed = d.norm(cur, d.weight(T.FFN_NORM, il), il)
        b.cb(normed, "model.layers.{}.ffn_norm", il)
        if il >= hp.n_layer_dense_lead:      # lfm2moe's experts
            ffn = d.moe_ffn(il, normed, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                            norm_w=True, gating=hp.gating,
                            exp_probs_b=d.weight(T.FFN_EXP_PROBS_B, il, "bias"))
        else:
            ffn = d.ffn_swiglu(il, normed)
        b.cb(normed, "model.layers.{}.ffn_out", il)
        cur = b.cb(d.add(cur, ffn), "l_out", il)
    return cur


ARCH = Arch(name=NAME, rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams, hybrid=True,
            per_layer=frozenset({"attention.head_count_kv"}))
