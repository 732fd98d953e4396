"""mul_mat and get_rows: the ops that read a weight matrix.

mul_mat follows ggml: result [.., N, M] = b @ aᵀ in f32, and when a is f16, b is rounded to
f16 first (ggml converts b to a's "vec_dot_type") while sums stay f32. A source with fewer
than 2 dims counts as one row. Batch broadcasting repeats each of a's batches r times in a
row (b's batch j reads a's batch j // r), which differs from the "tiles" rule of add & co.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ggmlrun.core.util.errors import InputError, RunError
from ggmlrun.core.ir.ops.common import F32, fmt, need_dtype, need_float, quiet, store, who
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register


def _padded(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


# --- mul_mat -------------------------------------------------------------------------------

def _mul_mat_infer(srcs):
    a, b = srcs
    need_float("mul_mat", a)
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
    a = a.reshape(_padded(a.shape, rank))
    b = b.reshape(_padded(b.shape, rank))
    if a.dtype == np.float16:
        b = b.astype(np.float16)
    a32 = a if a.dtype == F32 else a.astype(F32)
    b32 = b if b.dtype == F32 else b.astype(F32)
    groups = a.shape[:-2]
    out_v = _split_batches(out, groups)
    b_v = _split_batches(b32, groups)
    # a: each batch (g) meets all r repeats of it -> a size-1 axis after every batch axis
    a_v = a32.reshape([d for g in groups for d in (g, 1)] + list(a.shape[-2:]))
    np.matmul(b_v, np.swapaxes(a_v, -1, -2), out=out_v)


register(OpSpec(name="mul_mat", n_src=(2, 2), infer=_mul_mat_infer, kernel=_mul_mat_kernel,
                flops=_mul_mat_flops,
                summary="a [.., M, K], b [.., N, K] -> [.., N, M] = b @ aᵀ, f32"))


# --- get_rows ------------------------------------------------------------------------------

def _get_rows_infer(srcs):
    a, b = srcs
    need_dtype("get_rows", b, ("i32",), "b (row indices)")
    if len(a.shape) == 2 and len(b.shape) == 1:
        shape = (b.shape[0], a.shape[1])
    elif len(a.shape) == 3 and len(b.shape) == 2 and a.shape[0] == b.shape[0]:
        shape = (a.shape[0], b.shape[1], a.shape[2])
    else:
        raise InputError(f"get_rows: a {who(a)} and b {who(b)} must be a [R, C] with b [N], "
                         f"or a [B, R, C] with b [B, N]")
    return OpResult(shape, "i32" if a.dtype == "i32" else "f32")


def _get_rows_flops(out, srcs):
    return 0   # pure data movement: its cost is bytes, not arithmetic


@quiet
def _get_rows_kernel(out, a, b):
    rows = a.shape[-2]
    bad = (b < 0) | (b >= rows)
    if bad.any():
        raise RunError(f"get_rows: row index {int(b[bad].flat[0])} is out of range "
                       f"[0, {rows})")
    if a.ndim == 2:
        store(out, a[b])
    else:
        store(out, a[np.arange(a.shape[0])[:, None], b])


register(OpSpec(name="get_rows", n_src=(2, 2), infer=_get_rows_infer, kernel=_get_rows_kernel,
                flops=_get_rows_flops,
                summary="rows of a [(B), R, C] picked by b i32 [(B), N]; f32 (i32 for i32 a)"))
