"""Leaf data: what each weight and input holds before the first compute.

Generated data is a pure function of (seed, tensor name, init, init keys): each tensor gets its
own RNG, seeded from a sha256 of a canonical JSON of those four, so adding, removing or
reordering tensors (or changing another tensor's init) never changes this one's values, which a
single shared RNG stream would. The loader fills in every init key's default before it gets
here, so `{init: randn}` and `{init: randn, scale: 1.0}` are the same data.

`.npy` files are read with `allow_pickle=False` and must match the tensor's shape and dtype
exactly (byte order aside): ggmlrun never converts a user's data silently.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.util.errors import InputError, did_you_mean, missing_file_hint
from ggmlrun.core.util.fmt import shape_text
from ggmlrun.core.util.inputs import open_regular
from ggmlrun.core.util.ram import ensure_memory
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.types import numpy_dtype

REQUIRED = object()  # an init key without a default

# init -> its keys and their defaults (SPEC.md section 1)
INIT_KEYS: dict[str, dict[str, object]] = {
    "zeros": {},
    "ones": {},
    "full": {"value": REQUIRED},
    "randn": {"mean": 0.0, "scale": 1.0},
    "uniform": {"low": 0.0, "high": 1.0},
    "arange": {"start": 0, "step": 1},
    "randint": {"low": 0, "high": REQUIRED},
}
FLOAT_ONLY_INITS = ("randn", "uniform")   # they make fractions; an i32 tensor cannot hold them

NPY_MAGIC = b"\x93NUMPY"


# --- generated data --------------------------------------------------------------------------
def data_seed(seed: int, name: str, init: str, keys: dict) -> int:
    """The per-tensor RNG seed: stable across runs, platforms and the graph's other tensors.
    (hashlib loads OpenSSL, ~4 ms: imported here, where data is made, not by every loader.)"""
    import hashlib

    doc = json.dumps({"seed": seed, "name": name, "init": init, "keys": keys},
                     sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:16], "little")


def _generate(tensor: Tensor, seed: int) -> np.ndarray:
    data = tensor.data
    init, keys, n = data.init, data.keys, tensor.n_elements
    dtype = tensor.np_dtype
    if init == "zeros":
        return np.zeros(tensor.shape, dtype)
    if init == "ones":
        return np.ones(tensor.shape, dtype)
    if init == "full":
        with np.errstate(over="ignore"):     # 1e9 in an f16 is inf, as in ggml
            return np.full(tensor.shape, keys["value"], dtype)
    if init == "arange":
        if dtype.kind == "i":
            flat = keys["start"] + keys["step"] * np.arange(n, dtype=np.int64)
        else:
            flat = keys["start"] + keys["step"] * np.arange(n, dtype=np.float64)
        with np.errstate(over="ignore"):
            return flat.astype(dtype).reshape(tensor.shape)
    rng = np.random.Generator(np.random.PCG64(data_seed(seed, tensor.name, init, keys)))
    if init == "randn":
        # drawn in f32 (half the memory of f64); mean and scale applied in f32, where a scale
        # of 1e308 is inf, as it would be in ggml
        flat = rng.standard_normal(n, dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            flat *= np.float32(keys["scale"])
            flat += np.float32(keys["mean"])
    elif init == "uniform":
        flat = rng.random(n, dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            flat *= np.float32(keys["high"] - keys["low"])
            flat += np.float32(keys["low"])
    elif init == "randint":
        flat = rng.integers(keys["low"], keys["high"], size=n, dtype=np.int64)
    else:  # the loader admits only the inits above
        raise InputError(f"unknown init '{init}'; {did_you_mean(init, INIT_KEYS)}",
                         line=tensor.line, culprit=tensor.describe())
    with np.errstate(over="ignore"):
        return flat.astype(dtype, copy=False).reshape(tensor.shape)


def leaf_array(tensor: Tensor, seed: int) -> np.ndarray:
    """A fresh, writable, C-contiguous array of the leaf's shape and dtype."""
    data = tensor.data
    if data is None:
        raise InputError("is not a leaf with data", line=tensor.line, culprit=tensor.describe())
    if data.values is not None:
        with np.errstate(over="ignore"):     # 1e6 in an f16 is inf, as in ggml
            return np.array(data.values, dtype=tensor.np_dtype).reshape(tensor.shape)
    if data.file is not None:
        try:
            return load_npy(data.file, tensor.shape, tensor.dtype)
        except InputError as err:
            raise err.located(line=tensor.line, culprit=tensor.describe())
    ensure_memory(2 * tensor.n_elements * max(tensor.itemsize, 8), f"generating the data of "
                  f"{tensor.describe()}")      # float64 draws, then the cast
    return np.ascontiguousarray(_generate(tensor, seed))


