"""llama.cpp's qwen3vl graph (src/models/qwen3vl.cpp; Qwen3-VL's text model, 2B to 32B):
qwen3's layers with two differences. The rope is IMROPE (ggml_rope_multi, four positions per
token, rope.dimension_sections picking each rotated pair's; for text the first three are the
token's position, the fourth 0), over the whole head. And the input embeddings are
n_embd * (1 + n_deepstack_layers) wide: the vision encoder's deepstack features ride along, and
each of the first n_deepstack_layers layers adds its slice to its output ("deepstack_out"); for
token input the token rows are padded with zeros to that width (a pad node, a wider inp_embd)
and the zeros are added all the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import qwen3
from ggmlrun.models.arch.base import ROPE_TYPE_IMROPE, Arch, decoder_tensors
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_rope_sections

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder

# a card's own keys: card key -> (GGUF key under the architecture, required, default)
CARD_HPARAMS = {"rope_sections": ("rope.dimension_sections", True, None),
                "n_deepstack_layers": ("n_deepstack_layers", False, None)}


def vision_keys(get, common: dict) -> dict:
    """load_arch_hparams' keys beyond qwen3's: the IMROPE sections (required) and the
    deepstack layers (default 0). A deepstack layer must not be the last: there only the
    output rows go on, and llama.cpp's add of all n_tokens rows of the slice aborts."""
    n_deepstack = int(get("n_deepstack_layers", 0) or 0)
    if n_deepstack >= common["n_layer"]:
        raise InputError(f"{common['arch']}.n_deepstack_layers {n_deepstack} must be less than "
                         f"block_count {common['n_layer']} (the last layer keeps only the "
                         f"output rows, which llama.cpp's deepstack add cannot take)")
    return dict(n_deepstack_layers=n_deepstack,
                rope_sections=check_rope_sections(get("rope.dimension_sections"),
                                                  common["n_rot"]))


def read_hparams(get, common: dict) -> HParams:
    return HParams(**common, **vision_keys(get, common))


def build(d: Decoder):
    return qwen3.build(d, layer_out=d.deepstack)


ARCH = Arch(name="qwen3vl", rope_type=ROPE_TYPE_IMROPE,
            tensors=lambda hp: decoder_tensors("qwen3vl", hp, q_k_norm=True),
            build=build, read_hparams=read_hparams, n_pos_per_embd=4,
            card_hparams=CARD_HPARAMS)
