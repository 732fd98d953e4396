"""llama.cpp's mistral3 graph (src/models/mistral3.cpp; Ministral 3): llama's block, plus
Llama 4's attention temperature when attention.temperature_scale is set: an input
`inp_attn_scale` [n_tokens, 1, 1] of log(floor(pos / n_ctx_orig_yarn) + 1) * scale + 1 that
multiplies Q after rope. Its load_arch_hparams also reads YaRN's beta_fast, beta_slow and
log multiplier (the rope scaling itself is every architecture's: models/graph/decoder.py rope_params).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.base import ROPE_TYPE_NORM, Arch, decoder_tensors
from ggmlrun.models.arch import llama
from ggmlrun.models.hparams.record import HParams

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def read_hparams(get, common: dict) -> HParams:
    temp = float(get("attention.temperature_scale", 0.0) or 0.0)
    hp = dict(common,
              yarn_beta_fast=float(get("rope.scaling.yarn_beta_fast", 32.0)),
              yarn_beta_slow=float(get("rope.scaling.yarn_beta_slow", 1.0)),
              rope_yarn_log_mul=float(get("rope.scaling.yarn_log_multiplier", 0.0)),
              attn_temp_scale=temp)
    if temp:
        floor = common.get("n_ctx_orig_yarn") or common["n_ctx_train"]
        if not floor:
            raise InputError("invalid n_ctx_orig_yarn for attention temperature scaling")
        hp["n_attn_temp_floor_scale"] = floor
    return HParams(**hp)


def attn_temperature(hp: HParams, pos):
    """llm_graph_input_attn_temp::set_input: log(floor((pos + offset) / n) + 1) * scale + 1
    per token (the offset 0 here, llama4's 1)."""
    import numpy as np

    p = np.asarray(pos, dtype=np.float32) + np.float32(hp.attn_temp_offset)
    floor = np.floor(p / np.float32(hp.n_attn_temp_floor_scale)).astype(np.float64)
    out = np.log(floor + 1.0) * np.float32(hp.attn_temp_scale) + 1.0
    return out.astype(np.float32).reshape(len(p), 1, 1)


def tensors(hp):
    """load_arch_tensors (dense): optional wo and FFN biases, rope_freqs."""
    return decoder_tensors("mistral3", hp, rope_freqs=True, attn_out_bias=True, ffn_bias=True)


def build(d: Decoder):
    """llama's layers, Q scaled by the attention temperature when the hparams ask for it."""
    hp, b = d.hp, d.b
    if not hp.attn_temp_scale:
        return llama.build(d)
    # build_inp_attn_scale: ne [1, 1, n_tokens]
    attn_scale = d.inputs["attn_scale"] = b.cb(b.leaf("inp_attn_scale", (d.n_tokens, 1, 1), "f32"),
                                               "inp_attn_scale", -1)
    d.extra_inputs[attn_scale] = lambda pos: attn_temperature(hp, pos)
    return llama.build(d, scale_q=lambda il, q: b.cb(b.op("mul", [q, attn_scale], q.shape),
                                                     "Qcur_attn_temp_scaled", il))


ARCH = Arch(name="mistral3", rope_type=ROPE_TYPE_NORM, tensors=tensors, build=build,
            read_hparams=read_hparams,
            card_hparams={"attn_temp_scale": ("attention.temperature_scale", False, None),
                          "yarn_log_mul": ("rope.scaling.yarn_log_multiplier", False, None)})
