"""llama.cpp's llama graph (src/models/llama.cpp, llama.cpp vendored by llama-cpp-python 0.3.36).

The layer loop only: inputs, attention, FFN and the output head are llm_graph_context's, in
models/graph/decoder.py and models/graph/output.py. Every call below is one of llama.cpp's, in its
order, so the nodes, their order and their names are llama.cpp's: a change here should be
read against that file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.models.arch.base import ROPE_TYPE_NORM, Arch, decoder_tensors, default_kq_scale

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def tensors(hp):
    """load_arch_tensors (dense): optional Q/K/V, wo and FFN biases, Llama 3's rope_freqs."""
    return decoder_tensors("llama", hp, rope_freqs=True, attn_out_bias=True, ffn_bias=True)


def build(d: Decoder, scale_q=None, ffn_norm=None, roped=None):
    """llama's layers; `scale_q(il, q)` changes Q after rope (mistral3's attention
    temperature), the one place mistral3's layers differ; `ffn_norm` the FFN norm's tensor and
    name where they are not ffn_norm (seed_oss's attn_post_norm); `roped(il)` whether layer
    il ropes Q and K (smollm3's NoPE layers do not; default every layer)."""
    hp, b = d.hp, d.b
    kq_scale = default_kq_scale(hp)
    inpL = d.inpL
    for il in range(hp.n_layer):
        inpSA = inpL
        q, k, v = d.layer_qkv(il, inpL)
        if roped is None or roped(il):
            factors = d.rope_factors(il)
            q, k = d.rope_ext(q, factors), d.rope_ext(k, factors)
        q, k = b.cb(q, "Qcur", il), b.cb(k, "Kcur", il)
        b.cb(v, "Vcur", il)
        if scale_q is not None:
            q = scale_q(il, q)
        cur = b.cb(d.attn(il, q, k, v, kq_scale), "attn_out", il)
        inpL = (d.ffn_block(il, cur, inpSA) if ffn_norm is None
                else d.ffn_block(il, cur, inpSA, norm=ffn_norm))
    return inpL


ARCH = Arch(name="llama", rope_type=ROPE_TYPE_NORM, tensors=tensors, build=build,
            is_70b=lambda hp: hp.n_layer == 80 and hp.n_head != hp.n_head_kv)

