"""llama.cpp's qwen3vlmoe graph (src/models/qwen3vlmoe.cpp; Qwen3-VL-30B-A3B, 235B-A22B):
qwen3moe's layers (build_moe_ffn, soft_max routing, weights normalised) with qwen3vl's IMROPE
sections and deepstack inputs (models/arch/qwen3vl.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.models.arch import qwen3moe, qwen3vl
from ggmlrun.models.arch.base import ROPE_TYPE_IMROPE, Arch, decoder_tensors, moe_tensors
from ggmlrun.models.hparams.record import HParams

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def read_hparams(get, common: dict) -> HParams:
    return qwen3moe.read_hparams(get, dict(common, **qwen3vl.vision_keys(get, common)))


def tensors(hp):
    return decoder_tensors("qwen3vlmoe", hp, q_k_norm=True,
                           ffn=lambda name, il: moe_tensors(hp, name, il))


def build(d: Decoder):
    return qwen3moe.build(d, layer_out=d.deepstack)


ARCH = Arch(name="qwen3vlmoe", rope_type=ROPE_TYPE_IMROPE, tensors=tensors, build=build,
            read_hparams=read_hparams, n_pos_per_embd=4,
            card_hparams=qwen3moe.ARCH.card_hparams | qwen3vl.CARD_HPARAMS)
