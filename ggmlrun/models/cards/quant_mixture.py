"""llama.cpp's quantization mixtures: the type its quantizer (src/llama-quant.cpp,
llama_tensor_get_type) gives each tensor of a file type such as Q4_K_M. A card names only the
file type; these rules give every tensor the type the real file has, so a card's bytes match
the file's without the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.ir.types import TYPES

# 2-D tensors llama.cpp's quantizer leaves in their converted type (llama-quant.cpp: "do not
# quantize Mamba/Kimi's small conv1d weights"); the converters write them f32
UNQUANTIZED = {"ssm_conv1d": "f32"}
ATTN_V_LIKE = ("attn_v", "attn_qkv")      # llama-quant.cpp's category_is_attn_v (no kv_b here)


@dataclass(frozen=True)
class Mixture:
    """One llama.cpp file type: the default weight type and whether its rules apply."""
    default: str
    quantized: bool


MIXTURES = {
    "f32": Mixture("f32", False), "f16": Mixture("f16", False), "bf16": Mixture("bf16", False),
    "q8_0": Mixture("q8_0", True), "q4_0": Mixture("q4_0", True), "q4_1": Mixture("q4_1", True),
    "q5_0": Mixture("q5_0", True), "q5_1": Mixture("q5_1", True), "q6_K": Mixture("q6_K", True),
    "q4_K_S": Mixture("q4_K", True), "q4_K_M": Mixture("q4_K", True),
    "q5_K_S": Mixture("q5_K", True), "q5_K_M": Mixture("q5_K", True),
    # LLAMA_FTYPE_MOSTLY_MXFP4_MOE (gpt-oss as ggml-org ships it): experts mxfp4, the rest q8_0
    "mxfp4_moe": Mixture("q8_0", True),
}

# tensor_type_fallback: a k-quant whose rows are not a whole number of 256-blocks
FALLBACK = {"q2_K": "q4_0", "q3_K": "q4_0", "q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0"}


def more_bits(i_layer: int, n_layer: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth, and every third between."""
    return (i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8
            or (i_layer - n_layer // 8) % 3 == 2)


def mixture_type(ftype: str, cls: str, layer: int, n_layer: int, *, is_70b: bool,
                 n_expert: int = 0) -> str:
    """The type llama.cpp's quantizer gives tensor class `cls` of `layer` (llama_tensor_get_type).

    Norms stay f32 (1-D tensors are never quantized); a plain float file type is uniform. For
    llama there is one attn_v and one ffn_down per layer, so the quantizer's running counters
    equal the layer index; with experts the layer is read from the name (layer_info), the same.
    A mixture of experts: the router (ffn_gate_inp) is never quantized (f32, as converted);
    ffn_down_exps is an ffn_down ("ffn_down" in its name), the gate and up experts take the
    default; with exactly 8 experts (Mixtral) attn_k and attn_v become q8_0 and, for q4_K_S and
    q4_K_M, attn_output q5_K.
    """
    mix = MIXTURES[ftype]
    if cls.endswith("norm") or cls == "ffn_gate_inp":
        return "f32"
    if cls in UNQUANTIZED:
        return UNQUANTIZED[cls]
    if ftype == "mxfp4_moe":           # 3-D tensors (ne[2] > 1: the experts) mxfp4, else q8_0
        return "mxfp4" if cls.endswith("_exps") else "q8_0"
    if cls.startswith("ffn_down"):     # ffn_down_exps, ffn_down_shexp: "ffn_down" in the name
        cls = "ffn_down"
    if not mix.quantized:
        return mix.default
    new = mix.default
    if cls == "output":
        return new if new == "q8_0" else "q6_K"
    if cls in ATTN_V_LIKE:               # category_is_attn_v: one of them per layer
        if ftype in ("q4_K_M", "q5_K_M") and more_bits(layer, n_layer):
            new = "q6_K"
        elif ftype == "q4_K_S" and layer < 4:
            new = "q5_K"
        if is_70b and new in ("q3_K", "q4_K"):
            new = "q5_K"          # 8 heads share attn_v in the 70B: more bits cost little
        if n_expert == 8:
            new = "q8_0"
    elif cls == "attn_k" and n_expert == 8:
        new = "q8_0"
    elif cls == "attn_output" and n_expert == 8 and ftype in ("q4_K_S", "q4_K_M"):
        new = "q5_K"
    elif cls == "ffn_down":
        if ftype in ("q4_K_M", "q5_K_M") and more_bits(layer, n_layer):
            new = "q6_K"
        elif ftype == "q4_K_S" and layer < n_layer // 8:
            new = "q5_K"
    return new


def fit_row(dtype: str, row: int) -> str:
    """tensor_type_fallback: a type whose block does not divide the row becomes a smaller one."""
    if row % TYPES[dtype].block_size == 0:
        return dtype
    smaller = FALLBACK.get(dtype, dtype)
    return smaller if row % TYPES[smaller].block_size == 0 else "f16"

