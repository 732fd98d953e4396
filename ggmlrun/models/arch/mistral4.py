"""llama.cpp's mistral4 (Mistral Small 4): llama_model_mistral4 subclasses
llama_model_deepseek2 and builds its graph (src/models/mistral4.cpp), so this module is
deepseek2's with the architecture's name (its GGUF keys and tensor table). What differs in
llama.cpp is outside the graph's code:

- llama_context's YaRN: the [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX] special case (mscale =
  mscale_all_dims) tests `arch == LLM_ARCH_DEEPSEEK2`, so mistral4 keeps mscale 1 and its
  rope's attention factor is mscale(s, 1) / mscale(s, log_mul) (hparams/rope.py); the KQ scale's
  formula is deepseek2's.
- build_moe_ffn sets GGML_PREC_F32 on the routed experts' down product (src1 can pass f16's
  range): a kernel precision, no tensor or buffer of its own.
"""

from __future__ import annotations

from dataclasses import replace

from ggmlrun.models.arch import deepseek2

NAME = "mistral4"


def read_hparams(get, common: dict):
    return deepseek2.read_hparams(get, common, NAME)


def tensors(hp):
    return deepseek2.tensors(hp, NAME)


ARCH = replace(deepseek2.ARCH, name=NAME, tensors=tensors, read_hparams=read_hparams)
