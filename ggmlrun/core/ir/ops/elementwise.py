"""Elementwise ops: binary with tiling, unary, scale and clamp.

Results have `a`'s shape and dtype. f16 data is computed in f32 and rounded once on store, as
ggml's f16 paths do. Every kernel here reads an element before writing the same element, so
the in-place ones stay correct when the planner hands them their parent's memory as `out`.

Types and layouts are ggml-cpu's (0.15.3; docs/format.md, "What ggml requires of a
source"): binary ops take f32/f32, f16/f16 and f16 a with f32 b, and read a's rows packed
(nb[0] = element size); unary ops and clamp take f32 or f16 with packed rows; scale takes a
contiguous f32 a. ggml-cpu has no integer form of any of them, so none takes i32.
"""

from __future__ import annotations

import math

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.lazynumpy import np, numpy_later
from ggmlrun.core.ir.ops.common import (
    F32, fast_path, need_contiguous, need_dtype, need_float, need_rows, need_tiles,
    per_element, quiet, store, tile_split, want_number, who)
from ggmlrun.core.ir.ops.registry import REQUIRED, OpResult, OpSpec, register

# (a, b) types ggml-cpu's binary_op computes (binary-ops.cpp); bf16 pairs come from models
BINARY_TYPES = {("f32", "f32"), ("f16", "f16"), ("f16", "f32"), ("bf16", "bf16"),
                ("bf16", "f32")}


# --- binary: add sub mul div ---------------------------------------------------------------

def _binary_infer(op: str):
    def infer(srcs, **_):
        a, b = srcs
        if (a.dtype, b.dtype) not in BINARY_TYPES:
            need_float(op, a)
            need_float(op, b, "b")
            raise InputError(f"{op}: a {who(a)} with b {who(b)}: ggml-cpu computes f32 with "
                             f"f32, f16 with f16 and f16 a with f32 b: cast b to {a.dtype}")
        need_tiles(op, a, b)
        need_rows(op, a)
        return OpResult(a.shape, a.dtype)
    return infer


# one dtype throughout, computed in that dtype: the ufunc's own loop, as the kernel picks it
_NATIVE = numpy_later(lambda np: (np.dtype(np.float32), np.dtype(np.int32)))
BINARY = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b"}
_BINARY_UFUNC = numpy_later(lambda np: {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                                        "div": np.divide})


