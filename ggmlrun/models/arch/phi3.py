"""llama.cpp's phi3 graph (src/models/phi3.cpp): a fused attn_qkv read as three strided views
(build_qkv), Q scaled by 1/sqrt(head) before attention (then a KQ scale of 1), a fused gate/up
ffn_up of 2 n_ff rows and a one-source swiglu over its halves, and LongRoPE: the long or short
frequency factors (chosen by the context against the original one) as rope's third source, one
copy in each layer's buffer. The residual adds are (residual + FFN), in llama.cpp's order."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, decoder_tensors

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def tensors(hp):
    return decoder_tensors("phi3", hp, fused_qkv=True, fused_gate_up=True, longrope=True)


def build(d: Decoder):
    hp, b, ctx = d.hp, d.b, d.ctx
    hd = hp.n_embd_head_v
    inpL = d.inpL
    for il in range(hp.n_layer):
        d.add_kv_layer(il)
        residual = inpL
        factors = d.rope_factors(il)
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        q, k, v = d.qkv(il, cur, hd, hp.n_head, hp.n_head_kv)
        q = b.cb(d.rope_ext(q, factors), "Qcur", il)
        k = b.cb(d.rope_ext(k, factors), "Kcur", il)
        b.cb(v, "Vcur", il)
        q = b.cb(b.op("scale", [q], q.shape, s=1.0 / math.sqrt(float(hd))), "Qcur", il)
        cur = d.attn(il, q, k, v, 1.0)
        cur, residual = d.last_rows(il, cur, residual)
        cur = d.add(cur, residual)
        residual = cur
        cur = b.cb(d.norm(cur, d.weight(T.FFN_NORM, il), il), "ffn_norm", il)
        # build_ffn(up, -, down, LLM_FFN_SWIGLU, LLM_FFN_SEQ): swiglu over up's two halves
        up = b.cb(ctx.mul_mat(d.weight(T.FFN_UP, il), cur), "ffn_up", il)
        act = b.cb(b.op("glu", [up], (*up.shape[:-1], up.shape[-1] // 2), op="swiglu",
                        swapped=False), "ffn_swiglu", il)
        cur = b.cb(ctx.mul_mat(d.weight(T.FFN_DOWN, il), act), "ffn_out", il)
        inpL = b.cb(d.add(residual, cur), "l_out", il)
    return inpL


ARCH = Arch(name="phi3", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build, longrope=True,
            card_tensors=frozenset({"output.weight", "attn_qkv.weight"}))
