"""llama.cpp's qwen35 graph (src/models/qwen35.cpp; Qwen3.5 / 3.6 dense): a hybrid of gated
delta-net layers (a recurrent state, no KV cache) and, every full_attention_interval-th layer,
gated full attention with IMROPE; a post-attention norm and a dense SwiGLU FFN in every layer.
The shared pieces are models/arch/delta_net.py (hyperparameters, tensors) and
delta_net_graph.py (memory, both layer kinds)."""

from __future__ import annotations

from ggmlrun.models.arch import delta_net
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import Arch, TensorSpec
from ggmlrun.models.gguf.names import tn


def tensors(hp):
    """load_arch_tensors: token_embd, output_norm, optional output, then per layer its
    attention or delta-net tensors and the dense FFN, then the MTP blocks (optional: never
    loaded)."""
    name = lambda t, s="weight", bid=None: tn("qwen35", t, s, bid)   # noqa: E731

    def ffn(_, il: int) -> dict[str, TensorSpec]:
        return {name(T.FFN_GATE, bid=il): TensorSpec((hp.n_ff, hp.n_embd)),
                name(T.FFN_DOWN, bid=il): TensorSpec((hp.n_embd, hp.n_ff)),
                name(T.FFN_UP, bid=il): TensorSpec((hp.n_ff, hp.n_embd))}

    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, hp.n_embd)),
           name(T.OUTPUT_NORM): TensorSpec((hp.n_embd,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, hp.n_embd), False)}
    for il in range(hp.n_layer):
        out.update(delta_net.layer_tensors("qwen35", hp, il))
        out.update(ffn(None, il))
    out.update(delta_net.mtp_tensors("qwen35", hp, ffn))
    return out


def build(d):
    from ggmlrun.models.graph import delta_net as delta_net_graph

    return delta_net_graph.build(d, lambda d, cur, il: d.ffn_swiglu(il, cur))


ARCH = Arch(name="qwen35", rope_type=delta_net.ROPE_TYPE_IMROPE, tensors=tensors, build=build,
            read_hparams=delta_net.read_hparams, n_pos_per_embd=4, rows_after_norm=True,
            hybrid=True, card_tensor=delta_net.card_tensor, card_hparams=delta_net.CARD_HPARAMS)
