"""llama.cpp's nemotron_h_moe (src/models/nemotron-h-moe.cpp reuses nemotron_h's graph and
loader; Nemotron-3-Nano-30B-A3B, Nemotron 3 Super): nemotron_h's three layer kinds, the MLP
layers being routed experts without a gate (squared ReLU; sigmoid router, selection bias, the
top expert_used_count weights optionally normalised and scaled), optionally through a latent
projection (moe_latent_size: ffn_latent_down before, ffn_latent_up after the experts), plus a
squared-ReLU shared expert; their sum is the layer's output. Not built (exit 2): expert groups
(expert_group_count > 1), the MTP block."""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import nemotron_h
from ggmlrun.models.arch.base import ROPE_TYPE_NORM, Arch, TensorSpec
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts

NAME = "nemotron_h_moe"


def read_hparams(get, common: dict) -> HParams:
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    n_ff_exp = check_experts(NAME, n_expert, n_used, common["n_ff"],
                             get("expert_feed_forward_length", 0, required=False))
    if get("expert_group_count", 0, required=False) > 1:
        raise InputError(f"{NAME}.expert_group_count > 1: grouped expert selection is not built")
    return nemotron_h.read_hparams(
        get, common, n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp,
        n_ff_shexp=get("expert_shared_feed_forward_length", 0, required=False),
        expert_weights_norm=get("expert_weights_norm", False, required=False),
        expert_weights_scale=get("expert_weights_scale", 0.0, required=False),
        n_moe_latent=get("moe_latent_size", 0, required=False), gating="sigmoid")


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    def experts(il: int) -> dict[str, TensorSpec]:
        name = lambda t, s="weight": tn(NAME, t, s, il)   # noqa: E731
        n, ne, ff = hp.n_embd, hp.n_expert, hp.n_ff_exp
        m = hp.n_moe_latent or n
        return {name(T.FFN_GATE_INP): TensorSpec((ne, n)),
                name(T.FFN_EXP_PROBS_B, "bias"): TensorSpec((ne,)),
                name(T.MOE_LATENT_DOWN): TensorSpec((m, n), False),
                name(T.MOE_LATENT_UP): TensorSpec((n, m), False),
                name(T.FFN_DOWN_EXP): TensorSpec((ne, m, ff)),
                name(T.FFN_UP_EXP): TensorSpec((ne, ff, m)),
                name(T.FFN_DOWN_SHEXP): TensorSpec((n, hp.n_ff_shexp)),
                name(T.FFN_UP_SHEXP): TensorSpec((hp.n_ff_shexp, n))}
    return nemotron_h.tensors(hp, NAME, experts)


def moe(d, cur, il: int):
    """build_ffn_layer's MoE branch: the latent input (when the file has ffn_latent_down), the
    router's logits, the experts, the latent back up, the shared expert, their sum."""
    hp, b = d.hp, d.b
    latent = d.optional(T.MOE_LATENT_DOWN, il)
    inp = d.ctx.mul_mat(latent, cur) if latent is not None else cur
    logits = b.cb(d.ctx.mul_mat(d.weight(T.FFN_GATE_INP, il), cur), "ffn_moe_logits", il)
    out = d.moe_ffn(il, inp, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                    norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                    gating="sigmoid", exp_probs_b=d.weight(T.FFN_EXP_PROBS_B, il, "bias"),
                    logits=logits, glu="relu_sqr")
    up = d.optional(T.MOE_LATENT_UP, il)
    if up is not None:
        out = d.ctx.mul_mat(up, out)
    shexp = b.cb(nemotron_h.relu_sqr_ffn(d, cur, il, T.FFN_UP_SHEXP, T.FFN_DOWN_SHEXP),
                 "ffn_shexp", il)
    return b.cb(d.add(out, shexp), "ffn_out", il)


def build(d):
    return nemotron_h.build(d, moe)


ARCH = Arch(name=NAME, rope_type=ROPE_TYPE_NORM, tensors=tensors, build=build,
            read_hparams=read_hparams, hybrid=True, rows_after_norm=True, min_layer_tensors=3,
            rms_eps_fallback=True,
            per_layer=nemotron_h.ARCH.per_layer)
