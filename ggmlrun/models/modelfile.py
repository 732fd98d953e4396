"""A GGUF model file's header: architecture, hyperparameters and the tensor table.

Read with the `gguf` package llama.cpp publishes (GGUFReader memory-maps the file, so no weight
byte is read here). Only the llama architecture is accepted: anything else is an input error
naming the architecture, as is a file `gguf` cannot parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggmlrun.core.ir.types import BY_ID
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.hparams import LlamaHParams, from_metadata, gguf_types, llama_tensor_shapes

GGUF_MAGIC = b"GGUF"
ARCHITECTURES = ("llama",)


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
    if arch not in ARCHITECTURES:
        raise InputError(f"architecture '{arch}' is not supported; ggmlrun builds llama.cpp's "
                         f"graph for: {', '.join(ARCHITECTURES)}", file=str(path))
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
    check_tensors(hparams, tensors, str(path))
    name = fields.get("general.name") or path.stem
    return ModelFile(path=path, arch=arch, name=str(name), hparams=hparams, tensors=tensors)


def check_tensors(hparams: LlamaHParams, tensors: dict[str, TensorInfo], where: str | None) -> None:
    """Every tensor llama.cpp requires, in the shape the hyperparameters give it
    (output.weight may be absent: the output is then tied to token_embd.weight)."""
    if hparams.n_layer * 9 > len(tensors):       # before listing a corrupt block_count's names
        raise InputError(f"block_count {hparams.n_layer} needs {hparams.n_layer * 9 + 3} "
                         f"tensors but the model has {len(tensors)}", file=where)
    for name, shape in llama_tensor_shapes(hparams).items():
        info = tensors.get(name)
        if info is None:
            if name == "output.weight":
                continue
            raise InputError(f"model lacks tensor '{name}', which a llama model needs",
                             file=where)
        if info.shape != shape:
            raise InputError(f"tensor '{name}' has shape {list(info.shape)}; the model's "
                             f"hyperparameters make it {list(shape)}", file=where)
