"""Gemma 4's mixture-of-experts layers (Gemma-4-26B-A4B), as llama.cpp's gemma4 graph builds
them (src/models/gemma4.cpp, `is_moe_layer`): a layer with a router (`ffn_gate_inp`) keeps its
dense GEGLU FFN as a shared expert and adds routed experts beside it, each branch normed on its
own and the two added before the layer's usual ffn_post_norm:

- dense:   ffn_norm -> GEGLU FFN -> post_ffw_norm_1                           ("ffn_mlp")
- experts: pre_ffw_norm_2 -> build_moe_ffn (GELU-gated experts, soft_max routing, the top
  expert_used_count weights normalised to sum to 1) -> post_ffw_norm_2           ("ffn_moe")
- the router reads the attention output itself, not the normed input: a bare rms_norm,
  scaled by 1/sqrt(n_embd), times `ffn_gate_inp.scale`, then `ffn_gate_inp` (llama.cpp's
  probs_in of build_moe_ffn);
- the experts' gate and up are one fused tensor (`ffn_gate_up_exps`, its halves viewed); a
  per-expert scale (`ffn_down_exps.scale`, [n_expert]) multiplies each selected expert's down
  product (build_lora_mm_id's w_s). llama.cpp would also take separate ffn_gate_exps /
  ffn_up_exps, but gguf's tables (whence every tensor name here) list only the fused one for
  gemma4, and the converter writes only that: a file without it is refused by name.

Whether a layer is a mixture is the file's choice (its ffn_gate_inp), as in llama.cpp; the
tensors the router brings are then required (a missing one is named when the graph is built).
"""

from __future__ import annotations

import math

from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import TensorSpec


def expert_tensors(hp, name, il: int) -> dict[str, TensorSpec]:
    """load_arch_tensors' MoE block of layer il (after ffn_post_norm), in its order."""
    if not hp.n_expert:
        return {}
    n_embd, n_exp, n_ff = hp.n_embd, hp.n_expert, hp.n_ff_exp
    return {name(T.FFN_GATE_INP, bid=il): TensorSpec((n_exp, n_embd), False),
            name(T.FFN_GATE_INP, "scale", il): TensorSpec((n_embd,), False),
            name(T.FFN_PRE_NORM_2, bid=il): TensorSpec((n_embd,), False),
            name(T.FFN_POST_NORM_1, bid=il): TensorSpec((n_embd,), False),
            name(T.FFN_POST_NORM_2, bid=il): TensorSpec((n_embd,), False),
            name(T.FFN_GATE_UP_EXP, bid=il): TensorSpec((n_exp, 2 * n_ff, n_embd), False),
            name(T.FFN_DOWN_EXP, bid=il): TensorSpec((n_exp, n_embd, n_ff), False)}


def expert_scales(hp, name) -> dict[str, TensorSpec]:
    """The generic pass after load_arch_tensors: the down experts' optional per-expert scale,
    layer by layer (the gate and up ones belong to separate gate/up experts)."""
    return {name(T.FFN_DOWN_EXP, "scale", il): TensorSpec((hp.n_expert,), False)
            for il in range(hp.n_layer if hp.n_expert else 0)}


def card_tensor(name: str) -> bool:
    """What the converted Gemma-4-26B-A4B files carry of the optional MoE tensors: all of a
    layer's, with the fused gate/up experts and the down experts' per-expert scale."""
    return (".ffn_gate_inp." in name or "_ffw_norm_" in name or ".ffn_gate_up_exps." in name
            or name.endswith((".ffn_down_exps.weight", ".ffn_down_exps.scale")))


def moe_layer_ffn(d, il: int, attn_out):
    """The MoE layer's FFN: the dense branch and the experts' branch, added."""
    from ggmlrun.models.hparams.rules import as_f32

    hp, b = d.hp, d.b
    d.weight(T.FFN_GATE_UP_EXP, il)          # required with a router (see above)
    cur_mlp = b.cb(d.norm(attn_out, d.weight(T.FFN_NORM, il), il), "ffn_norm_1", il)
    cur_mlp = d.ffn_swiglu(il, cur_mlp, glu="geglu")
    cur_mlp = b.cb(d.norm(cur_mlp, d.weight(T.FFN_POST_NORM_1, il), il), "ffn_mlp", il)

    cur_moe = b.cb(d.norm(attn_out, d.weight(T.FFN_PRE_NORM_2, il), il), "ffn_norm_2", il)
    tmp = b.op("rms_norm", [attn_out], attn_out.shape, eps=hp.norm_rms_eps)
    tmp = b.op("scale", [tmp], tmp.shape, s=as_f32(1.0 / as_f32(math.sqrt(hp.n_embd))))
    tmp = b.op("mul", [tmp, d.weight(T.FFN_GATE_INP, il, "scale")], tmp.shape)
    logits = b.cb(d.ctx.mul_mat(d.weight(T.FFN_GATE_INP, il), tmp), "ffn_moe_logits", il)
    cur_moe = d.moe_ffn(il, cur_moe, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                        norm_w=True, w_scale=1.0, logits=logits, glu="geglu")
    cur_moe = b.cb(d.norm(cur_moe, d.weight(T.FFN_POST_NORM_2, il), il), "ffn_moe", il)
    return b.cb(d.add(cur_mlp, cur_moe), "ffn_moe_combined", il)
