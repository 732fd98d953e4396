"""llama.cpp's deepseek2 graph (src/models/deepseek2.cpp; DeepSeek-V2/V3/R1, Kimi K2,
GLM-4.7-Flash): multi-head latent attention (MLA) with the absorption optimisation, leading
dense layers, then a mixture of experts beside shared experts.

MLA as llama.cpp runs it: Q through a low-rank compression (attn_q_a, its norm, attn_q_b;
the lite variant has a plain attn_q), each head split into a part without rope (nope) and a
rotated part (NORM rope, n_rot wide); K and V come from one compressed row per token
(attn_kv_a_mqa: kv_lora_rank values, normed, plus a shared rotated key of n_rot). The nope part
of Q is multiplied into the compressed space per head (the 3-D batched attn_k_b product), so
attention is MQA over one cached row per token of kv_lora_rank + n_rot values (the K-only cache
of attention.key_length; V is a view of its first kv_lora_rank values, attention.value_length),
and each head's output is decompressed by attn_v_b (the second 3-D batched product). The KQ
scale carries YaRN's mscale squared over sqrt(key_length_mla).

Gating (expert_gating_func): absent means softmax (DeepSeek-V2's files), except for a model
shaped as GLM-4.7-Flash (47 or 48 trunk layers and a vocabulary of 154,880), which gets
sigmoid: llama.cpp decides by shape, not by a key, and so does this module. q_lora_rank is not
read for the lite shapes llama.cpp lists (26 or 27 trunk layers, or 48 with a vocabulary of
128,256). NextN blocks (GLM-4.7-Flash's MTP layer) count for -ngl, never load nor run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import ROPE_TYPE_NORM, Arch, TensorSpec, nextn_tensors
from ggmlrun.models.gguf.names import TENSOR_NAMES, tn
from ggmlrun.models.arch import glm4moe
from ggmlrun.models.arch.glm4moe import GATING
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import as_f32

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder

GLM47_VOCAB = 154880       # GLM-4.7-Flash: sigmoid gating without the key
LITE_VOCAB = 128256        # a 48-layer lite model (Kanana-2-30B-A3B): no q_lora_rank


def read_hparams(get, common: dict, arch: str = "deepseek2") -> HParams:
    block_count = common["n_layer"]
    nextn = int(get("nextn_predict_layers", 0) or 0)
    if nextn >= block_count:
        raise InputError(f"nextn_predict_layers {nextn} leaves no layers of block_count "
                         f"{block_count} to run")
    n_layer, n_vocab = block_count - nextn, common["n_vocab"]
    lite = n_layer in (26, 27) or (n_layer == 48 and n_vocab == LITE_VOCAB)
    func = int(get("expert_gating_func", 0) or 0)
    if not func:
        func = 2 if n_layer in (47, 48) and n_vocab == GLM47_VOCAB else 1
    if func not in GATING:
        raise InputError(f"expert_gating_func {func} is not built for {arch} (softmax 1, "
                         f"sigmoid 2)")
    k_mla = int(get("attention.key_length_mla", 0) or 0)
    v_mla = int(get("attention.value_length_mla", 0) or 0)
    if not k_mla or not v_mla:
        raise InputError(f"a {arch} file without attention.key_length_mla / "
                         "value_length_mla (a legacy file with attn_kv_b) is not built; "
                         "reconvert it with a current convert_hf_to_gguf.py")
    if get("attention.temperature_scale", 0.0):
        raise InputError(f"{arch} with attention.temperature_scale (Mistral Large 3's "
                         "attention temperature) is not built yet")
    kv_lora = int(get("attention.kv_lora_rank"))
    n_rot = common["n_rot"]
    if k_mla <= n_rot:
        raise InputError(f"attention.key_length_mla {k_mla} must be more than "
                         f"rope.dimension_count {n_rot} (llama.cpp: n_embd_head_qk_nope >= 1)")
    head_k, head_v = common["n_embd_head_k"], common["n_embd_head_v"]
    if common["n_head_kv"] != 1 or head_k != kv_lora + n_rot or head_v != kv_lora:
        raise InputError(f"MLA caches one row per token: attention.head_count_kv must be 1, "
                         f"key_length kv_lora_rank + rope.dimension_count ({kv_lora + n_rot}) "
                         f"and value_length kv_lora_rank ({kv_lora}); the file has "
                         f"{common['n_head_kv']}, {head_k} and {head_v}")
    log_mul = float(get("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    # llama_context's YaRN mscale is mscale_all_dims for the deepseek2 arch only (mistral4: 1)
    return HParams(
        **dict(common, n_layer=n_layer), n_layer_nextn=nextn,
        rope_yarn_log_mul=as_f32(as_f32(log_mul) / as_f32(0.1)) if log_mul else 0.0,
        yarn_mscale_all_dims=arch == "deepseek2", gating=GATING[func],
        **glm4moe.moe_fields(get, common),
        n_lora_q=0 if lite else int(get("attention.q_lora_rank", None)),
        n_lora_kv=kv_lora, n_embd_head_k_mla=k_mla, n_embd_head_v_mla=v_mla)


def tensors(hp: HParams, arch: str = "deepseek2") -> dict[str, TensorSpec]:
    """load_arch_tensors, in its order; the NextN layers' tensors may be absent (a trunk-only
    file) and are never loaded."""
    n_embd, n_head = hp.n_embd, hp.n_head
    k_mla, v_mla, n_rot = hp.n_embd_head_k_mla, hp.n_embd_head_v_mla, hp.n_rot
    q_lora, kv_lora = hp.n_lora_q, hp.n_lora_kv
    name = lambda t, s="weight", bid=None: tn(arch, t, s, bid)   # noqa: E731
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n_embd)),
           name(T.OUTPUT_NORM): TensorSpec((n_embd,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n_embd), False)}
    for i in range(hp.n_layer_all):
        req = i < hp.n_layer
        out[name(T.ATTN_NORM, bid=i)] = TensorSpec((n_embd,), req)
        if q_lora:
            out[name(T.ATTN_Q_A_NORM, bid=i)] = TensorSpec((q_lora,), req)
        out[name(T.ATTN_KV_A_NORM, bid=i)] = TensorSpec((kv_lora,), req)
        if q_lora:
            out[name(T.ATTN_Q_A, bid=i)] = TensorSpec((q_lora, n_embd), req)
            out[name(T.ATTN_Q_B, bid=i)] = TensorSpec((n_head * k_mla, q_lora), req)
        else:
            out[name(T.ATTN_Q, bid=i)] = TensorSpec((n_head * k_mla, n_embd), req)
        out[name(T.ATTN_KV_A_MQA, bid=i)] = TensorSpec((kv_lora + n_rot, n_embd), req)
        out[name(T.ATTN_K_B, bid=i)] = TensorSpec((n_head, kv_lora, k_mla - n_rot), req)
        out[name(T.ATTN_V_B, bid=i)] = TensorSpec((n_head, v_mla, kv_lora), req)
        out[name(T.ATTN_OUT, bid=i)] = TensorSpec((n_embd, n_head * v_mla), req)
        out[name(T.FFN_NORM, bid=i)] = TensorSpec((n_embd,), req)
        if i < hp.n_layer_dense_lead:
            out[name(T.FFN_GATE, bid=i)] = TensorSpec((hp.n_ff, n_embd), req)
            out[name(T.FFN_DOWN, bid=i)] = TensorSpec((n_embd, hp.n_ff), req)
            out[name(T.FFN_UP, bid=i)] = TensorSpec((hp.n_ff, n_embd), req)
        else:
            n_exp, n_ff_exp = hp.n_expert, hp.n_ff_exp
            n_sh = n_ff_exp * hp.n_expert_shared
            out[name(T.FFN_GATE_INP, bid=i)] = TensorSpec((n_exp, n_embd), req)
            out[name(T.FFN_EXP_PROBS_B, "bias", i)] = TensorSpec((n_exp,), False)
            out[name(T.FFN_DOWN_EXP, bid=i)] = TensorSpec((n_exp, n_embd, n_ff_exp), req)
            out[name(T.FFN_GATE_EXP, bid=i)] = TensorSpec((n_exp, n_ff_exp, n_embd), req)
            out[name(T.FFN_UP_EXP, bid=i)] = TensorSpec((n_exp, n_ff_exp, n_embd), req)
            out[name(T.FFN_GATE_SHEXP, bid=i)] = TensorSpec((n_sh, n_embd), req)
            out[name(T.FFN_DOWN_SHEXP, bid=i)] = TensorSpec((n_embd, n_sh), req)
            out[name(T.FFN_UP_SHEXP, bid=i)] = TensorSpec((n_sh, n_embd), req)
        if i >= hp.n_layer:     # gguf lists no NextN tensors for deepseek2: its plain names
            plain = lambda t, bid: TENSOR_NAMES[t].format(bid=bid) + ".weight"   # noqa: E731
            out.update(nextn_tensors(hp, plain, i))
    return out


def kq_scale(d: Decoder) -> float:
    """mscale^2 / sqrt(key_length_mla), mscale from the context's attention factor with
    llama_context's 1 / (1 + 0.1 ln factor) cancelled (in float, in llama.cpp's order)."""
    f = np.float32
    hp, rope = d.hp, d.rope
    log_inv = f(np.log(np.float64(f(1.0) / f(rope["freq_scale"]))))     # logf
    attn_factor_org = f(rope["attn_factor"]) * (f(1.0) + f(0.1) * log_inv)
    mscale = attn_factor_org * (f(1.0) + f(0.1) * f(hp.rope_yarn_log_mul) * log_inv)
    return float(f(1.0) * mscale * mscale / np.sqrt(f(hp.n_embd_head_k_mla)))


def attention(d: Decoder, il: int, cur, scale: float):
    """The MLA block of deepseek2.cpp (is_mla, not OCR), up to and including wo."""
    from ggmlrun.models.graph.attention import build_attn_k

    hp, b, ctx = d.hp, d.b, d.ctx
    cb, n_tokens = b.cb, d.n_tokens
    k_mla, n_rot, kv_lora = hp.n_embd_head_k_mla, hp.n_rot, hp.n_lora_kv
    nope = hp.n_embd_head_qk_nope
    if hp.n_lora_q:
        q = cb(ctx.mul_mat(d.weight(T.ATTN_Q_A, il), cur), "q", il)
        q = cb(d.norm(q, d.weight(T.ATTN_Q_A_NORM, il), il), "q", il)
        q = cb(ctx.mul_mat(d.weight(T.ATTN_Q_B, il), q), "q", il)
    else:
        q = cb(ctx.mul_mat(d.weight(T.ATTN_Q, il), cur), "q", il)
    q = cb(b.reshape(q, (n_tokens, hp.n_head, k_mla)), "q", il)
    kv_pe = cb(ctx.mul_mat(d.weight(T.ATTN_KV_A_MQA, il), cur), "kv_cmpr_pe", il)
    row, item = kv_pe.strides[-2], TYPES[kv_pe.dtype].type_size
    kv_cmpr = cb(b.view(kv_pe, (n_tokens, kv_lora), (row, item)), "kv_cmpr", il)
    k_pe = cb(b.view(kv_pe, (n_tokens, 1, n_rot), (row, row, item), kv_lora * item), "k_pe", il)
    k_pe = cb(d.rope_ext(k_pe, None), "k_pe", il)
    kv_cmpr = cb(d.norm(kv_cmpr, d.weight(T.ATTN_KV_A_NORM, il), il), "kv_cmpr", il)
    q_steps = (q.strides[-3], q.strides[-2], q.strides[-1])
    q_nope = cb(b.view(q, (n_tokens, hp.n_head, nope), q_steps), "q_nope", il)
    q_pe = cb(b.view(q, (n_tokens, hp.n_head, n_rot), q_steps, nope * TYPES[q.dtype].type_size),
              "q_pe", il)
    q_pe = cb(d.rope_ext(q_pe, None), "q_pe", il)
    q_nope = cb(b.permute(q_nope, (1, 0, 2)), "q_nope_perm", il)
    absorbed = cb(ctx.mul_mat(d.weight(T.ATTN_K_B, il), q_nope), "q_nope_absorbed", il)
    absorbed = cb(b.permute(absorbed, (1, 0, 2)), "q_nope_absorbed_perm", il)
    q_cur = cb(b.op("concat", [absorbed, q_pe], (n_tokens, hp.n_head, kv_lora + n_rot), axis=2),
               "Qcur", il)
    kv_cmpr = cb(b.reshape(kv_cmpr, (n_tokens, 1, kv_lora)), "kv_cmpr_reshape", il)
    k_cur = cb(b.op("concat", [kv_cmpr, k_pe], (n_tokens, 1, kv_lora + n_rot), axis=2), "Kcur", il)
    v_cur = cb(kv_cmpr, "Vcur", il)
    return build_attn_k(ctx, d.cache, d.inputs, d.weight(T.ATTN_OUT, il), q_cur, k_cur, v_cur,
                        d.weight(T.ATTN_V_B, il), scale, il)


def build(d: Decoder):
    hp, b = d.hp, d.b
    if TYPES[d.cache.kv_type].is_block:
        raise InputError(f"a {d.cache.kv_type} KV cache is not built for {d.arch.name} (MLA) "
                         f"yet; use f16 or f32")
    d.inputs.pop("v_idxs")           # build_attn_inp_k: no V to store
    scale = kq_scale(d)
    inpL = d.inpL

    def ffn(il, cur):
        if il < hp.n_layer_dense_lead:
            return b.cb(d.ffn_swiglu(il, cur), "ffn_out", il)
        routed = b.cb(d.moe_ffn(il, cur, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                                norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                                gating=hp.gating,
                                exp_probs_b=d.optional(T.FFN_EXP_PROBS_B, il, "bias")),
                      "ffn_moe_out", il)
        shared = b.cb(d.ffn_swiglu(il, cur, up=T.FFN_UP_SHEXP, gate=T.FFN_GATE_SHEXP,
                                   down=T.FFN_DOWN_SHEXP), "ffn_shexp", il)
        return b.cb(d.add(routed, shared), "ffn_out", il)

    for il in range(hp.n_layer):
        d.add_kv_layer(il)
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        cur = attention(d, il, cur, scale)
        inpL = d.ffn_block(il, cur, inpL, ffn)
    return inpL


# a card's model: the optional tensors the real files carry, by name without "blk.<i>.": the
# routers' selection bias (DeepSeek-V3, GLM-4.7-Flash) and GLM-4.7-Flash's NextN block, kept in
# the file and never loaded (DeepSeek-V3's converter drops its MTP layer)
_NEXTN_CARRIED = ("attn_norm.weight", "attn_q_a_norm.weight", "attn_kv_a_norm.weight",
                  "attn_q_a.weight", "attn_q_b.weight", "attn_kv_a_mqa.weight",
                  "attn_k_b.weight", "attn_v_b.weight", "attn_output.weight", "ffn_norm.weight",
                  "ffn_gate_inp.weight", "ffn_down_exps.weight", "ffn_gate_exps.weight",
                  "ffn_up_exps.weight", "ffn_gate_shexp.weight", "ffn_down_shexp.weight",
                  "ffn_up_shexp.weight", "nextn.eh_proj.weight", "nextn.enorm.weight",
                  "nextn.hnorm.weight", "nextn.shared_head_norm.weight")

ARCH = Arch(name="deepseek2", rope_type=ROPE_TYPE_NORM, tensors=tensors, build=build,
            read_hparams=read_hparams,
            card_tensors=frozenset({"output.weight", "exp_probs_b.bias", *_NEXTN_CARRIED}),
            card_hparams={**glm4moe.ARCH.card_hparams,    # the same expert keys, then MLA's
                          "q_lora_rank": ("attention.q_lora_rank", False, None),
                          "kv_lora_rank": ("attention.kv_lora_rank", True, None),
                          "key_length_mla": ("attention.key_length_mla", True, None),
                          "value_length_mla": ("attention.value_length_mla", True, None),
                          "yarn_log_mul": ("rope.scaling.yarn_log_multiplier", False, None)})
