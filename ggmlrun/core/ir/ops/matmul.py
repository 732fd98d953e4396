"""mul_mat and get_rows: the ops that read a weight matrix.

mul_mat follows ggml: result [.., N, M] = b @ aᵀ in f32, and b is first rounded the way ggml
converts it to a's "vec_dot_type" (f16 for f16 a, bf16 for bf16, q8_0 for q4_0/q5_*/q8_0, q8_K
for the k-quants) while sums stay f32. A bf16 or quantized a is decoded to f32 per call, one
matrix at a time (no cache: memory stays bounded by the largest single weight). A source with fewer
than 2 dims counts as one row. Batch broadcasting repeats each of a's batches r times in a
row (b's batch j reads a's batch j // r), which differs from the "tiles" rule of add & co.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ggmlrun.core.util.errors import InputError, RunError
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.ir.ops.common import F32, fmt, need_dtype, need_float, quiet, store, who
from ggmlrun.core.ir.ops.quant import round_like_vec_dot, to_f32, type_of
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register


def _padded(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


# --- mul_mat -------------------------------------------------------------------------------

def need_weight_type(op: str, a: Tensor) -> None:
    """Weights may be any float or block type; integers are not matrices to multiply."""
    gtype = TYPES[a.dtype]
    if not (gtype.is_block or a.dtype in ("f32", "f16", "bf16")):
        raise InputError(f"{op}: a {who(a)} must be f32 or f16 (or bf16, or a quantized type)")


def _mul_mat_infer(srcs):
    a, b = srcs
    need_weight_type("mul_mat", a)
    need_float("mul_mat", b, "b")
    rank = max(len(a.shape), len(b.shape), 2)
    ap, bp = _padded(a.shape, rank), _padded(b.shape, rank)
    if ap[-1] != bp[-1]:
        raise InputError(f"mul_mat: a {fmt(a.shape)} and b {fmt(b.shape)} disagree on K "
                         f"({ap[-1]} vs {bp[-1]})")
    for da, db in zip(ap[:-2], bp[:-2]):
        if db % da:
            raise InputError(f"mul_mat: b's batch dims {fmt(bp[:-2])} must each be a multiple "
                             f"of a's {fmt(ap[:-2])} (a {fmt(a.shape)}, b {fmt(b.shape)})")
    return OpResult(bp[:-2] + (bp[-2], ap[-2]), "f32")


def _mul_mat_flops(out, srcs):
    return 2 * out.n_elements * srcs[0].shape[-1]


def _split_batches(x: np.ndarray, groups: tuple[int, ...]) -> np.ndarray:
    """View each batch dim n of x as (g, n/g): index j becomes (j // (n/g), j % (n/g))."""
    shape, strides = [], []
    for n, s, g in zip(x.shape[:-2], x.strides[:-2], groups):
        r = n // g
        shape += [g, r]
        strides += [r * s, s]
    shape += list(x.shape[-2:])
    strides += list(x.strides[-2:])
    return as_strided(x, shape, strides, writeable=x.flags.writeable)


@quiet
def _mul_mat_kernel(out, a, b):
    rank = out.ndim
    weight_type = type_of(a)
    a32 = to_f32(a)
    a32 = a32.reshape(_padded(a32.shape, rank))
    b = b.reshape(_padded(b.shape, rank))
    if weight_type == "f16":
        b32 = b.astype(np.float16).astype(F32)
    else:
        b32 = round_like_vec_dot(to_f32(b), weight_type)
    a = a32
    groups = a.shape[:-2]
    out_v = _split_batches(out, groups)
    b_v = _split_batches(b32, groups)
    # a: each batch (g) meets all r repeats of it -> a size-1 axis after every batch axis
    a_v = a32.reshape([d for g in groups for d in (g, 1)] + list(a.shape[-2:]))
    np.matmul(b_v, np.swapaxes(a_v, -1, -2), out=out_v)


register(OpSpec(name="mul_mat", n_src=(2, 2), infer=_mul_mat_infer, kernel=_mul_mat_kernel,
                flops=_mul_mat_flops,
                summary="a [.., M, K] (float or quantized), b [.., N, K] -> [.., N, M] = b @ aᵀ, f32"))


# --- get_rows ------------------------------------------------------------------------------

def _get_rows_infer(srcs):
    a, b = srcs
    need_dtype("get_rows", b, ("i32", "i64"), "b (row indices)")
    if len(a.shape) == 2 and len(b.shape) == 1:
        shape = (b.shape[0], a.shape[1])
    elif len(a.shape) == 3 and len(b.shape) == 2 and a.shape[0] == b.shape[0]:
        shape = (a.shape[0], b.shape[1], a.shape[2])
    else:
        raise InputError(f"get_rows: a {who(a)} and b {who(b)} must be a [R, C] with b [N], "
                         f"or a [B, R, C] with b [B, N]")
    return OpResult(shape, "i32" if a.dtype == "i32" else "f32")


def _picked_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Only the picked rows are decoded (a quantized token table stays quantized)."""
    if a.ndim == 2:
        return to_f32(a[b]) if getattr(a, "ggml_type", "") else a[b]
    picked = a[np.arange(a.shape[0])[:, None], b]
    return to_f32(picked) if getattr(a, "ggml_type", "") else picked


def _get_rows_flops(out, srcs):
    return 0   # pure data movement: its cost is bytes, not arithmetic


@quiet
def _get_rows_kernel(out, a, b):
    rows = a.shape[-2]
    bad = (b < 0) | (b >= rows)
    if bad.any():
        raise RunError(f"get_rows: row index {int(b[bad].flat[0])} is out of range "
                       f"[0, {rows})")
    store(out, _picked_rows(a, b))


register(OpSpec(name="get_rows", n_src=(2, 2), infer=_get_rows_infer, kernel=_get_rows_kernel,
                flops=_get_rows_flops,
                summary="rows of a [(B), R, C] (any type) picked by b i32/i64 [(B), N]; f32 (i32 for i32 a)"))
