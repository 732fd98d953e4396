"""A GGUF model's header: architecture, hyperparameters and the tensor table.

The model is one file or a split set (gguf/source.py: local, a URL or an hf:// name; only the
headers are read). A set's shards form one model: the metadata is the first shard's (as
llama.cpp reads it), the tensors all the shards', each remembering its shard.

Read by `gguf_header` (gguf.cpp's and the model loader's checks, sizes against the file before
anything is allocated; no weight byte is read here). Only the architectures of the registry
(models/arch/) are accepted: anything else is an input error naming the architecture and the
supported ones. Every tensor must be one the architecture loads (its tensor table), in a type
ggmlrun has a kernel for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ggmlrun.core.ir.types import BY_ID, TYPES
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import ARCHITECTURES, from_metadata, get_arch
from ggmlrun.models.arch.base import check_tensors as check
from ggmlrun.models.gguf.header import FileStamp, shown
from ggmlrun.models.hparams.record import HParams, gguf_types

GGUF_MAGIC = b"GGUF"
# Weight types ggmlrun's kernels read (plain, or block types it decodes); q8_1 and q8_K (the
# activation formats of ggml's dot products) and anything newer are refused at load.
WEIGHT_TYPES = tuple(t for t in (
    "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K",
    "q6_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs",
    "iq1_m", "tq1_0", "tq2_0", "mxfp4", "nvfp4") if t in TYPES)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]      # NumPy order (GGUF/ggml ne reversed)
    dtype: str                  # ggml type name ("q4_K", "f16")
    offset: int | None          # absolute byte offset of the data in its file; None for cards
    shard: int = 0              # the file of a split set that holds it (0: the first, or only)


@dataclass(frozen=True)
class ShardFile:
    """A local shard's file as its header was read: what `run` maps and checks."""
    path: Path
    stamp: FileStamp
    data_end: int


@dataclass
class ModelFile:
    path: Path | None
    arch: str
    name: str
    hparams: HParams
    tensors: dict[str, TensorInfo]          # in file order
    stamp: FileStamp | None = None          # the file as its header was read (None: a card)
    data_end: int = 0                       # the file's bytes its tensors need
    source: str = ""                        # the name given (a path, URL or hf:// name)
    files: tuple[ShardFile, ...] = ()       # every local shard (a remote model: none)
    note: str | None = None                 # said on stderr (which shard of a set is first)
    kv: dict | None = None                  # the (first shard's) metadata; None for a card

    @property
    def label(self) -> str:
        return self.source or str(self.path)


def is_gguf(path: Path) -> bool:
    """By the 4-byte magic, never by the suffix."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def read_gguf(name, *, refresh: bool = False, stats=None) -> ModelFile:
    """The model a GGUF file or split set holds: `name` a Path (local), or a str that may be
    a URL or an hf:// name (gguf/source.py)."""
    from ggmlrun.models.gguf.source import read_headers

    return model_from_headers(read_headers(name, refresh=refresh, stats=stats))


def model_from_headers(headers) -> ModelFile:
    first = headers.shards[0]
    header = first.header
    where = first.name
    fields = header.kv
    if "general.architecture" not in fields:
        raise InputError("GGUF metadata lacks 'general.architecture'", file=where)
    arch = fields["general.architecture"]
    if header.kv_types["general.architecture"] != "str":
        raise InputError(f"key 'general.architecture' must be a string, not "
                         f"{header.kv_types['general.architecture']}", file=where)
    if arch not in ARCHITECTURES:      # the registry's (models/arch/)
        raise InputError(f"architecture '{shown(arch)}' is not supported; ggmlrun builds "
                         f"llama.cpp's graph for: {', '.join(ARCHITECTURES)}", file=where)
    try:
        hparams = from_metadata(fields, arch, gguf_types(header.kv_types, f"{arch}."))
    except InputError as err:
        raise err.located(file=where)
    except (ValueError, TypeError, OverflowError) as err:
        raise InputError(f"unreadable {arch} hyperparameters: {err}", file=where) from None
    tensors = {}
    for i, shard in enumerate(headers.shards):
        for t in shard.header.tensors:
            gtype = BY_ID[t.type_id]        # the header reader refused ids outside the table
            if gtype.name not in WEIGHT_TYPES:
                raise InputError(f"type {gtype.name}, which ggmlrun has no kernel for as a "
                                 f"weight (weights: {', '.join(WEIGHT_TYPES)})", file=shard.name,
                                 culprit=f"tensor '{shown(t.name)}'")
            tensors[t.name] = TensorInfo(t.name, tuple(reversed(t.ne)), gtype.name, t.offset, i)
    check_tensors(hparams, tensors, where, arch)
    name = fields.get("general.name")
    stem = first.path.stem if first.path else where.rsplit("/", 1)[-1].removesuffix(".gguf")
    name = shown(name) if isinstance(name, str) and name.strip() else stem
    files = tuple(ShardFile(s.path, s.header.stamp, s.header.data_end)
                  for s in headers.shards if s.path is not None)
    return ModelFile(path=first.path, arch=arch, name=name, hparams=hparams, tensors=tensors,
                     stamp=header.stamp, data_end=header.data_end, source=headers.name,
                     files=files, note=headers.note, kv=fields)


def expected_tensors(hp: HParams, arch: str = "llama"
                     ) -> tuple[dict[str, tuple[int, ...]], frozenset[str]]:
    """Every tensor the architecture loads (its tensor table, models/arch/), with its shape, and
    which of them may be absent (TENSOR_NOT_REQUIRED: the output, then tied to token_embd;
    biases; rope factors; separate Q/K/V when a fused attn_qkv is there)."""
    table = get_arch(arch).tensors(hp)
    return ({name: spec.shape for name, spec in table.items()},
            frozenset(name for name, spec in table.items() if spec.required is not True))


def check_tensors(hparams: HParams, tensors: dict[str, TensorInfo], where: str | None,
                  arch: str = "llama") -> None:
    """Every tensor llama.cpp requires for the architecture, in the shape the hyperparameters
    give it, and no other: llama.cpp's loader counts the tensors it made against the file's
    ("wrong number of tensors"), so a tensor the architecture does not load is refused too."""
    spec = get_arch(arch, where)
    table = check(spec, hparams, tensors, where)
    extra = next((name for name in tensors if name not in table), None)
    if extra is not None:
        raise InputError(f"tensor '{shown(extra)}' is not one a {arch} model with "
                         f"{hparams.n_layer} layers loads (llama.cpp: \"wrong number of "
                         f"tensors\"); ggmlrun builds only the tensors it knows", file=where)
