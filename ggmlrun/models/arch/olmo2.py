"""llama.cpp's olmo2 graph (src/models/olmo2.cpp; OLMo 2): no norm before attention; Q and K
RMS-normed over their whole width (as minimax-m2: build_qkv without its reshape, attn_q_norm
n_embd wide, attn_k_norm n_head_kv heads wide), NeoX rope, then norms after the attention and
after the FFN (post_attention_norm, post_ffw_norm: the latter through build_norm with layer -1,
so neither named "norm-<il>" nor pinned), each before its residual. Heads are n_embd / n_head
wide; output.weight is required. With attention.sliding_window set (OLMo 3) layers slide by
attention.sliding_window_pattern (default 4: three of four) into llama_kv_cache_iswa's SWA
cache, and rope without the context's scaling there (freq_scale 1, ext_factor 0, attn_factor
1; the context's frequency base all the same)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, TensorSpec
from ggmlrun.models.arch.gemma3 import read_swa
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def read_hparams(get, common: dict) -> HParams:
    arch = common["arch"]
    head = common["n_embd"] // common["n_head"]
    if common["n_embd_head_k"] != head or common["n_embd_head_v"] != head:
        raise InputError(f"{arch} heads must be embedding_length / head_count = {head} wide "
                         f"(llama.cpp shapes its tensors so); attention.key_length / "
                         f"value_length say {common['n_embd_head_k']} / "
                         f"{common['n_embd_head_v']}")
    return HParams(**common, **read_swa(get, common["n_layer"], 4))


def tensors(hp) -> dict[str, TensorSpec]:
    n_embd, n_kv = hp.n_embd, hp.n_embd_k_gqa
    name = lambda t, s="weight", bid=None: tn("olmo2", t, s, bid)   # noqa: E731
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n_embd)),
           name(T.OUTPUT_NORM): TensorSpec((n_embd,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n_embd))}
    for i in range(hp.n_layer):
        for t, n in ((T.ATTN_Q, n_embd), (T.ATTN_K, n_kv), (T.ATTN_V, n_kv)):
            out[name(t, bid=i)] = TensorSpec((n, n_embd))
        for t, n in ((T.ATTN_Q, n_embd), (T.ATTN_K, n_kv), (T.ATTN_V, n_kv)):
            out[name(t, "bias", i)] = TensorSpec((n,), False)
        out[name(T.ATTN_OUT, bid=i)] = TensorSpec((n_embd, n_embd))
        out[name(T.ATTN_Q_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.ATTN_K_NORM, bid=i)] = TensorSpec((n_kv,))
        out[name(T.ATTN_POST_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.FFN_GATE, bid=i)] = TensorSpec((hp.n_ff, n_embd))
        out[name(T.FFN_UP, bid=i)] = TensorSpec((hp.n_ff, n_embd))
        out[name(T.FFN_DOWN, bid=i)] = TensorSpec((n_embd, hp.n_ff))
        out[name(T.FFN_POST_NORM, bid=i)] = TensorSpec((n_embd,))
    return out


def build(d: Decoder):
    hp, b, n_tokens = d.hp, d.b, d.n_tokens
    hd = hp.n_embd_head_k
    swa_rope = dict(d.rope, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0)
    inpL = d.inpL
    for il in range(hp.n_layer):
        inpSA = inpL
        rope = swa_rope if hp.is_swa(il) else None
        d.add_kv_layer(il)
        q, k, v = d.qkv(il, inpL, hd, hp.n_head, hp.n_head_kv, reshape=False)
        q = b.cb(d.norm(q, d.weight(T.ATTN_Q_NORM, il), il), "Qcur_normed", il)
        k = b.cb(d.norm(k, d.weight(T.ATTN_K_NORM, il), il), "Kcur_normed", il)
        q = b.cb(d.rope_ext(b.reshape(q, (n_tokens, hp.n_head, hd)), None, rope), "Qcur", il)
        k = b.cb(d.rope_ext(b.reshape(k, (n_tokens, hp.n_head_kv, hd)), None, rope), "Kcur",
                 il)
        v = b.cb(b.reshape(v, (n_tokens, hp.n_head_kv, hd)), "Vcur", il)
        cur = d.attn(il, q, k, v, 1.0 / math.sqrt(float(hd)))
        cur, inpSA = d.last_rows(il, cur, inpSA)
        cur = b.cb(d.norm(cur, d.weight(T.ATTN_POST_NORM, il), il), "attn_post_norm", il)
        ffn_inp = b.cb(d.add(cur, inpSA), "ffn_inp", il)
        cur = b.cb(d.ffn_swiglu(il, ffn_inp), "ffn_out", il)
        cur = b.cb(d.norm(cur, d.weight(T.FFN_POST_NORM, il), -1), "ffn_post_norm", -1)
        inpL = b.cb(d.add(cur, ffn_inp), "l_out", il)
    return inpL


ARCH = Arch(name="olmo2", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams,
            card_hparams={"n_swa": ("attention.sliding_window", False, None),
                          "swa_pattern": ("attention.sliding_window_pattern", False, None)})
