"""ggml's type table: every tensor type, its block size and bytes per block.

Block types (q4_0, q4_K, ...) store `block_size` elements in `type_size` bytes, so a row of
n elements takes n / block_size * type_size bytes and n must be a multiple of the block. The
table is the one llama.cpp publishes in the `gguf` package (`GGML_QUANT_SIZES`), not retyped
here, so a new ggml type appears when `gguf` gains it. Names are ggml's own (`ggml_type_name`):
lower case, with the k-quants' capital K (`q4_K`).

Byte strides of a block-typed tensor follow ggml's `nb`: the innermost stride is one block
(`type_size`), the next one row, and so on. For plain types that is the familiar element stride.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ggmlrun.core.util.lazynumpy import np

# NumPy holds these directly (by its names for them); bf16 and the block types have no dtype.
_NUMPY = {"f32": "float32", "f16": "float16", "f64": "float64", "i8": "int8", "i16": "int16",
          "i32": "int32", "i64": "int64"}
_BY_NUMPY = {numpy: name for name, numpy in _NUMPY.items()}


@dataclass(frozen=True)
class GgmlType:
    name: str
    id: int                      # ggml_type / GGUF tensor type number
    block_size: int              # elements per block (1 for plain types)
    type_size: int               # bytes per block
    numpy_name: str | None       # NumPy's name for its dtype; None: bf16 and the block types

    @property
    def is_block(self) -> bool:
        return self.block_size > 1

    @property
    def is_float(self) -> bool:
        return self.numpy_name is None or self.numpy_name.startswith("float")

    @functools.cached_property
    def numpy(self) -> np.dtype | None:
        """The NumPy dtype (None: bf16 and the block types), made on first use: a graph load
        never needs it, and NumPy loads with it."""
        return np.dtype(self.numpy_name) if self.numpy_name else None

    def row_bytes(self, n: int) -> int:
        """Bytes of n contiguous elements (ggml_row_size); n must be a multiple of the block."""
        return n // self.block_size * self.type_size

    def contiguous_bytes(self, shape) -> int:
        """Bytes of a contiguous tensor of this shape (ggml_nbytes without strides)."""
        return self.row_bytes(math.prod(shape))


@functools.cache
def gguf_constants():
    """gguf's `constants` module alone: importing it the usual way runs the gguf package's
    __init__, which also loads its GGUF reader and writer, vocab and metadata code (30-40 ms of
    every command's start-up, none of it needed by a graph file or a model's header). Read from
    its file under a private name; the type table and the architectures' tensor names
    (models/arch/base.py) are all that is taken from it, and the codecs below import gguf
    properly. Where gguf is already imported, or its file is not where its spec says, the usual
    import. Made once per process (cached): the type table here and the tensor tables share one
    copy, where each run of the file makes its ~600 enum members again (~10 ms)."""
    if "gguf.constants" not in sys.modules:
        name = "_ggmlrun_gguf_constants"
        try:
            package = importlib.util.find_spec("gguf")
            spec = importlib.util.spec_from_file_location(
                name, Path(package.submodule_search_locations[0]) / "constants.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
        except (ImportError, AttributeError, TypeError, OSError):
            sys.modules.pop(name, None)
    import gguf.constants

    return gguf.constants


def _ggml_name(member) -> str:
    name = member.name.lower()
    return name[:-2] + "_K" if name.endswith("_k") else name


TYPES: dict[str, GgmlType] = {}
for _member, (_block, _size) in gguf_constants().GGML_QUANT_SIZES.items():
    _name = _ggml_name(_member)
    TYPES[_name] = GgmlType(_name, int(_member), _block, _size, _NUMPY.get(_name))
BY_ID = {t.id: t for t in TYPES.values()}

# What a graph file may name. Block types come in through GGUF models and weights; the YAML
# loader accepts the plain ones it can generate data for.
PLAIN = ("f32", "f16", "i32")


def ggml_type(name: str) -> GgmlType:
    return TYPES[name]


# The block codecs: the hot types decode in blockdecode (bit-identical to gguf, several times
# faster), the rest in `gguf` (llama.cpp's reference code), so that this module stays the one
# door to the gguf package. Both raise NotImplementedError where gguf has no codec.

def decode_blocks(raw: np.ndarray, name: str) -> np.ndarray:
    """Bytes of whole rows of type `name` (rows in the last axis) -> their values (f32)."""
    from ggmlrun.core.ir.blockdecode import decode_fast   # weights only: headers never decode

    fast = decode_fast(raw, name)
    if fast is not None:
        return fast
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    return quants.dequantize(raw, GGMLQuantizationType(TYPES[name].id))


def encode_blocks(values: np.ndarray, name: str) -> np.ndarray:
    """f32 rows -> their bytes as type `name` (the last axis a multiple of the block), as
    ggml-cpu writes them: blockencode's encoders where gguf has none or rounds otherwise
    (iq4_nl, q8_0), else gguf's (checked byte for byte against ggml-cpu's from_float)."""
    from ggmlrun.core.ir.blockencode import encode_fast

    fast = encode_fast(values, name)
    if fast is not None:
        return fast
    from gguf import quants
    from gguf.constants import GGMLQuantizationType

    return quants.quantize(values, GGMLQuantizationType(TYPES[name].id))


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype that holds a plain type's values (KeyError for block types)."""
    dtype = TYPES[name].numpy
    if dtype is None:
        raise KeyError(f"ggml type {name} has no NumPy dtype")
    return dtype


def type_name(dtype: np.dtype) -> str:
    """ggml's name for the type NumPy holds as `dtype` (any byte order)."""
    return _BY_NUMPY[np.dtype(dtype).name]
