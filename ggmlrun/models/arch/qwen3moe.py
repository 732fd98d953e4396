"""llama.cpp's qwen3moe graph (src/models/qwen3moe.cpp; Qwen3-30B-A3B, Qwen3-235B-A22B):
qwen3's attention (Q/K head norms, NeoX rope, a head size from attention.key_length), and in
place of the dense FFN a mixture of experts: build_moe_ffn with soft_max routing, the top
expert_used_count experts of expert_count, their weights normalised to sum to 1, SiLU-gated
experts of expert_feed_forward_length (default feed_forward_length / expert_used_count)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.models.arch import qwen3
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, decoder_tensors, moe_tensors
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def read_hparams(get, common: dict) -> HParams:
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    n_ff_exp = check_experts(common["arch"], n_expert, n_used, common["n_ff"],
                             int(get("expert_feed_forward_length", 0) or 0))
    return HParams(**common, n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp)


def tensors(hp):
    return decoder_tensors("qwen3moe", hp, q_k_norm=True,
                           ffn=lambda name, il: moe_tensors(hp, name, il))


def build(d: Decoder, layer_out=None):
    """qwen3's layers with build_moe_ffn in place of the dense FFN (`layer_out`: qwen3.build's)."""
    hp = d.hp
    return qwen3.build(d, ffn=lambda il, cur: d.moe_ffn(il, cur, n_expert=hp.n_expert,
                                                       n_expert_used=hp.n_expert_used,
                                                       norm_w=True), layer_out=layer_out)


ARCH = Arch(name="qwen3moe", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams,
            card_hparams={"n_expert": ("expert_count", True, None),
                          "n_expert_used": ("expert_used_count", True, None),
                          "n_ff_exp": ("expert_feed_forward_length", False, None)})
