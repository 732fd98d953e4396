"""llama.cpp's qwen3 graph (src/models/qwen3.cpp): qwen2's block without biases, a head size
from attention.key_length (independent of n_embd / n_head: Qwen3-32B has 64 heads of 128 over an
n_embd of 5120), and RMS norms over each Q and K head before rope. Those norms go through
build_norm, so their rms_norm nodes are named "norm-<il>" and llama.cpp's callback pins them to
the layer's device as it pins the block norms."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, decoder_tensors, default_kq_scale

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def tensors(hp):
    return decoder_tensors("qwen3", hp, q_k_norm=True)


def build(d: Decoder, ffn=None, layer_out=None):
    """qwen3's layers; `ffn(il, cur)` is the feed-forward block (default: the dense SwiGLU),
    the one place qwen3moe's layers differ; `layer_out(il, cur)` what follows `l_out`
    (qwen3vl's deepstack). The rope is the context's: qwen3vl's IMROPE sections with it."""
    hp, b = d.hp, d.b
    kq_scale = default_kq_scale(hp)
    inpL = d.inpL
    for il in range(hp.n_layer):
        inpSA = inpL
        q, k, v = d.layer_qkv(il, inpL)
        q = b.cb(d.norm(q, d.weight(T.ATTN_Q_NORM, il), il), "Qcur_normed", il)
        q = d.rope_ext(q, None)
        k = b.cb(d.norm(k, d.weight(T.ATTN_K_NORM, il), il), "Kcur_normed", il)
        k = d.rope_ext(k, None)
        b.cb(q, "Qcur", il)
        b.cb(k, "Kcur", il)
        b.cb(v, "Vcur", il)
        cur = d.attn(il, q, k, v, kq_scale)
        inpL = d.ffn_block(il, cur, inpSA, ffn)
        if layer_out is not None:
            inpL = layer_out(il, inpL)
    return inpL


ARCH = Arch(name="qwen3", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build)
