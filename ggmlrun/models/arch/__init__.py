"""The architecture registry: `general.architecture` -> how llama.cpp reads and builds it.

One short module per architecture (llama.cpp's src/models/<arch>.cpp), each an `Arch`
(models/arch/base.py): its hyperparameters beyond the common ones (llama_model_base::
load_hparams + the architecture's load_arch_hparams), its tensor table (load_arch_tensors: names
from the `gguf` package's tables, shapes from the hyperparameters, required or optional) and its
graph (the layer loop, on the shared pieces of models/graph/decoder.py).

An architecture is listed here only once its graph gives llama.cpp's recorded figures
(tests/data/llamacpp/figures.json); anything else is an input error naming the supported ones.

The stages below this one never look the registry up: whoever reads a model here hands the
entry down (hparams' read_hparams takes it; the graph's Decoder is given it by arch/build.py).
"""

from __future__ import annotations

from importlib import import_module

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.hparams.record import HParams, read_hparams

LLAMA_CPP = "llama-cpp-python 0.3.36 (ggml 0.25.3)"   # whose llama.cpp every builder follows

# general.architecture -> module defining ARCH, in the order they landed
_MODULES = {
    "llama": "ggmlrun.models.arch.llama",
    "qwen2": "ggmlrun.models.arch.qwen2",
    "qwen3": "ggmlrun.models.arch.qwen3",
    "mistral3": "ggmlrun.models.arch.mistral3",
    "phi3": "ggmlrun.models.arch.phi3",
    "gemma3": "ggmlrun.models.arch.gemma3",
    "gemma4": "ggmlrun.models.arch.gemma4",
    "qwen3moe": "ggmlrun.models.arch.qwen3moe",
    "glm4moe": "ggmlrun.models.arch.glm4moe",
    "qwen35": "ggmlrun.models.arch.qwen35",
    "gpt-oss": "ggmlrun.models.arch.gpt_oss",
    "qwen35moe": "ggmlrun.models.arch.qwen35moe",
    "deepseek2": "ggmlrun.models.arch.deepseek2",
    "qwen3vl": "ggmlrun.models.arch.qwen3vl",
    "qwen3vlmoe": "ggmlrun.models.arch.qwen3vlmoe",
    "lfm2": "ggmlrun.models.arch.lfm2",
    "lfm2moe": "ggmlrun.models.arch.lfm2moe",
    # the Mamba-2 hybrids
    "nemotron_h": "ggmlrun.models.arch.nemotron_h",
    "nemotron_h_moe": "ggmlrun.models.arch.nemotron_h_moe",
    "granitehybrid": "ggmlrun.models.arch.granitehybrid",
    # wave 2b (issue 32)
    "minimax-m2": "ggmlrun.models.arch.minimax_m2",
    "llama4": "ggmlrun.models.arch.llama4",
    "seed_oss": "ggmlrun.models.arch.seed_oss",
    "olmo2": "ggmlrun.models.arch.olmo2",
    "smollm3": "ggmlrun.models.arch.smollm3",
    "qwen3next": "ggmlrun.models.arch.qwen3next",
    "mistral4": "ggmlrun.models.arch.mistral4",
}
ARCHITECTURES = tuple(_MODULES)
_LOADED: dict = {}


def supported() -> tuple[str, ...]:
    return ARCHITECTURES


def get_arch(name: str, where: str | None = None):
    """The Arch for `name`; an unknown one is an input error listing the supported ones."""
    arch = _LOADED.get(name)
    if arch is None:
        module = _MODULES.get(name)
        if module is None:
            raise InputError(f"architecture '{name}' is not supported; ggmlrun builds llama.cpp's "
                             f"graph for: {', '.join(ARCHITECTURES)}", file=where)
        arch = _LOADED[name] = import_module(module).ARCH
    return arch


def from_metadata(fields: dict, arch: str = "llama", types: dict | None = None) -> HParams:
    """The hyperparameters of a model of `arch` (models/hparams/record.py read_hparams, with
    the architecture's registry entry handed down)."""
    return read_hparams(fields, get_arch(arch), types)


def tensor_shapes(hp: HParams, arch: str = "llama",
                  optional: tuple[str, ...] = ("output.weight",)) -> dict[str, tuple[int, ...]]:
    """The tensors a model of `arch` has, NumPy order (ggml's ne reversed), in llama.cpp's load
    order: every required one, and of the optional ones those named in `optional` (by default
    `output.weight`: a file without it ties the output to `token_embd.weight`)."""
    return {name: spec.shape for name, spec in get_arch(arch).tensors(hp).items()
            if spec.required is True or name in optional}


def llama_tensor_shapes(hp: HParams) -> dict[str, tuple[int, ...]]:
    """Every tensor a plain llama model has (tensor_shapes of llama)."""
    return tensor_shapes(hp, "llama")
