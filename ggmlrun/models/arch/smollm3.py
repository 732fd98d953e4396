"""llama.cpp's smollm3 graph (src/models/smollm3.cpp; SmolLM3-3B): llama's block where every
fourth layer has no rope (NoPE: llama.cpp fixes n_no_rope_layer_step at 4), a tied output when
the file has none; no attn_output bias (llama.cpp never creates one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.models.arch import llama
from ggmlrun.models.arch.base import ROPE_TYPE_NORM, Arch, decoder_tensors

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder

NO_ROPE_STEP = 4    # load_arch_hparams' n_no_rope_layer_step


def tensors(hp):
    return decoder_tensors("smollm3", hp)


def build(d: Decoder):
    """llama's layers, every NO_ROPE_STEP-th without rope."""
    return llama.build(d, roped=lambda il: (il + 1) % NO_ROPE_STEP != 0)


ARCH = Arch(name="smollm3", rope_type=ROPE_TYPE_NORM, tensors=tensors, build=build)
