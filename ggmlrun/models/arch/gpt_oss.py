"""llama.cpp's gpt-oss graph (src/models/openai-moe.cpp, LLM_ARCH_OPENAI_MOE; gpt-oss-20b and
-120b): Q/K/V and output with biases, attention sinks (a learned logit per head, the extra
source of soft_max and flash_attn_ext), every other layer sliding (pattern 2: layers 0, 2, ...
over llama_kv_cache_iswa's SWA cache) with the same rope base and YaRN scaling on both kinds of
layer, the post-attention norm as the FFN's input norm, and a mixture of experts with a biased
router whose top experts are picked by raw logit and weighted by a soft_max over the chosen
ones (SOFTMAX_WEIGHT), expert biases added per chosen expert (add_id) and swiglu_oai (alpha
1.702, limit 7). llama.cpp keeps every row through the last layer (embeddings_nextn_masked is
off): the output rows are taken after it, before the output norm.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, TensorSpec
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.arch.gemma3 import read_swa
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder

# LLM_FFN_SWIGLU_OAI_MOE's constants (build_moe_ffn: "TODO: move to hparams?")
SWIGLU_OAI = {"op": "swiglu_oai", "alpha": 1.702, "limit": 7.0}


def read_hparams(get, common: dict) -> HParams:
    """load_arch_hparams: the window is required, the pattern defaults to 2, and the SWA
    layers' rope base and scale default to the model's own (not gemma's 10000 and 1)."""
    if not get("attention.sliding_window"):
        raise InputError("gpt-oss.attention.sliding_window must be > 0")
    swa = read_swa(get, common["n_layer"], 2)
    swa["rope_freq_base_swa"] = float(get("rope.freq_base_swa", common["rope_freq_base"]))
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    n_ff_exp = check_experts(common["arch"], n_expert, n_used, common["n_ff"],
                             int(get("expert_feed_forward_length")), derive_width=False)
    return HParams(**common, **swa, rope_freq_scale_swa=common["rope_freq_scale"],
                   n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp)


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    """load_arch_tensors, in its order (create_tensor_qkv: a fused attn_qkv or Q/K/V)."""
    n_embd, n_e, n_ff = hp.n_embd, hp.n_expert, hp.n_ff_exp
    n_q, n_kv = hp.n_head * hp.n_rot, hp.n_head_kv * hp.n_rot
    name = lambda t, s="weight", bid=None: tn("gpt-oss", t, s, bid)   # noqa: E731
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n_embd)),
           name(T.OUTPUT_NORM): TensorSpec((n_embd,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n_embd))}
    for i in range(hp.n_layer):
        out[name(T.ATTN_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.ATTN_POST_NORM, bid=i)] = TensorSpec((n_embd,))
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_kv), (T.ATTN_V, n_kv)):
            out[name(t, bid=i)] = TensorSpec((n, n_embd))
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_kv), (T.ATTN_V, n_kv)):
            out[name(t, "bias", i)] = TensorSpec((n,), False)
        out[name(T.ATTN_OUT, bid=i)] = TensorSpec((n_embd, n_q))
        out[name(T.ATTN_SINKS, bid=i)] = TensorSpec((hp.n_head,))
        out[name(T.FFN_GATE_INP, bid=i)] = TensorSpec((n_e, n_embd))
        out[name(T.FFN_GATE_EXP, bid=i)] = TensorSpec((n_e, n_ff, n_embd))
        out[name(T.FFN_DOWN_EXP, bid=i)] = TensorSpec((n_e, n_embd, n_ff))
        out[name(T.FFN_UP_EXP, bid=i)] = TensorSpec((n_e, n_ff, n_embd))
        out[name(T.ATTN_OUT, "bias", i)] = TensorSpec((n_embd,))
        out[name(T.FFN_GATE_INP, "bias", i)] = TensorSpec((n_e,))
        out[name(T.FFN_GATE_EXP, "bias", i)] = TensorSpec((n_e, n_ff))
        out[name(T.FFN_DOWN_EXP, "bias", i)] = TensorSpec((n_e, n_embd))
        out[name(T.FFN_UP_EXP, "bias", i)] = TensorSpec((n_e, n_ff))
    return out


def build(d: Decoder):
    hp, b = d.hp, d.b
    kq_scale = 1.0 / math.sqrt(float(hp.n_rot))
    inpL = d.inpL
    for il in range(hp.n_layer):
        d.add_kv_layer(il)
        rope = d.rope_for(il)
        inpSA = inpL
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        q, k, v = d.qkv(il, cur, hp.n_rot, hp.n_head, hp.n_head_kv)
        q = d.rope_ext(q, None, rope)
        k = d.rope_ext(k, None, rope)
        b.cb(q, "Qcur", il)
        b.cb(k, "Kcur", il)
        b.cb(v, "Vcur", il)
        cur = d.attn(il, q, k, v, kq_scale, sinks=d.weight(T.ATTN_SINKS, il))
        b.cb(cur, "attn_out", il)
        ffn_inp = b.cb(d.add(cur, inpSA), "ffn_inp", il)
        cur = b.cb(d.norm(ffn_inp, d.weight(T.ATTN_POST_NORM, il), il), "attn_post_norm", il)
        cur = d.moe_ffn(il, cur, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                        norm_w=False, gating="softmax_weight", biases=True, glu=SWIGLU_OAI)
        inpL = b.cb(d.add(cur, ffn_inp), "l_out", il)
    return inpL


ARCH = Arch(name="gpt-oss", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams, rows_before_norm=True,
            card_tensors=frozenset({"attn_q.bias", "attn_k.bias", "attn_v.bias"}),
            card_hparams={"n_expert": ("expert_count", True, None),
                          "n_expert_used": ("expert_used_count", True, None),
                          "n_ff_exp": ("expert_feed_forward_length", True, None),
                          "n_swa": ("attention.sliding_window", True, None),
                          "swa_pattern": ("attention.sliding_window_pattern", False, None)})
