"""The ops llama.cpp's graph adds: set_rows (KV cache writes), glu and cast (flash_attn_ext is
flash_attn.py's).

Shapes are NumPy order (ggml's ne reversed). set_rows writes into its first source's memory
and its result is a view of it, as ggml_set_rows returns `ggml_view_tensor(a)`: the allocator
gives it no memory and later nodes read the cache's bytes. ggml lists set_rows' sources as
(b, c, a) for legacy reasons; here they are (a, b, c) = (destination, rows, indices), which
changes nothing the scheduler or allocator decides (the destination is never arena memory).
"""

from __future__ import annotations

from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.util.errors import InputError, RunError
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.ir.ops.common import (
    F32, fmt, need_contiguous, need_dtype, need_float, need_ndim, need_rows, per_element, quiet,
    store, want_number, who)
from ggmlrun.core.ir.ops.quant import can_encode, from_f32, to_f32, type_of
from ggmlrun.core.ir.ops.registry import REQUIRED, OpResult, OpSpec, register
from ggmlrun.core.ir.ops.elementwise import gelu_fp16_table


def _pad(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


# --- set_rows ------------------------------------------------------------------------------

def _set_rows_infer(srcs):
    a, b, c = srcs
    need_dtype("set_rows", b, ("f32",), "b (rows)")
    need_dtype("set_rows", c, ("i32", "i64"), "c (row indices)")
    need_ndim("set_rows", a, 2, 4, "a (destination)")
    need_ndim("set_rows", b, 2, 4, "b (rows)")
    need_ndim("set_rows", c, 1, 3, "c (row indices)")
    if not (TYPES[a.dtype].is_float or TYPES[a.dtype].is_block):
        raise InputError(f"set_rows: a (destination) {who(a)} must be a float or block type")
    if not can_encode(a.dtype):
        raise InputError(f"set_rows: cannot write rows as {a.dtype} (a {who(a)}): no encoder")
    a4, b4, c3 = _pad(a.shape, 4), _pad(b.shape, 4), _pad(c.shape, 3)
    if a4[-1] != b4[-1] or a4[:2] != b4[:2]:
        raise InputError(f"set_rows: b (rows) {fmt(b.shape)} must match a {fmt(a.shape)} in "
                         f"its last dim and in its dims before the rows")
    if c3[-1] != b4[-2] or b4[1] % c3[1] or b4[0] % c3[0]:
        raise InputError(f"set_rows: c (row indices) {fmt(c.shape)} must be [.., N] with N = "
                         f"{b4[-2]} rows of b {fmt(b.shape)}, its leading dims dividing b's")
    if TYPES[a.dtype].is_block and a.shape[-1] % TYPES[a.dtype].block_size:
        raise InputError(f"set_rows: a {who(a)} rows are not whole blocks")
    if a.shape[-1] != a.gtype.block_size:          # ggml_is_contiguous_rows
        need_rows("set_rows", a, "a (destination)")
    need_rows("set_rows", b, "b (rows)")
    return OpResult(a.shape, a.dtype, strides=a.strides, view_of=0)


@quiet
def _set_rows_kernel(out, a, b, c):
    """`out` is a's memory; row r of b (in its batch) goes to row c[r] of a (in that batch)."""
    rows = out.shape[-2]
    idx = np.asarray(c).astype(np.int64)
    bad = (idx < 0) | (idx >= rows)
    if bad.any():
        raise RunError(f"set_rows: row index {int(idx[bad].flat[0])} is out of range [0, {rows})")
    dst_type = type_of(out)
    out4 = out[(np.newaxis,) * (4 - out.ndim)]          # a view: writes reach a's memory
    b4 = b[(np.newaxis,) * (4 - b.ndim)]
    c3 = idx.reshape(_pad(idx.shape, 3))
    for i3 in range(b4.shape[0]):
        for i2 in range(b4.shape[1]):
            targets = c3[i3 % c3.shape[0], i2 % c3.shape[1]]
            values = to_f32(b4[i3, i2])
            out4[i3, i2, targets] = from_f32(values, dst_type)


register(OpSpec(name="set_rows", n_src=(3, 3), infer=_set_rows_infer, kernel=_set_rows_kernel,
                flops=lambda out, srcs: 0,
                summary="rows of b written into a at row indices c (i32/i64), converted to "
                        "a's type; the result is a view of a"))


# --- glu -----------------------------------------------------------------------------------

_GATE = {
    "swiglu": lambda x: x / (F32(1) + np.exp(-x)),
    "geglu": lambda x: gelu_fp16_table(x),
    "reglu": lambda x: np.maximum(x, F32(0)),
}


_GLU_OPS = tuple(_GATE) + ("swiglu_oai",)


def _swiglu_oai(x: np.ndarray, g: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """ggml-cpu's GGML_GLU_OP_SWIGLU_OAI (gpt-oss): x capped at limit, g clamped to ±limit,
    x·sigmoid(alpha·x)·(g + 1), all in f32."""
    x = np.minimum(x, F32(limit))
    g = np.clip(g, F32(-limit), F32(limit))
    return x / (F32(1) + np.exp(F32(alpha) * -x)) * (g + F32(1))


def _glu_infer(srcs, *, op, swapped, alpha, limit):
    a = srcs[0]
    need_float("glu", a)
    if op not in _GLU_OPS:
        raise InputError(f"glu: op must be one of {', '.join(_GLU_OPS)}, got {op!r}")
    if op == "swiglu_oai":
        need_dtype("glu", a, ("f32",))     # ggml-cpu has swiglu_oai in f32 only
    for role, t in zip(("a", "b"), srcs):
        need_contiguous("glu", t, role, n=1)
    want_number("glu", "alpha", alpha)
    want_number("glu", "limit", limit)
    if not isinstance(swapped, bool):
        raise InputError(f"glu: param 'swapped' must be true or false, got {swapped!r}")
    if len(srcs) == 2:
        b = srcs[1]
        if b.shape != a.shape or b.dtype != a.dtype:
            raise InputError(f"glu: b {who(b)} must have a's shape and dtype ({who(a)})")
        if swapped:
            raise InputError("glu: 'swapped' applies to one source split in halves; ggml's "
                             "two-source glu (ggml_glu_split) has none and would ignore it: "
                             "exchange a and b instead")
        return OpResult(a.shape, a.dtype)
    if a.shape[-1] % 2:
        raise InputError(f"glu: a {who(a)} has an odd last dim; one-source glu splits it "
                         f"in halves")
    return OpResult(a.shape[:-1] + (a.shape[-1] // 2,), a.dtype)


@quiet
def _glu_kernel(out, a, b=None, *, op, swapped, alpha, limit):
    if b is None:
        half = a.shape[-1] // 2
        x, g = a[..., :half], a[..., half:]
    else:
        x, g = a, b
    if swapped:
        x, g = g, x
    x32, g32 = x.astype(F32), g.astype(F32)
    if op == "swiglu_oai":
        store(out, _swiglu_oai(x32, g32, alpha, limit))
        return
    store(out, _GATE[op](x32) * g32)


register(OpSpec(name="glu", n_src=(1, 2), infer=_glu_infer, kernel=_glu_kernel,
                params={"op": REQUIRED, "swapped": False, "alpha": 0.0, "limit": 0.0},
                flops=per_element(5),
                summary="gated unit: act(x)·g with x, g = a, b (or a's halves); "
                        "act silu|gelu (ggml's f16 table)|relu (swiglu|geglu|reglu); "
                        "swiglu_oai: min(x, limit)·sigmoid(alpha·x)·(clamp(g, ±limit) + 1)"))


# --- cast ----------------------------------------------------------------------------------
# ggml_cast: a new tensor of another type, computed by ggml's CPY op (with itself as the
# destination, src[1] = result, which changes no allocation: see docs/format.md). llama.cpp
# casts an f32 K/V cache view to f16 before flash attention.

def _cast_infer(srcs, *, dtype):
    (a,) = srcs
    if dtype not in TYPES or not can_encode(dtype):
        raise InputError(f"cast: dtype must be a type values can be written as (f32, f16, "
                         f"bf16, q8_0, ...), got {dtype!r}")
    if a.dtype == "i32" and dtype == "f32":      # ggml-cpu's dup converts i32 to f32
        return OpResult(a.shape, dtype)
    need_float("cast", a)
    if TYPES[dtype].is_block:
        need_rows("cast", a)
    if TYPES[dtype].is_block and a.shape[-1] % TYPES[dtype].block_size:
        raise InputError(f"cast: a {who(a)} rows are not whole blocks of {dtype}")
    return OpResult(a.shape, dtype)


@quiet
def _cast_kernel(out, a, *, dtype):
    if a.dtype == np.int32:
        np.copyto(out, a, casting="unsafe")
        return
    encoded = from_f32(to_f32(a), dtype)
    np.copyto(out, encoded.reshape(out.shape), casting="unsafe")


register(OpSpec(name="cast", n_src=(1, 1), infer=_cast_infer, kernel=_cast_kernel,
                params={"dtype": REQUIRED}, flops=lambda out, srcs: 0,
                summary="a converted to dtype, a new contiguous tensor (ggml_cast)"))
