"""Tensor names as llama.cpp spells them, from the `gguf` package's own tables.

`tn(arch, MODEL_TENSOR.X, suffix, bid)` is llama.cpp's tn(LLM_TENSOR_X, suffix, bid): the name
from gguf's MODEL_TENSORS / TENSOR_NAMES, never retyped; asking for a tensor gguf does not list
for the architecture is an error. Every stage above reads weights by these names (the graph
pieces, the architectures, placement), so they live here, below all of them.
"""

from __future__ import annotations

from ggmlrun.core.ir.types import gguf_constants

# gguf's tables without the gguf package's start-up (core/ir/types.py says why)
_CONSTANTS = gguf_constants()
MODEL_ARCH_NAMES, MODEL_TENSOR = _CONSTANTS.MODEL_ARCH_NAMES, _CONSTANTS.MODEL_TENSOR
MODEL_TENSORS, TENSOR_NAMES = _CONSTANTS.MODEL_TENSORS, _CONSTANTS.TENSOR_NAMES

_GGUF_ARCH = {name: arch for arch, name in MODEL_ARCH_NAMES.items()}


# llama.cpp's LLM_TENSOR_FFN_NORM is gguf's FFN_PRE_NORM for the architectures with post-norms
# (gemma3): one name, "blk.{bid}.ffn_norm", under either
_SAME_NAME = {MODEL_TENSOR.FFN_NORM: MODEL_TENSOR.FFN_PRE_NORM}
# tensors llama.cpp's loader creates for an architecture that the gguf package's table does not
# list for it (the qwen35 family's and qwen3next's MTP blocks: load_block_mtp); the
# names are still gguf's (TENSOR_NAMES)
_NEXTN = frozenset({MODEL_TENSOR.NEXTN_EH_PROJ, MODEL_TENSOR.NEXTN_ENORM, MODEL_TENSOR.NEXTN_HNORM,
                    MODEL_TENSOR.NEXTN_EMBED_TOKENS, MODEL_TENSOR.NEXTN_SHARED_HEAD_HEAD,
                    MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM})
# lfm2moe: the optional output (and ColBert's dense_2_out) llama_model_lfm2moe creates as
# lfm2's loader does
_LOADER_ONLY = {"qwen35": _NEXTN, "qwen35moe": _NEXTN, "qwen3next": _NEXTN,
                "lfm2moe": frozenset({MODEL_TENSOR.OUTPUT, MODEL_TENSOR.DENSE_2_OUT})}


def tn(arch: str, tensor: MODEL_TENSOR, suffix: str = "weight", bid: int | None = None) -> str:
    """llama.cpp's tn(LLM_TENSOR_X, suffix, bid): the name from gguf's own tables (no suffix
    when it is "", as for LLM_TENSOR_SSM_A_NOSCAN's "blk.N.ssm_a")."""
    listed = MODEL_TENSORS[_GGUF_ARCH[arch]]
    if tensor not in listed and _SAME_NAME.get(tensor) in listed:
        tensor = _SAME_NAME[tensor]
    if tensor not in listed and tensor not in _LOADER_ONLY.get(arch, ()):
        raise KeyError(f"gguf lists no {tensor.name} tensor for architecture {arch}")
    base = TENSOR_NAMES[tensor]
    return (base.format(bid=bid) if bid is not None else base) + ("." + suffix if suffix else "")
