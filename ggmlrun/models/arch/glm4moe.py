"""llama.cpp's glm4moe graph (src/models/glm4-moe.cpp; GLM-4.5, GLM-4.5-Air): Q/K/V with biases,
optional Q/K head norms (GLM-4.5), NeoX rope over part of each head (rope.dimension_count, half
the head in the real files), a post-attention norm before the FFN; the first
leading_dense_block_count layers have a dense FFN, the others a mixture of experts with sigmoid
gates (expert_gating_func; none means sigmoid), the selection biased by exp_probs_b (the weights
are not), weights normalised (expert_weights_norm) and scaled (expert_weights_scale), beside a
shared expert (build_ffn on the *_shexp tensors). The last nextn_predict_layers blocks are the
NextN (multi-token prediction) head: counted in block_count, so by -ngl and the layer split, but
never loaded (TENSOR_SKIP) nor run, and without a KV cache (hparams.n_layer is the trunk)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import (ROPE_TYPE_NEOX, Arch, TensorSpec, default_kq_scale,
                                      nextn_tensors)
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.keys import MAX_DIM
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder

GATING = {1: "softmax", 2: "sigmoid"}     # LLAMA_EXPERT_GATING_FUNC_TYPE_*


def read_hparams(get, common: dict) -> HParams:
    block_count = common["n_layer"]
    nextn = int(get("nextn_predict_layers", 0) or 0)
    if nextn >= block_count:
        raise InputError(f"nextn_predict_layers {nextn} leaves no layers of block_count "
                         f"{block_count} to run")
    func = int(get("expert_gating_func", 0) or 0) or 2      # none: sigmoid (GLM-4.5)
    if func not in GATING:
        raise InputError(f"expert_gating_func {func} is not built for glm4moe (softmax 1, "
                         f"sigmoid 2)")
    return HParams(**dict(common, n_layer=block_count - nextn), n_layer_nextn=nextn,
                   gating=GATING[func], **moe_fields(get, common))


def moe_fields(get, common: dict) -> dict:
    """The experts' keys glm4moe and deepseek2 read alike (llm_build_glm4_moe's and
    llm_build_deepseek2's routed and shared experts), checked."""
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    n_ff_exp = check_experts(common["arch"], n_expert, n_used, common["n_ff"],
                             int(get("expert_feed_forward_length")))
    n_shared = int(get("expert_shared_count"))
    if n_shared < 1:
        raise InputError(f"{common['arch']}.expert_shared_count is 0: llama.cpp's "
                         f"{common['arch']} graph always adds the shared expert, whose tensors "
                         f"it creates only for a count >= 1")
    if n_ff_exp * n_shared > MAX_DIM:    # the shared experts' one width
        raise InputError(f"{common['arch']}.expert_feed_forward_length {n_ff_exp} times "
                         f"expert_shared_count {n_shared} is more than {MAX_DIM}")
    return dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp,
                n_expert_shared=n_shared,
                n_layer_dense_lead=int(get("leading_dense_block_count", 0) or 0),
                expert_weights_scale=float(get("expert_weights_scale", 0.0) or 0.0),
                expert_weights_norm=bool(get("expert_weights_norm", False)))


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    """load_arch_tensors, in its order; the NextN layers' tensors may be absent (a trunk-only
    file) and are never loaded."""
    n_embd, n_q = hp.n_embd, hp.n_embd_head_k * hp.n_head
    n_k, n_v = hp.n_embd_k_gqa, hp.n_embd_v_gqa
    name = lambda t, s="weight", bid=None: tn("glm4moe", t, s, bid)   # noqa: E731
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n_embd)),
           name(T.OUTPUT_NORM): TensorSpec((n_embd,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n_embd), False)}
    for i in range(hp.n_layer_all):
        req = i < hp.n_layer
        out[name(T.ATTN_NORM, bid=i)] = TensorSpec((n_embd,), req)
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_k), (T.ATTN_V, n_v)):
            out[name(t, bid=i)] = TensorSpec((n, n_embd), req)
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_k), (T.ATTN_V, n_v)):
            out[name(t, "bias", i)] = TensorSpec((n,), False)
        out[name(T.ATTN_OUT, bid=i)] = TensorSpec((n_embd, n_q), req)
        out[name(T.ATTN_Q_NORM, bid=i)] = TensorSpec((hp.n_embd_head_k,), False)
        out[name(T.ATTN_K_NORM, bid=i)] = TensorSpec((hp.n_embd_head_k,), False)
        out[name(T.ATTN_POST_NORM, bid=i)] = TensorSpec((n_embd,), req)
        if i >= hp.n_layer_dense_lead:
            n_exp, n_ff_exp = hp.n_expert, hp.n_ff_exp
            out[name(T.FFN_GATE_INP, bid=i)] = TensorSpec((n_exp, n_embd), req)
            out[name(T.FFN_EXP_PROBS_B, "bias", i)] = TensorSpec((n_exp,), req)
            out[name(T.FFN_GATE_EXP, bid=i)] = TensorSpec((n_exp, n_ff_exp, n_embd), req)
            out[name(T.FFN_DOWN_EXP, bid=i)] = TensorSpec((n_exp, n_embd, n_ff_exp), req)
            out[name(T.FFN_UP_EXP, bid=i)] = TensorSpec((n_exp, n_ff_exp, n_embd), req)
            if hp.n_expert_shared:
                n_sh = n_ff_exp * hp.n_expert_shared
                out[name(T.FFN_GATE_SHEXP, bid=i)] = TensorSpec((n_sh, n_embd), req)
                out[name(T.FFN_DOWN_SHEXP, bid=i)] = TensorSpec((n_embd, n_sh), req)
                out[name(T.FFN_UP_SHEXP, bid=i)] = TensorSpec((n_sh, n_embd), req)
        else:
            out[name(T.FFN_GATE, bid=i)] = TensorSpec((hp.n_ff, n_embd), req)
            out[name(T.FFN_DOWN, bid=i)] = TensorSpec((n_embd, hp.n_ff), req)
            out[name(T.FFN_UP, bid=i)] = TensorSpec((hp.n_ff, n_embd), req)
        if i >= hp.n_layer:
            out.update(nextn_tensors(hp, lambda t, bid: name(t, bid=bid), i))
    return out


