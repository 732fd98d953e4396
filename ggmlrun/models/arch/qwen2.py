"""llama.cpp's qwen2 graph (src/models/qwen2.cpp): llama's block with NeoX rope, Q/K/V biases
(optional, as for every architecture built on build_qkv), an optional output bias, and the
output tied to token_embd when the file has no output.weight (the small Qwen2.5 models)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, decoder_tensors, default_kq_scale

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def tensors(hp):
    return decoder_tensors("qwen2", hp, output_bias=True)


def build(d: Decoder):
    hp, b = d.hp, d.b
    kq_scale = default_kq_scale(hp)
    inpL = d.inpL
    for il in range(hp.n_layer):
        inpSA = inpL
        q, k, v = d.layer_qkv(il, inpL)
        q = b.cb(d.rope_ext(q, None), "Qcur", il)
        k = b.cb(d.rope_ext(k, None), "Kcur", il)
        b.cb(v, "Vcur", il)
        cur = d.attn(il, q, k, v, kq_scale)
        inpL = d.ffn_block(il, cur, inpSA)
    return inpL


# llama.cpp's LLM_TYPE_70B for qwen2 is 80 layers (Qwen2-72B), whatever the heads
ARCH = Arch(name="qwen2", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            is_70b=lambda hp: hp.n_layer == 80,
            card_tensors=frozenset({"output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias"}))
