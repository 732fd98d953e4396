"""llama.cpp's seed_oss graph (src/models/seed-oss.cpp; ByteDance Seed-OSS-36B): llama's block
with NeoX rope, optional Q/K/V biases (the real files have them), and the FFN's norm named
post_attention_norm (attn_post_norm) in place of ffn_norm; a tied output when the file has none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.models.arch import llama
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, TensorSpec
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def tensors(hp) -> dict[str, TensorSpec]:
    """load_arch_tensors, in its order (Q/K/V and attn_output before the layer's norms)."""
    n_embd, n_q, n_kv = hp.n_embd, hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa
    name = lambda t, s="weight", bid=None: tn("seed_oss", t, s, bid)   # noqa: E731
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n_embd)),
           name(T.OUTPUT_NORM): TensorSpec((n_embd,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n_embd), False)}
    for i in range(hp.n_layer):
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_kv), (T.ATTN_V, n_kv)):
            out[name(t, bid=i)] = TensorSpec((n, n_embd))
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_kv), (T.ATTN_V, n_kv)):
            out[name(t, "bias", i)] = TensorSpec((n,), False)
        out[name(T.ATTN_OUT, bid=i)] = TensorSpec((n_embd, n_q))
        out[name(T.ATTN_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.ATTN_POST_NORM, bid=i)] = TensorSpec((n_embd,))
        out[name(T.FFN_GATE, bid=i)] = TensorSpec((hp.n_ff, n_embd))
        out[name(T.FFN_UP, bid=i)] = TensorSpec((hp.n_ff, n_embd))
        out[name(T.FFN_DOWN, bid=i)] = TensorSpec((n_embd, hp.n_ff))
    return out


def build(d: Decoder):
    """llama's layers (seed-oss.cpp is llama.cpp's llama graph but for the FFN norm's name)."""
    return llama.build(d, ffn_norm=(T.ATTN_POST_NORM, "attn_post_norm"))


ARCH = Arch(name="seed_oss", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            card_tensors=frozenset({"attn_q.bias", "attn_k.bias", "attn_v.bias",
                                    "output.weight"}))