def _tiles_by_broadcast(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> bool:
    """True when NumPy broadcasting of b to a is the same as tiling (each dim equal or 1)."""
    return a_shape == b_shape or len(b_shape) <= len(a_shape) and all(
        db == da or db == 1 for da, db in zip(a_shape[::-1], b_shape[::-1]))


def _binary_kernel(name: str):
    def bind(out, a, b):
        if (a.dtype == b.dtype == out.dtype and out.dtype in _NATIVE
                and _tiles_by_broadcast(a.shape, b.shape)):
            return _BINARY_UFUNC[name], (a, b, out)
        return None

    @fast_path(bind)
    @quiet
    def kernel(out, a, b):
        out_v, b_v = tile_split(out, b)
        a_v, _ = tile_split(a, b)
        dtype = F32 if out.dtype.kind == "f" else None
        _BINARY_UFUNC[name](a_v, b_v, out=out_v, dtype=dtype, casting="same_kind")
    return kernel


for _name, _what in BINARY.items():
    register(OpSpec(
        name=_name, n_src=(2, 2), infer=_binary_infer(_name), kernel=_binary_kernel(_name),
        inplace=True, summary=f"{_what}, elementwise; b tiles to a's shape"))


# --- unary ---------------------------------------------------------------------------------
# Each formula f(x, out) computes into `out`, which may be `x` itself.

def _sigmoid(x, out):
    t = np.negative(x)
    np.exp(t, out=t)
    t += 1
    np.divide(1, t, out=out)


def _silu(x, out):
    t = np.negative(x)
    np.exp(t, out=t)
    t += 1
    np.divide(x, t, out=out)


_GELU_C = numpy_later(lambda np: np.float32(math.sqrt(2.0 / math.pi)))


def _gelu(x, out):
    """Exact tanh-form GELU; ggml's f32 version reads an f16 table instead (SPEC.md)."""
    t = np.multiply(x, x)
    t *= x
    t *= F32(0.044715)
    t += x
    t *= _GELU_C
    np.tanh(t, out=t)
    t += 1
    t *= x
    np.multiply(t, F32(0.5), out=out)


def _softplus(x, out):
    """ggml-cpu's op_softplus: x past 20, else logf(1 + expf(x))."""
    t = np.exp(np.minimum(x, F32(20)))
    t += 1
    np.log(t, out=t)
    np.copyto(out, np.where(x > F32(20), x, t))


UNARY = {
    # name: (formula, flops per element, summary)
    "neg": (lambda x, out: np.negative(x, out=out), 1, "-a"),
    "abs": (lambda x, out: np.abs(x, out=out), 1, "|a|"),
    "sqr": (lambda x, out: np.square(x, out=out), 1, "a²"),
    "sqrt": (lambda x, out: np.sqrt(x, out=out), 2, "√a"),
    "log": (lambda x, out: np.log(x, out=out), 4, "natural log"),
    "exp": (lambda x, out: np.exp(x, out=out), 4, "eᵃ"),
    "relu": (lambda x, out: np.maximum(x, 0, out=out), 1, "max(a, 0)"),
    "silu": (_silu, 6, "a·sigmoid(a)"),
    "sigmoid": (_sigmoid, 5, "1/(1+e⁻ᵃ)"),
    "tanh": (lambda x, out: np.tanh(x, out=out), 4, "tanh(a)"),
    "gelu": (_gelu, 10, "0.5·a·(1+tanh(√(2/π)·(a+0.044715·a³))), exact"),
    "softplus": (_softplus, 6, "log(1+eᵃ), a itself past 20 (ggml's)"),
}


def _unary_infer(op: str):
    def infer(srcs, **_):
        (a,) = srcs
        need_float(op, a)
        need_rows(op, a)
        return OpResult(a.shape, a.dtype)
    return infer


# unary ops that are one ufunc call, `out` given positionally (relu stays a formula: NumPy
# deprecates a positional `out` for np.maximum)
_UFUNC = numpy_later(lambda np: {"neg": np.negative, "abs": np.abs, "sqr": np.square,
                                  "sqrt": np.sqrt, "log": np.log, "exp": np.exp,
                                  "tanh": np.tanh})


def _unary_kernel(formula, name=None):
    def bind(out, a):
        if out.dtype == np.float16:
            return None
        return _UFUNC.get(name, formula), (a, out)

    @fast_path(bind)
    @quiet
    def kernel(out, a):
        if out.dtype == np.float16:
            x = a.astype(F32)
            formula(x, x)
            store(out, x)
        else:
            formula(a, out)
    return kernel


for _name, (_formula, _cost, _what) in UNARY.items():
    if _name == "gelu":
        continue
    register(OpSpec(
        name=_name, n_src=(1, 1), infer=_unary_infer(_name), kernel=_unary_kernel(_formula, _name),
        inplace=True, flops=per_element(_cost), summary=f"{_what}, elementwise"))


def gelu_fp16_table(x):
    """ggml-cpu's f32 GELU (GGML_GELU_FP16, ggml_vec_gelu_f32 / ggml_vec_geglu_f32): x rounded
    to f16, GELU of that in f32 (ggml_gelu_f32: 0.5x(1 + tanh(√(2/π)·x·(1 + 0.044715x²))))
    rounded to f16 (its table ggml_table_gelu_f16), 0 at x <= -10 and x itself at x >= 10."""
    h = x.astype(np.float16).astype(F32)
    g = F32(0.5) * h * (F32(1) + np.tanh(_GELU_C * h * (F32(1) + F32(0.044715) * h * h)))
    g = g.astype(np.float16).astype(F32)
    return np.where(x <= F32(-10), F32(0), np.where(x >= F32(10), x, g))


def _gelu_infer(srcs, *, table=False):
    if not isinstance(table, bool):
        raise InputError(f"gelu: param 'table' must be true or false, got {table!r}")
    return _unary_infer("gelu")(srcs)


_gelu_exact = _unary_kernel(_gelu, "gelu")


def _gelu_bind(out, a, *, table=False):
    return None if table else _gelu_exact.bind(out, a)


@fast_path(_gelu_bind)
@quiet
def _gelu_kernel(out, a, *, table=False):
    if table:                  # as ggml-cpu computes it (llama.cpp's graphs: gemma4)
        store(out, gelu_fp16_table(a.astype(F32)))
    else:
        _gelu_exact(out, a)


register(OpSpec(name="gelu", n_src=(1, 1), infer=_gelu_infer, kernel=_gelu_kernel,
                params={"table": False}, inplace=True, flops=per_element(UNARY["gelu"][1]),
                summary=f"{UNARY['gelu'][2]} (table: ggml-cpu's f16 table), elementwise"))


# --- scale, clamp --------------------------------------------------------------------------

def _scale_infer(srcs, *, s):
    (a,) = srcs
    need_dtype("scale", a, ("f32",))
    need_contiguous("scale", a)
    want_number("scale", "s", s)
    return OpResult(a.shape, a.dtype)


def _scale_bind(out, a, *, s):
    if a.dtype == out.dtype == F32:
        return np.multiply, (a, F32(s), out)
    return None


@fast_path(_scale_bind)
@quiet
def _scale_kernel(out, a, *, s):
    np.multiply(a, F32(s), out=out, dtype=F32, casting="same_kind")


register(OpSpec(
    name="scale", n_src=(1, 1), infer=_scale_infer, kernel=_scale_kernel,
    params={"s": REQUIRED}, inplace=True,
    summary="a·s (s required)"))


def _clamp_infer(srcs, *, min, max):  # noqa: A002 - the SPEC's param names
    (a,) = srcs
    need_float("clamp", a)
    need_rows("clamp", a)
    lo = want_number("clamp", "min", min, finite=False)
    hi = want_number("clamp", "max", max, finite=False)
    if lo > hi:
        raise InputError(f"clamp: min ({min}) is above max ({max})")
    return OpResult(a.shape, a.dtype)


@quiet
def _clamp_kernel(out, a, *, min, max):  # noqa: A002
    np.clip(a, F32(min), F32(max), out=out, dtype=F32, casting="same_kind")


register(OpSpec(
    name="clamp", n_src=(1, 1), infer=_clamp_infer, kernel=_clamp_kernel,
    params={"min": -math.inf, "max": math.inf}, inplace=True,   # ggml 0.25.3 (not 0.15.3)
    summary="clip a to min..max (defaults ±inf)"))
