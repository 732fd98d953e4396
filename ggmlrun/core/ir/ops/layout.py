"""Layout ops: copies that move data (repeat, concat, cont, cpy) and views that move none.

Every dtype is accepted here, as ggml-cpu places them (pad is f32 only, repeat reads a's rows
packed, cpy has no i32 -> f16 and writes a block type only from packed rows into a
contiguous b). The views (view, reshape,
permute, transpose) return strides and a byte offset into their source and have no kernel:
the executor reads them straight from the source's memory. cpy computes (it converts and
writes) but its result aliases b, like ggml's `ggml_cpy`, so later nodes read b's bytes.
"""

from __future__ import annotations

import math

from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.ir.graph import MAX_DIMS, contiguous_strides, span_bytes
from ggmlrun.core.ir.ops.common import (
    fast_path, fmt, ggml_contiguous, need_contiguous, need_dtype, need_ndim, need_rows, quiet,
    tile_split, tiles, want_int, want_int_list, want_shape, who)
from ggmlrun.core.ir.ops.registry import REQUIRED, OpResult, OpSpec, register


def _no_flops(out, srcs):
    return 0   # pure data movement: its cost is bytes, not arithmetic


# --- repeat --------------------------------------------------------------------------------

def _repeat_infer(srcs, *, shape):
    (a,) = srcs
    target = want_shape("repeat", "shape", shape)
    need_rows("repeat", a)
    if not tiles(target, a.shape):
        raise InputError(f"repeat: a {fmt(a.shape)} does not tile shape {fmt(target)}: "
                         f"right-aligned, each dim of shape must be a multiple of a's")
    return OpResult(target, a.dtype)


@quiet
def _repeat_kernel(out, a, *, shape):
    out_v, a_v = tile_split(out, a)
    np.copyto(out_v, a_v)


register(OpSpec(name="repeat", n_src=(1, 1), infer=_repeat_infer, kernel=_repeat_kernel,
                params={"shape": REQUIRED}, flops=_no_flops, summary="a tiled to shape"))


# --- concat --------------------------------------------------------------------------------

def _concat_infer(srcs, *, axis):
    a, b = srcs
    if a.dtype != b.dtype:
        raise InputError(f"concat: a {who(a)} and b {who(b)} must have the same dtype")
    n = len(a.shape)
    if len(b.shape) != n:
        raise InputError(f"concat: a {fmt(a.shape)} and b {fmt(b.shape)} differ in rank")
    ax = want_int("concat", "axis", axis)
    if not -n <= ax < n:
        raise InputError(f"concat: axis {ax} is out of range for {n} dims "
                         f"(use {-n}..{n - 1})")
    ax %= n
    if any(da != db for i, (da, db) in enumerate(zip(a.shape, b.shape)) if i != ax):
        raise InputError(f"concat: a {fmt(a.shape)} and b {fmt(b.shape)} must agree on "
                         f"every dim but axis {ax}")
    shape = list(a.shape)
    shape[ax] += b.shape[ax]
    return OpResult(tuple(shape), a.dtype)


@quiet
def _concat_kernel(out, a, b, *, axis):
    np.concatenate((a, b), axis=axis, out=out)


register(OpSpec(name="concat", n_src=(2, 2), infer=_concat_infer, kernel=_concat_kernel,
                params={"axis": REQUIRED}, flops=_no_flops,
                summary="NumPy concatenate of a and b (same dtype) along axis (negatives ok)"))


# --- pad -----------------------------------------------------------------------------------
# ggml_pad(a, p0, p1, p2, p3): zeros after the end of each dim; `pad` is NumPy order (outermost
# first), one count per dim of a. llama.cpp pads a narrower layer's V rows to the V cache's width.

def _pad_infer(srcs, *, pad):
    (a,) = srcs
    if (not isinstance(pad, (list, tuple)) or len(pad) != len(a.shape)
            or any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in pad)):
        raise InputError(f"pad: param 'pad' must be one integer >= 0 per dim of a {fmt(a.shape)}, "
                         f"got {pad!r}")
    need_dtype("pad", a, ("f32",))
    return OpResult(tuple(d + p for d, p in zip(a.shape, pad)), a.dtype)


@quiet
def _pad_kernel(out, a, *, pad):
    out[...] = 0
    out[tuple(slice(0, d) for d in a.shape)] = a