def build(d: Decoder):
    hp, b = d.hp, d.b
    kq_scale = default_kq_scale(hp)
    inpL = d.inpL
    for il in range(hp.n_layer):
        inpSA = inpL
        q, k, v = d.layer_qkv(il, inpL)
        q_norm, k_norm = d.optional(T.ATTN_Q_NORM, il), d.optional(T.ATTN_K_NORM, il)
        if q_norm is not None:
            q = b.cb(d.norm(q, q_norm, il), "Qcur_normed", il)
        if k_norm is not None:
            k = b.cb(d.norm(k, k_norm, il), "Kcur_normed", il)
        q = b.cb(d.rope_ext(q, None), "Qcur", il)
        k = b.cb(d.rope_ext(k, None), "Kcur", il)
        b.cb(v, "Vcur", il)
        cur = d.attn(il, q, k, v, kq_scale)
        cur, inpSA = d.last_rows(il, cur, inpSA)
        ffn_inp = b.cb(d.add(cur, inpSA), "ffn_inp", il)
        cur = b.cb(d.norm(ffn_inp, d.weight(T.ATTN_POST_NORM, il), il), "post_attn_norm", il)
        if il < hp.n_layer_dense_lead:
            cur = b.cb(d.ffn_swiglu(il, cur), "ffn_out", il)
        else:
            routed = d.moe_ffn(il, cur, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                               norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                               gating=hp.gating,
                               exp_probs_b=d.weight(T.FFN_EXP_PROBS_B, il, "bias"))
            routed = b.cb(routed, "ffn_moe_out", il)
            shared = b.cb(d.ffn_swiglu(il, cur, up=T.FFN_UP_SHEXP, gate=T.FFN_GATE_SHEXP,
                                       down=T.FFN_DOWN_SHEXP), "ffn_shexp_out", il)
            cur = b.cb(d.add(routed, shared), "ffn_out", il)
        inpL = b.cb(d.add(cur, ffn_inp), "l_out", il)
    return inpL


# a card's model: the optional tensors GLM-4.5(-Air)'s files carry, by name without "blk.<i>.":
# the Q/K/V biases and the NextN block (whose every tensor the table makes optional)
_NEXTN_CARRIED = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                  "attn_output.weight", "post_attention_norm.weight", "ffn_gate_inp.weight",
                  "exp_probs_b.bias", "ffn_gate_exps.weight", "ffn_down_exps.weight",
                  "ffn_up_exps.weight", "ffn_gate_shexp.weight", "ffn_down_shexp.weight",
                  "ffn_up_shexp.weight", "nextn.eh_proj.weight", "nextn.enorm.weight",
                  "nextn.hnorm.weight", "nextn.shared_head_norm.weight")

ARCH = Arch(name="glm4moe", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams,
            card_tensors=frozenset({"output.weight", "attn_q.bias", "attn_k.bias",
                                    "attn_v.bias", *_NEXTN_CARRIED}),
            card_hparams={"n_expert": ("expert_count", True, None),
                          "n_expert_used": ("expert_used_count", True, None),
                          "n_ff_exp": ("expert_feed_forward_length", True, None),
                          "n_expert_shared": ("expert_shared_count", True, None),
                          "n_layer_dense_lead": ("leading_dense_block_count", False, None),
                          "n_layer_nextn": ("nextn_predict_layers", False, None),
                          "expert_weights_scale": ("expert_weights_scale", False, None),
                          "expert_weights_norm": ("expert_weights_norm", False, None),
                          "expert_gating_func": ("expert_gating_func", False, None)})
