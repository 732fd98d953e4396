"""llama.cpp's granitehybrid graph (src/models/granite-hybrid.cpp; IBM Granite 4.0-H): a hybrid
whose layers with 0 KV heads (the per-layer attention.head_count_kv) are Mamba-2 blocks
(models/graph/mamba2.py) and the others attention (rope unless rope.scaling.finetuned is false,
as in the real files: NoPE), every layer then an FFN: a dense SwiGLU, or (expert_count > 0)
softmax-routed experts with weights normalised, plus a SwiGLU shared expert when
expert_shared_feed_forward_length is set. Granite's multipliers: embeddings times
embedding_scale, each block's output times residual_scale before its residual, the logits
divided by logit_scale, attention.scale as the KQ scale. Not built (exit 2): experts without
gate tensors.
"""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import nemotron_h
from ggmlrun.models.arch.base import ROPE_TYPE_NORM, Arch, TensorSpec
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts

NAME = "granitehybrid"


def read_hparams(get, common: dict) -> HParams:
    """load_arch_hparams: a layer is recurrent iff it has no KV heads; d_inner must be 2 n_embd
    (llama.cpp asserts it)."""
    kv = get.arrays.get("attention.head_count_kv", (common["n_head_kv"],) * common["n_layer"])
    ssm = nemotron_h.ssm_hparams(get, NAME)
    if ssm["ssm_d_inner"] != 2 * common["n_embd"]:
        raise InputError(f"{NAME}.ssm.inner_size {ssm['ssm_d_inner']} must be 2 x "
                         f"embedding_length {common['n_embd']} (llama.cpp's only expansion)")
    if any(common["n_head"] % h for h in kv if h):
        raise InputError(f"{NAME}.attention.head_count {common['n_head']} must be a multiple "
                         f"of every attention layer's KV heads {sorted(set(kv) - {0})}")
    n_expert = int(get("expert_count", 0) or 0)
    moe = {}
    if n_expert:
        n_used = int(get("expert_used_count", 0) or 0)
        moe = dict(n_expert=n_expert, n_expert_used=n_used, n_ff_exp=check_experts(
            NAME, n_expert, n_used, common["n_ff"], common["n_ff"]),
            n_ff_shexp=get("expert_shared_feed_forward_length", 0, required=False))
    return HParams(**common, n_head_kv_arr=tuple(kv), recurrent_layers=tuple(h == 0 for h in kv),
                   f_logit_scale=get("logit_scale", 0.0, required=False),
                   f_residual_scale=get("residual_scale", 0.0, required=False),
                   f_embedding_scale=get("embedding_scale", 0.0, required=False),
                   f_attention_scale=get("attention.scale", 0.0, required=False),
                   rope_finetuned=get("rope.scaling.finetuned", True, required=False),
                   **ssm, **moe)


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    """load_arch_tensors: per layer attn_norm, the Mamba-2 or attention tensors, ffn_norm and
    the experts (router, optional gate, down, up; the shared expert's gate, up, down) or the
    dense FFN with optional biases."""
    name = lambda t, s="weight", bid=None: tn(NAME, t, s, bid)   # noqa: E731
    n, ff = hp.n_embd, hp.n_ff
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n)),
           name(T.OUTPUT_NORM): TensorSpec((n,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n), False)}
    for il in range(hp.n_layer):
        out[name(T.ATTN_NORM, bid=il)] = TensorSpec((n,))
        if hp.is_recurrent(il):
            out.update(nemotron_h.mamba2_tensors(NAME, hp, il))
        else:
            out.update(nemotron_h.attention_tensors(NAME, hp, il))
        out[name(T.FFN_NORM, bid=il)] = TensorSpec((n,))
        if hp.n_expert:
            ne, sh = hp.n_expert, hp.n_ff_shexp
            out[name(T.FFN_GATE_INP, bid=il)] = TensorSpec((ne, n))
            out[name(T.FFN_GATE_EXP, bid=il)] = TensorSpec((ne, ff, n), False)
            out[name(T.FFN_DOWN_EXP, bid=il)] = TensorSpec((ne, n, ff))
            out[name(T.FFN_UP_EXP, bid=il)] = TensorSpec((ne, ff, n))
            if sh:
                out[name(T.FFN_GATE_SHEXP, bid=il)] = TensorSpec((sh, n))
                out[name(T.FFN_UP_SHEXP, bid=il)] = TensorSpec((sh, n))
                out[name(T.FFN_DOWN_SHEXP, bid=il)] = TensorSpec((n, sh))
            continue
        for t, shape in ((T.FFN_GATE, (ff, n)), (T.FFN_DOWN, (n, ff)), (T.FFN_UP, (ff, n))):
            out[name(t, bid=il)] = TensorSpec(shape)
        for t, rows in ((T.FFN_GATE, ff), (T.FFN_DOWN, n), (T.FFN_UP, ff)):
            out[name(t, "bias", il)] = TensorSpec((rows,), False)
    return out


def residual_scaled(d, cur):
    hp = d.hp
    return d.b.op("scale", [cur], cur.shape, s=hp.f_residual_scale) if hp.f_residual_scale \
        else cur


def ffn(d, cur, il: int):
    """build_layer_ffn's FFN: the dense SwiGLU, or the experts and the shared expert."""
    hp, b = d.hp, d.b
    if not hp.n_expert:
        return b.cb(d.ffn_swiglu(il, cur), "ffn_out", il)
    if d.optional(T.FFN_GATE_EXP, il) is None:
        raise InputError(f"{NAME}: experts without ffn_gate_exps (silu of up alone) are not built")
    out = b.cb(d.moe_ffn(il, cur, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                         norm_w=True, w_scale=hp.expert_weights_scale), "ffn_moe_out", il)
    if not hp.n_ff_shexp:
        return out
    shexp = b.cb(d.ffn_swiglu(il, cur, up=T.FFN_UP_SHEXP, gate=T.FFN_GATE_SHEXP,
                              down=T.FFN_DOWN_SHEXP), "ffn_shexp", il)
    return b.cb(d.add(out, shexp), "ffn_out", il)


def build(d):
    from ggmlrun.models.graph.mamba2 import mamba2_layer
    from ggmlrun.models.graph.shortconv import memory_inputs

    hp, b = d.hp, d.b
    memory_inputs(d)
    inpL = d.inpL
    for il in range(hp.n_layer):
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        cur = (mamba2_layer(d, cur, il) if hp.is_recurrent(il)
               else nemotron_h.attention(d, cur, il, rope=hp.rope_finetuned))
        cur, inpSA = d.last_rows(il, cur, inpL)
        ffn_inp = b.cb(d.add(residual_scaled(d, cur), inpSA), "ffn_inp", il)
        cur = b.cb(d.norm(ffn_inp, d.weight(T.FFN_NORM, il), il), "ffn_norm", il)
        cur = residual_scaled(d, ffn(d, cur, il))
        cur = b.cb(d.add(cur, ffn_inp), "ffn_out", il)
        inpL = b.cb(cur, "l_out", il)
    return inpL


ARCH = Arch(name=NAME, rope_type=ROPE_TYPE_NORM, tensors=tensors, build=build,
            read_hparams=read_hparams, hybrid=True,
            per_layer=frozenset({"attention.head_count_kv"}))
