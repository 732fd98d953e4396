"""llama.cpp's minimax-m2 graph (src/models/minimax-m2.cpp; MiniMax-M2, M2.1): Q/K/V without
biases, RMS norms over the whole Q and K width (every head at once, before the heads are split:
attn_q_norm is n_head * head wide, attn_k_norm n_head_kv * head), NeoX rope over part of each
head (rope.dimension_count 64 of 128 in the real files), and in every layer a mixture of experts:
sigmoid (or softmax) gates, the selection biased by exp_probs_b, weights normalised, never
scaled (llama.cpp does not read expert_weights_scale for it). The experts are
feed_forward_length wide: llama.cpp requires expert_feed_forward_length but shapes them by n_ff."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, TensorSpec, default_kq_scale
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder

GATING = {1: "softmax", 2: "sigmoid"}     # LLAMA_EXPERT_GATING_FUNC_TYPE_*


def read_hparams(get, common: dict) -> HParams:
    arch = common["arch"]
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    get("expert_feed_forward_length")           # required by llama.cpp, never used by it
    check_experts(arch, n_expert, n_used, common["n_ff"], common["n_ff"], derive_width=False)
    func = int(get("expert_gating_func", 0) or 0)
    if func not in GATING:      # none: build_moe_ffn aborts
        raise InputError(f"{arch}.expert_gating_func {func} is not one llama.cpp's {arch} "
                         f"graph builds (softmax 1, sigmoid 2)")
    return HParams(**common, n_expert=n_expert, n_expert_used=n_used, n_ff_exp=common["n_ff"],
                   gating=GATING[func])


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    """load_arch_tensors, in its order: output.weight is required (no tied output)."""
    n_embd, n_q, n_k, n_v = hp.n_embd, hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa, hp.n_embd_v_gqa
    n_exp, n_ff = hp.n_expert, hp.n_ff
    name = lambda t, s="weight", bid=None: tn("minimax-m2", t, s, bid)   # noqa: E731
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n_embd)),
           name(T.OUTPUT_NORM): TensorSpec((n_embd,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n_embd))}
    for i in range(hp.n_layer):
        # create_tensor_qkv also accepts a fused attn_qkv, which the gguf package does not
        # list for minimax-m2 (no converter writes one): separate Q/K/V, optional biases
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_k), (T.ATTN_V, n_v)):
            out[name(t, bid=i)] = TensorSpec((n, n_embd))
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_k), (T.ATTN_V, n_v)):
            out[name(t, "bias", i)] = TensorSpec((n,), False)
        out[name(T.ATTN_OUT, bid=i)] = TensorSpec((n_embd, n_q))
        out[name(T.ATTN_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.ATTN_Q_NORM, bid=i)] = TensorSpec((n_q,))
        out[name(T.ATTN_K_NORM, bid=i)] = TensorSpec((n_k,))
        out[name(T.FFN_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.FFN_GATE_INP, bid=i)] = TensorSpec((n_exp, n_embd))
        out[name(T.FFN_GATE_EXP, bid=i)] = TensorSpec((n_exp, n_ff, n_embd))
        out[name(T.FFN_DOWN_EXP, bid=i)] = TensorSpec((n_exp, n_embd, n_ff))
        out[name(T.FFN_UP_EXP, bid=i)] = TensorSpec((n_exp, n_ff, n_embd))
        out[name(T.FFN_EXP_PROBS_B, "bias", i)] = TensorSpec((n_exp,))
    return out


def build(d: Decoder):
    """build_qkv without the reshape (the products stay [n_tokens, width]), the width-wide
    norms, then the heads, rope, attention and the MoE block."""
    hp, b, n_tokens = d.hp, d.b, d.n_tokens
    kq_scale, hd = default_kq_scale(hp), hp.n_embd_head_k
    inpL = d.inpL
    for il in range(hp.n_layer):
        inpSA = inpL
        d.add_kv_layer(il)
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        q, k, v = d.qkv(il, cur, hd, hp.n_head, hp.n_head_kv, reshape=False)
        q = b.cb(d.norm(q, d.weight(T.ATTN_Q_NORM, il), il), "Qcur_normed", il)
        k = b.cb(d.norm(k, d.weight(T.ATTN_K_NORM, il), il), "Kcur_normed", il)
        q = b.cb(d.rope_ext(b.reshape(q, (n_tokens, hp.n_head, hd)), None), "Qcur", il)
        k = b.cb(d.rope_ext(b.reshape(k, (n_tokens, hp.n_head_kv, hd)), None), "Kcur", il)
        v = b.cb(b.reshape(v, (n_tokens, hp.n_head_kv, hd)), "Vcur", il)
        cur = d.attn(il, q, k, v, kq_scale)
        inpL = d.ffn_block(il, cur, inpSA, lambda il, cur: d.moe_ffn(
            il, cur, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True,
            gating=hp.gating, exp_probs_b=d.weight(T.FFN_EXP_PROBS_B, il, "bias")))
    return inpL


ARCH = Arch(name="minimax-m2", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams,
            card_hparams={"n_expert": ("expert_count", True, None),
                          "n_expert_used": ("expert_used_count", True, None),
                          "n_ff_exp": ("expert_feed_forward_length", True, None),
                          "expert_gating_func": ("expert_gating_func", True, None)})