register(OpSpec(name="pad", n_src=(1, 1), infer=_pad_infer, kernel=_pad_kernel,
                params={"pad": REQUIRED}, flops=_no_flops,
                summary="a followed by pad[i] zeros along each dim i (ggml_pad)"))


# --- cont ----------------------------------------------------------------------------------

def _cont_infer(srcs, *, shape):
    """ggml_cont_2d/3d/4d: the copy may take a new shape of the same element count."""
    (a,) = srcs
    if shape is None:
        return OpResult(a.shape, a.dtype)
    dims = want_shape("cont", "shape", shape)
    if math.prod(dims) != a.n_elements:
        raise InputError(f"cont: shape {list(dims)} has {math.prod(dims)} elements, a "
                         f"{fmt(a.shape)} has {a.n_elements}")
    return OpResult(dims, a.dtype)


def _cont_bind(out, a, *, shape):
    return (np.copyto, (out, a)) if out.shape == a.shape else None


@fast_path(_cont_bind)
@quiet
def _cont_kernel(out, a, *, shape):
    """Elements pair up in row-major logical order, as ggml's dup does."""
    np.copyto(out, a if a.shape == out.shape else a.reshape(out.shape))


register(OpSpec(name="cont", n_src=(1, 1), infer=_cont_infer, kernel=_cont_kernel,
                params={"shape": None}, flops=_no_flops,
                summary="a contiguous copy of a, optionally with a new shape (same count)"))


# --- cpy -----------------------------------------------------------------------------------

def _cpy_infer(srcs):
    a, b = srcs
    if a.n_elements != b.n_elements:
        raise InputError(f"cpy: a {fmt(a.shape)} has {a.n_elements} elements but b "
                         f"{fmt(b.shape)} has {b.n_elements}")
    need_convertible("cpy", a, b.dtype)
    if b.gtype.is_block:
        need_contiguous("cpy", b, "b")
    return OpResult(b.shape, b.dtype, strides=b.strides, view_of=1)


def need_convertible(op: str, a, dtype: str) -> None:
    """ggml-cpu's dup: no i32 -> f16 (nor bf16); a block type is written from packed rows."""
    if a.dtype == "i32" and dtype in ("f16", "bf16"):
        raise InputError(f"{op}: a {who(a)} to {dtype}: ggml-cpu converts i32 only to f32 "
                         f"and i32: go through f32")
    from ggmlrun.core.ir.types import TYPES
    if TYPES[dtype].is_block:
        need_rows(op, a)


@quiet
def _cpy_kernel(out, a, b):
    """`out` is b's memory; elements pair up in row-major logical order on both sides."""
    src = a if a.shape == out.shape else a.reshape(out.shape)
    np.copyto(out, src, casting="unsafe")


register(OpSpec(name="cpy", n_src=(2, 2), infer=_cpy_infer, kernel=_cpy_kernel,
                flops=_no_flops,
                summary="write a into b's memory (dtype converted); the result is a view of b"))


# --- views ---------------------------------------------------------------------------------

def _view_infer(srcs, *, shape, offset, strides):
    (a,) = srcs
    dims = want_shape("view", "shape", shape, zero=True)
    off = want_int("view", "offset", offset, lo=0)
    block = a.gtype.block_size             # block types: the innermost dim counts blocks
    if block > 1 and dims[-1] % block:
        raise InputError(f"view: a {who(a)} stores blocks of {block}; the last dim of shape "
                         f"{list(dims)} must be a multiple of it")
    if strides is None:
        st = contiguous_strides(dims, a.itemsize, block)
    else:
        st = tuple(want_int_list("view", "strides", strides))
        if len(st) != len(dims):
            raise InputError(f"view: strides {list(st)} and shape {list(dims)} differ in length")
        if any(s < 0 for s in st):
            raise InputError(f"view: strides must be >= 0 bytes, got {list(st)}")
    # the bytes reached, in the root's memory: a view of a view (as ggml resolves it to the
    # root) may reach past its source's own extent, never past the root's
    root, base = (a.view_src, a.view_offset) if a.view_src is not None else (a, 0)
    end = off + span_bytes(dims, st, a.itemsize, block)
    if base + end > root.nbytes:
        where = a if root is a else root
        raise InputError(f"view: shape {list(dims)}, strides {list(st)} at offset {off} reach "
                         f"byte {base + end}, past the end of a {who(where)} ({where.nbytes} "
                         f"bytes)")
    need_view_fits(a, dims, off)
    return OpResult(dims, a.dtype, strides=st, view_of=0, view_offset=off)


