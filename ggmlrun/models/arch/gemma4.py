"""llama.cpp's gemma4 graph, dense (src/models/gemma4.cpp): gemma3's block (embeddings scaled by
sqrt(n_embd), Q/K head norms, post-norms, GEGLU, softcapped logits, tied output) with

- per-layer shapes: heads, KV heads and FFN widths from per-layer arrays; sliding layers (a
  bool per layer, `attention.sliding_window_pattern`) with their own head size and rotary
  dimensions (`attention.key_length_swa`, `rope.dimension_count_swa`) and rope base;
- full layers rotating with `rope_freqs` (proportional rope), made with the first full layer
  and duplicated into the other full layers' buffers;
- V normed without a weight (a bare rms_norm); a layer without `attn_v` uses K as V;
- KV sharing: the last `attention.shared_kv_layers` layers have no cache and attend over the
  cache of the last full (or sliding) layer before them;
- per-layer embeddings (`embedding_length_per_layer_input` > 0): a second token input whose
  rows of `per_layer_token_embd` (on the CPU) are projected with the embeddings, one slice per
  layer gated into that layer's output;
- an optional scalar per layer (`layer_output_scale`);
- every row through the output norm (`h_nextn`, an output), then the output rows
  (`result_norm`), as llama.cpp does without masked nextn embeddings.

A layer with a router (`ffn_gate_inp`, Gemma-4-26B-A4B) adds routed experts beside its dense FFN:
models/arch/gemma4_moe.py.

Without flash attention every layer's V cache rows are the widest layer's (n_embd_v_gqa_max),
a narrower layer's V padded with zeros (ggml_pad) before it is stored.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import gemma4_moe
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, TensorSpec
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder

ARCH_NAME = "gemma4"


def read_hparams(get, common: dict) -> HParams:
    arrays = getattr(get, "arrays", {})
    n_layer = common["n_layer"]
    pattern = get("attention.sliding_window_pattern")
    if not isinstance(pattern, tuple) or len(pattern) != n_layer:
        raise InputError(f"{ARCH_NAME}.attention.sliding_window_pattern must be an array of one "
                         f"bool per layer ({n_layer})")
    shared = get("attention.shared_kv_layers", 0)
    from_start = n_layer - shared
    if from_start < 2:
        raise InputError(f"{ARCH_NAME}.attention.shared_kv_layers {shared} leaves fewer than 2 "
                         f"layers with a cache (llama.cpp asserts n_layer_kv_from_start >= 2)")
    if shared and (pattern[from_start - 1] or not pattern[from_start - 2]):
        raise InputError(f"{ARCH_NAME}: the KV-shared layers read layers {from_start - 2} "
                         f"(sliding) and {from_start - 1} (full), which the pattern does not "
                         f"make so")
    head_swa = get("attention.key_length_swa")
    if get("attention.value_length_swa") != head_swa:
        raise InputError(f"{ARCH_NAME} requires n_embd_head_k_swa == n_embd_head_v_swa")
    per = {key: arrays.get(gguf, (common[key],) * n_layer)
           for key, gguf in (("n_head", "attention.head_count"),
                             ("n_head_kv", "attention.head_count_kv"),
                             ("n_ff", "feed_forward_length"))}
    for il in range(n_layer):
        if not per["n_head_kv"][il] or per["n_head"][il] % per["n_head_kv"][il]:
            raise InputError(f"{ARCH_NAME}: layer {il}'s {per['n_head'][il]} heads are not a "
                             f"multiple of its {per['n_head_kv'][il]} KV heads")
    n_rot_swa = get("rope.dimension_count_swa", common["n_rot"])
    if n_rot_swa % 2 or n_rot_swa > head_swa:
        raise InputError(f"{ARCH_NAME}.rope.dimension_count_swa {n_rot_swa} must be even and at "
                         f"most the sliding head size {head_swa}")
    common = dict(common, n_head=max(per["n_head"]), n_ff=max(per["n_ff"]))
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    n_ff_exp = arrays.get("expert_feed_forward_length") or (get("expert_feed_forward_length", 0),)
    n_ff_exp = int(n_ff_exp[0] or 0)
    if n_expert and not 0 < n_used <= n_expert:
        raise InputError(f"{ARCH_NAME}.expert_used_count {n_used} must be from 1 to "
                         f"expert_count {n_expert}")
    if n_expert and n_ff_exp <= 0:
        raise InputError(f"{ARCH_NAME}.expert_feed_forward_length must be positive with experts")
    return HParams(
        **common, n_swa=get("attention.sliding_window"), swa_layers=pattern,
        rope_freq_base_swa=float(get("rope.freq_base_swa", 10000.0)),
        f_final_logit_softcapping=float(get("final_logit_softcapping", 0.0)),
        n_head_arr=per["n_head"], n_head_kv_arr=per["n_head_kv"], n_ff_arr=per["n_ff"],
        n_embd_head_k_swa=head_swa, n_rot_swa=n_rot_swa, n_layer_kv_from_start=from_start,
        n_embd_per_layer=get("embedding_length_per_layer_input"),
        rope_freqs_layers=tuple(il for il in range(n_layer) if not pattern[il]),
        n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp)


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    """load_arch_tensors (dense layers), in llama.cpp's order."""
    name = lambda t, s="weight", bid=None: tn(ARCH_NAME, t, s, bid)   # noqa: E731
    n_embd, ple = hp.n_embd, hp.n_embd_per_layer
    out = {name(T.OUTPUT): TensorSpec((hp.n_vocab, n_embd), False),
           name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n_embd))}
    if ple:
        out[name(T.PER_LAYER_TOKEN_EMBD)] = TensorSpec((hp.n_vocab, ple * hp.n_layer))
        out[name(T.PER_LAYER_MODEL_PROJ)] = TensorSpec((ple * hp.n_layer, n_embd))
        out[name(T.PER_LAYER_PROJ_NORM)] = TensorSpec((ple,))
    out[name(T.OUTPUT_NORM)] = TensorSpec((n_embd,))
    for i in range(hp.n_layer):
        hd, kv = hp.head(i), hp.has_kv(i)
        out[name(T.ATTN_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.ATTN_Q, bid=i)] = TensorSpec((hd * hp.heads(i), n_embd))
        out[name(T.ATTN_K, bid=i)] = TensorSpec((hp.n_embd_k_gqa_l(i), n_embd), kv)
        out[name(T.ATTN_V, bid=i)] = TensorSpec((hp.n_embd_k_gqa_l(i), n_embd), False)
        out[name(T.ATTN_OUT, bid=i)] = TensorSpec((n_embd, hd * hp.heads(i)))
        out[name(T.ATTN_Q_NORM, bid=i)] = TensorSpec((hd,))
        out[name(T.ATTN_K_NORM, bid=i)] = TensorSpec((hd,), kv)
        out[name(T.ATTN_POST_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.LAYER_OUT_SCALE, bid=i)] = TensorSpec((1,), False)
        if not hp.is_swa(i) and name(T.ROPE_FREQS) not in out:
            out[name(T.ROPE_FREQS)] = TensorSpec((hd // 2,))
        out[name(T.FFN_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.FFN_GATE, bid=i)] = TensorSpec((hp.ff(i), n_embd))
        out[name(T.FFN_UP, bid=i)] = TensorSpec((hp.ff(i), n_embd))
        out[name(T.FFN_DOWN, bid=i)] = TensorSpec((n_embd, hp.ff(i)))
        out[name(T.FFN_POST_NORM, bid=i)] = TensorSpec((n_embd,))
        out.update(gemma4_moe.expert_tensors(hp, name, i))
        if ple:
            out[name(T.PER_LAYER_INP_GATE, bid=i)] = TensorSpec((ple, n_embd))
            out[name(T.PER_LAYER_PROJ, bid=i)] = TensorSpec((n_embd, ple))
            out[name(T.PER_LAYER_POST_NORM, bid=i)] = TensorSpec((n_embd,))
    out.update(gemma4_moe.expert_scales(hp, name))
    return out


def per_layer_inputs(d: Decoder, inpL):
    """build_inp_per_layer + project_per_layer_inputs: [n_layer, T, n_embd_per_layer]."""
    hp, b, n_tokens = d.hp, d.b, d.n_tokens
    ple, n_layer = hp.n_embd_per_layer, hp.n_layer
    tokens = d.inputs["ple_tokens"] = b.leaf("", (n_tokens,), "i32")      # unnamed, as llama.cpp's
    sel = b.op("get_rows", [d.weight(T.PER_LAYER_TOKEN_EMBD), tokens], (n_tokens, ple * n_layer))
    sel = b.reshape(sel, (n_tokens, n_layer, ple))
    sel = b.cb(b.op("scale", [sel], sel.shape, s=math.sqrt(ple)), "inp_per_layer_selected", -1)
    b.expand(sel)
    return sel


def project_per_layer(d: Decoder, inp_batch, selected):
    hp, b, ctx, n_tokens = d.hp, d.b, d.ctx, d.n_tokens
    ple, n_layer = hp.n_embd_per_layer, hp.n_layer
    proj = ctx.mul_mat(d.weight(T.PER_LAYER_MODEL_PROJ), inp_batch)
    proj = b.op("scale", [proj], proj.shape, s=1.0 / math.sqrt(float(hp.n_embd)))
    proj = b.reshape(proj, (n_tokens, n_layer, ple))
    proj = b.cb(d.norm(proj, d.weight(T.PER_LAYER_PROJ_NORM), -1), "per_layer_proj", -1)
    cur = b.op("add", [proj, selected], proj.shape)
    cur = b.cb(b.op("scale", [cur], cur.shape, s=1.0 / math.sqrt(2.0)), "inp_per_layer", -1)
    return b.cont(b.permute(cur, (1, 0, 2)))


def build(d: Decoder):
    hp, b, ctx, n_tokens = d.hp, d.b, d.ctx, d.n_tokens
    inpL = b.cb(b.op("scale", [d.inpL], d.inpL.shape, s=math.sqrt(hp.n_embd)), "inp_scaled", -1)
    per_layer = None
    if hp.n_embd_per_layer:
        per_layer = project_per_layer(d, inpL, per_layer_inputs(d, inpL))
    for il in range(hp.n_layer):
        hd, n_head, n_head_kv = hp.head(il), hp.heads(il), hp.heads_kv(il)
        rope = dict(d.rope_for(il), n_dims=hp.rot(il))
        if hp.has_kv(il):
            d.add_kv_layer(il)
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        factors = None if hp.is_swa(il) else d.rope_factors(il)
        q = b.cb(ctx.mul_mat(d.weight(T.ATTN_Q, il), cur), "Qcur", il)
        q = b.reshape(q, (n_tokens, n_head, hd))
        q = b.cb(d.norm(q, d.weight(T.ATTN_Q_NORM, il), il), "Qcur_normed", il)
        q = b.cb(d.rope_ext(q, factors, rope), "Qcur_pos", il)
        if hp.has_kv(il):
            k = ctx.mul_mat(d.weight(T.ATTN_K, il), cur)
            wv = d.optional(T.ATTN_V, il)
            v = ctx.mul_mat(wv, cur) if wv is not None else k     # no v_proj: V is K
            b.cb(k, "Kcur", il)
            b.cb(v, "Vcur", il)
            k = b.reshape(k, (n_tokens, n_head_kv, hd))
            v = b.reshape(v, (n_tokens, n_head_kv, hd))
            k = d.norm(k, d.weight(T.ATTN_K_NORM, il), il)
            v = b.op("rms_norm", [v], v.shape, eps=hp.norm_rms_eps)
            b.cb(k, "Kcur_normed", il)
            b.cb(v, "Vcur_normed", il)
            k = b.cb(d.rope_ext(k, factors, rope), "Kcur_pos", il)
            cur = d.attn(il, q, k, v, 1.0)
        else:
            cur = d.attn(il, q, None, None, 1.0, kv_layer=hp.kv_source(il))
        cur = b.cb(d.norm(cur, d.weight(T.ATTN_POST_NORM, il), il), "attn_post_norm", il)
        attn_out = b.cb(d.add(cur, inpL), "attn_out", il)
        if d.optional(T.FFN_GATE_INP, il) is not None:
            cur = gemma4_moe.moe_layer_ffn(d, il, attn_out)
        else:
            cur = b.cb(d.norm(attn_out, d.weight(T.FFN_NORM, il), il), "ffn_norm", il)
            cur = b.cb(d.ffn_swiglu(il, cur, glu="geglu"), "ffn_out", il)
        cur = b.cb(d.norm(cur, d.weight(T.FFN_POST_NORM, il), -1), "ffn_post_norm", il)
        cur = d.add(cur, attn_out)
        if per_layer is not None:
            pe_in = b.cb(cur, "pe_in", il)
            cur = ctx.mul_mat(d.weight(T.PER_LAYER_INP_GATE, il), cur)
            cur = b.op("gelu", [cur], cur.shape, table=True)    # as ggml-cpu: its f16 table
            n_layer, rows, width = per_layer.shape
            item = TYPES[per_layer.dtype].type_size
            this = b.view(per_layer, (rows, width), (width * item, item), il * rows * width * item)
            cur = b.op("mul", [cur, this], cur.shape)
            cur = ctx.mul_mat(d.weight(T.PER_LAYER_PROJ, il), cur)
            cur = b.cb(d.norm(cur, d.weight(T.PER_LAYER_POST_NORM, il), il),
                       "per_layer_embd_out", il)
            cur = d.add(pe_in, cur)
        scale = d.optional(T.LAYER_OUT_SCALE, il)
        if scale is not None:
            cur = b.cb(b.op("mul", [cur, scale], cur.shape), "out_scaled", il)
        inpL = b.cb(cur, "l_out", il)
    return inpL


def card_tensor(name: str, hp: HParams) -> bool:
    """The optional tensors real Gemma 4 files carry: attn_v on the sliding layers (the full
    ones use K as V), each layer's output scale and, with experts, every layer's MoE block."""
    if hp.n_expert and gemma4_moe.card_tensor(name):
        return True
    if name.endswith(".attn_v.weight"):
        return hp.is_swa(int(name.split(".")[1]))
    return name.endswith(".layer_output_scale.weight")


ARCH = Arch(name=ARCH_NAME, rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams, card_tensors=frozenset(), rows_after_norm=True,
            card_tensor=card_tensor,
            card_hparams={"n_swa": ("attention.sliding_window", True, None),
                          "swa_pattern": ("attention.sliding_window_pattern", True, None),
                          "rope_freq_base_swa": ("rope.freq_base_swa", False, None),
                          "final_logit_softcapping": ("final_logit_softcapping", False, None),
                          "n_embd_head_k_swa": ("attention.key_length_swa", True, None),
                          "n_embd_head_v_swa": ("attention.value_length_swa", True, None),
                          "n_rot_swa": ("rope.dimension_count_swa", False, None),
                          "shared_kv_layers": ("attention.shared_kv_layers", False, None),
                          "n_embd_per_layer": ("embedding_length_per_layer_input", False, 0),
                          "n_expert": ("expert_count", False, None),
                          "n_expert_used": ("expert_used_count", False, None),
                          "n_ff_exp": ("expert_feed_forward_length", False, None)},
            per_layer=frozenset({"feed_forward_length", "attention.head_count",
                                 "attention.head_count_kv"}))
