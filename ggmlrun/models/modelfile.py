"""A GGUF model file's header: architecture, hyperparameters and the tensor table.

Read with the `gguf` package llama.cpp publishes (GGUFReader memory-maps the file, so no weight
byte is read here). Only the architectures of the registry (models/arch/) are accepted: anything
else is an input error naming the architecture and the supported ones, as is a file `gguf`
cannot parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggmlrun.core.ir.types import BY_ID
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import ARCHITECTURES, get_arch  # noqa: F401  (ARCHITECTURES re-exported)
from ggmlrun.models.hparams import LlamaHParams, from_metadata, gguf_types

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # NumPy order (GGUF/ggml ne reversed)
    dtype: str                  # ggml type name ("q4_K", "f16")
    offset: int | None          # absolute byte offset of the data in the file; None for cards


@dataclass
class ModelFile:
    path: Path | None
    arch: str
    name: str
    hparams: LlamaHParams
    tensors: dict[str, TensorInfo]          # in file order


def is_gguf(path: Path) -> bool:
    """By the 4-byte magic, never by the suffix."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _scalar_fields(reader, prefix: str) -> dict:
    """The architecture's own keys as plain values; big arrays (the vocabulary) are not decoded."""
    fields = {}
    for key, field in reader.fields.items():
        if key.startswith(prefix) or key == "general.name":
            fields[key] = field.contents()
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        fields["tokenizer.ggml.tokens"] = range(len(tokens.data))   # only its length is used
    return fields


def read_gguf(path: Path) -> ModelFile:
    from gguf import GGUFReader

    path = Path(path)
    try:
        reader = GGUFReader(path, "r")
    except (ValueError, OSError, IndexError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise InputError(f"not a readable GGUF file: {err}", file=str(path)) from None
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise InputError("GGUF metadata lacks 'general.architecture'", file=str(path))
    try:
        arch = arch_field.contents()
        fields = _scalar_fields(reader, f"{arch}.")
    except (ValueError, IndexError, TypeError, UnicodeDecodeError) as err:
        raise InputError(f"unreadable GGUF metadata: {err}", file=str(path)) from None
    get_arch(arch, str(path))      # an unsupported one: exit 2 listing ARCHITECTURES
    try:
        hparams = from_metadata(fields, arch, gguf_types(reader, f"{arch}."))
    except InputError as err:
        raise err.located(file=str(path))
    except (ValueError, TypeError, OverflowError) as err:
        raise InputError(f"unreadable {arch} hyperparameters: {err}", file=str(path)) from None
    tensors = {}
    for t in reader.tensors:
        gtype = BY_ID.get(int(t.tensor_type))
        if gtype is None:
            raise InputError(f"tensor '{t.name}' has GGUF type {int(t.tensor_type)}, which "
                             f"ggmlrun's type table lacks", file=str(path))
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        tensors[t.name] = TensorInfo(t.name, shape, gtype.name, int(t.data_offset))
    check_tensors(hparams, tensors, str(path), arch)
    name = fields.get("general.name") or path.stem
    return ModelFile(path=path, arch=arch, name=str(name), hparams=hparams, tensors=tensors)


def check_tensors(hparams: LlamaHParams, tensors: dict[str, TensorInfo], where: str | None,
                  arch: str = "llama") -> None:
    """Every tensor llama.cpp requires for the architecture (its tensor table, models/arch/), in
    the shape the hyperparameters give it; optional ones (output.weight: else tied to
    token_embd.weight; biases) are checked when present."""
    from ggmlrun.models.decoder import check_tensors as check

    check(get_arch(arch, where), hparams, tensors, where)