register(OpSpec(name="view", n_src=(1, 1), infer=_view_infer, kernel=None, view_op=True,
                params={"shape": REQUIRED, "offset": 0, "strides": None},
                summary="a view into a's memory: shape, byte offset, byte strides"))


def need_view_fits(a, dims, off: int) -> None:
    """ggml_new_tensor_impl's bound on a view: its elements, packed, from its offset in the
    root tensor, end inside the root (so a stride-0 broadcast or overlapping windows that
    cover more elements than the root holds abort in ggml)."""
    root = a.view_src or a
    packed = a.gtype.contiguous_bytes(tuple(dims)) if all(dims) else 0
    start = a.view_offset + off
    if packed and start + packed > root.nbytes:
        raise InputError(
            f"view: {math.prod(dims)} elements of {a.dtype} ({packed} bytes) from byte {start} "
            f"of '{root.name}' end past its {root.nbytes} bytes; ggml bounds a view by its "
            f"element count, whatever its strides (no stride-0 broadcasts nor overlapping "
            f"windows past the root): use repeat or cont instead")


def _reshape_infer(srcs, *, shape):
    (a,) = srcs
    if not ggml_contiguous(a):
        raise InputError(f"reshape: a {who(a)} is not contiguous; insert a cont before it")
    dims = want_int_list("reshape", "shape", shape)
    if not 1 <= len(dims) <= MAX_DIMS:
        raise InputError(f"reshape: shape must have 1 to {MAX_DIMS} dims, got {shape!r}")
    if min(dims) < 1 and (dims.count(-1) > 1 or any(d < 1 and d != -1 for d in dims)):
        raise InputError(f"reshape: shape dims must be >= 1, with at most one -1; got {shape!r}")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if a.n_elements % known:
            raise InputError(f"reshape: cannot fit a {fmt(a.shape)} ({a.n_elements} elements) "
                             f"into {shape!r}")
        dims[dims.index(-1)] = a.n_elements // known
    elif (known := math.prod(dims)) != a.n_elements:
        raise InputError(f"reshape: a {fmt(a.shape)} has {a.n_elements} elements, shape "
                         f"{shape!r} has {known}")
    dims = tuple(dims)
    block = a.gtype.block_size
    if dims[-1] % block:
        raise InputError(f"reshape: a {who(a)} stores blocks of {block}; the last dim of "
                         f"{list(dims)} must be a multiple of it")
    return OpResult(dims, a.dtype, view_of=0)      # contiguous strides: made by the Tensor


register(OpSpec(name="reshape", n_src=(1, 1), infer=_reshape_infer, kernel=None, view_op=True,
                params={"shape": REQUIRED},
                summary="view of contiguous a with another shape (one -1 allowed)"))


def _permute_infer(srcs, *, axes):
    (a,) = srcs
    n = len(a.shape)
    order = want_int_list("permute", "axes", axes)
    if sorted(order) != list(range(n)):          # negative axes, or no permutation at all
        norm = [x % n if -n <= x < n else None for x in order]
        if len(order) != n or sorted(x for x in norm if x is not None) != list(range(n)):
            raise InputError(f"permute: axes must be a permutation of 0..{n - 1} "
                             f"(a is {fmt(a.shape)}), got {axes!r}")
        order = norm
    return OpResult(tuple(a.shape[i] for i in order), a.dtype,
                    strides=tuple(a.strides[i] for i in order), view_of=0)


register(OpSpec(name="permute", n_src=(1, 1), infer=_permute_infer, kernel=None, view_op=True,
                params={"axes": REQUIRED}, summary="view, NumPy transpose(axes)"))


def _transpose_infer(srcs):
    (a,) = srcs
    need_ndim("transpose", a, 2)
    shape, strides = list(a.shape), list(a.strides)
    shape[-2:], strides[-2:] = shape[:-3:-1], strides[:-3:-1]
    return OpResult(tuple(shape), a.dtype, strides=tuple(strides), view_of=0)


register(OpSpec(name="transpose", n_src=(1, 1), infer=_transpose_infer, kernel=None,
                view_op=True, summary="view, swaps the last two dims"))
