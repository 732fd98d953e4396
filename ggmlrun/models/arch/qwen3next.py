"""llama.cpp's qwen3next graph (src/models/qwen3next.cpp; Qwen3-Next-80B-A3B): qwen35moe's
hybrid layers and FFN (routed experts beside a sigmoid-gated shared expert) with NEOX rope (no
IMROPE sections, one position per token) and the differences delta_net_graph.Variant names:
beta and alpha split from one ssm_beta_alpha projection, the key heads repeat-interleaved to
the value heads, Qcur_full reshaped before its query / gate views. Only the attn_qkv /
attn_gate projections are read: legacy files with ssm_in (one fused qkvz projection) are not
supported."""

from __future__ import annotations

from ggmlrun.models.arch import delta_net, qwen35moe
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, TensorSpec
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    """load_arch_tensors: qwen35moe's, with ssm_beta_alpha in each delta-net layer."""
    name = lambda t, s="weight", bid=None: tn("qwen3next", t, s, bid)   # noqa: E731
    n = hp.n_embd
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n)),
           name(T.OUTPUT_NORM): TensorSpec((n,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n), False)}
    for il in range(hp.n_layer):
        out.update(delta_net.layer_tensors("qwen3next", hp, il, beta_alpha=True))
        out.update(qwen35moe.ffn_tensors(hp, name, il))
    out.update(delta_net.mtp_tensors("qwen3next", hp,
                                     lambda _, il: qwen35moe.ffn_tensors(hp, name, il), True))
    return out


def read_hparams(get, common: dict) -> HParams:
    return qwen35moe.read_hparams(get, common, sections=False)


def build(d):
    from ggmlrun.models.graph import delta_net as delta_net_graph

    var = delta_net_graph.Variant(beta_alpha=True, repeat_heads=True, q_reshape=True,
                                  embd_name="model.embed_tokens")
    return delta_net_graph.build(d, qwen35moe.moe_ffn, var)


ARCH = Arch(name="qwen3next", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams,
            rows_after_norm=True, hybrid=True, card_tensor=delta_net.card_tensor,
            n_ff_optional=True,
            card_hparams={k: v for k, v in qwen35moe.ARCH.card_hparams.items()
                          if k != "rope_sections"})