# --- .npy files --------------------------------------------------------------------------
def _expected_dtype_text(dtype: str) -> str:
    np_name = numpy_dtype(dtype).name
    return f"{np_name} ({dtype}); convert with arr.astype(np.{np_name})"


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a .npy file from its header alone, so validation reads no data.

    Refuses anything that is not a plain numeric .npy: a pickle, an .npz, an object array,
    a truncated file.
    """
    shown = f"file '{path}'"
    try:
        handle = open_regular(path, ".npy file", limit=None)
    except InputError as err:        # the graph file's line is added by the caller
        raise InputError(f"{shown} not found{missing_file_hint(path)}" if "no such file" in err.message
                         else f"{shown} {err.message}") from None
    try:
        with handle as fh:
            if fh.read(len(NPY_MAGIC)) != NPY_MAGIC:
                raise InputError(f"{shown} is not a .npy file (NumPy's format, written by "
                                 "np.save); pickles and .npz archives are not read")
            fh.seek(0)
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise InputError(f"{shown}: .npy format version {version[0]}.{version[1]} is "
                                 "not supported; save a plain numeric array with np.save")
            data_offset = fh.tell()
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{shown} not found{missing_file_hint(path)}") from None
    except OSError as err:
        raise InputError(f"cannot read {shown}: {err.strerror or err}") from None
    except (ValueError, SyntaxError) as err:   # a malformed header
        raise InputError(f"{shown} has a malformed .npy header: "
                         f"{str(err).splitlines()[0] if str(err) else 'unreadable'}") from None
    if dtype.hasobject or dtype.fields is not None:
        raise InputError(f"{shown} holds Python objects or records ({dtype}), which are never "
                         "unpickled; save a plain numeric array")
    expected = data_offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if os.path.getsize(path) < expected:
        raise InputError(f"{shown} is truncated: its header promises {shape_text(shape)} "
                         f"{dtype.name} but the file is too short")
    return tuple(int(d) for d in shape), dtype


def check_npy(path: Path, shape: tuple[int, ...], dtype: str) -> None:
    """Fail unless the file holds exactly `shape` of `dtype` (any byte order)."""
    got_shape, got_dtype = npy_header(path)
    _check_match(path, got_shape, got_dtype, shape, dtype)


def _check_match(path, got_shape, got_dtype, shape, dtype):
    shown = f"file '{path}'"
    want = numpy_dtype(dtype)
    if got_dtype.newbyteorder("=") != want:
        raise InputError(f"{shown} holds {got_dtype.name}, expected {_expected_dtype_text(dtype)}")
    if tuple(got_shape) != tuple(shape):
        raise InputError(f"{shown} has shape {shape_text(got_shape)}, expected "
                         f"{shape_text(shape)}")


def load_npy(path: Path, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Read a .npy that must hold exactly `shape` of `dtype`; native byte order, C order."""
    check_npy(path, shape, dtype)   # clear errors before reading any data
    ensure_memory(math.prod(shape) * numpy_dtype(dtype).itemsize, f"reading '{path}'")
    try:
        with open_regular(path, ".npy file", limit=None) as handle:
            arr = np.load(handle, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise InputError(f"cannot read file '{path}': {str(err).splitlines()[0]}") from None
    _check_match(path, arr.shape, arr.dtype, shape, dtype)   # the file may have changed
    return np.ascontiguousarray(arr, dtype=numpy_dtype(dtype))


# --- run --input NAME=FILE.npy --------------------------------------------------------------
def load_input_override(graph: Graph, spec: str) -> tuple[Tensor, np.ndarray]:
    """Parse one `--input NAME=FILE.npy`: NAME must be a graph input (role: input).

    The file must match the input's shape and dtype exactly; the message says which dtype, so
    a float64 array saved by default is one `astype` away.
    """
    graph_file = str(graph.path) if graph.path else None
    name, sep, file = spec.partition("=")
    name, file = name.strip(), file.strip()
    culprit = f"--input '{spec}'"
    if not sep or not name or not file:
        raise InputError("expected NAME=FILE.npy, e.g. --input x=x.npy", culprit=culprit)
    inputs = [t.name for t in graph.inputs]
    listed = ", ".join(inputs) if inputs else "none (the graph has no role: input tensors)"
    if name not in graph:
        raise InputError(f"no tensor '{name}' in the graph; its inputs: {listed}",
                         file=graph_file, culprit=culprit)
    tensor = graph.tensor(name)
    if tensor.role != "input":
        what = "a weight" if tensor.role == "weight" else "a node"
        raise InputError(f"'{name}' is {what}, not a graph input; --input sets role: input "
                         f"tensors: {listed}", file=graph_file, culprit=culprit)
    try:
        return tensor, load_npy(Path(file), tensor.shape, tensor.dtype)
    except InputError as err:
        raise err.located(culprit=culprit)
