"""The ops llama.cpp's graph adds: set_rows (KV cache writes), flash_attn_ext, glu and cast.

Shapes are NumPy order (ggml's ne reversed). set_rows writes into its first source's memory
and its result is a view of it, as ggml_set_rows returns `ggml_view_tensor(a)`: the allocator
gives it no memory and later nodes read the cache's bytes. ggml lists set_rows' sources as
(b, c, a) for legacy reasons; here they are (a, b, c) = (destination, rows, indices), which
changes nothing the scheduler or allocator decides (the destination is never arena memory).
"""

from __future__ import annotations

import math

from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.util.errors import InputError, RunError
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.ir.ops.common import (
    F32, FLOATS, fmt, need_dtype, need_float, need_ndim, quiet, store, want_number, who)
from ggmlrun.core.ir.ops.nn import alibi_slopes, need_mask_fits, need_sinks
from ggmlrun.core.ir.ops.quant import can_encode, from_f32, round_like_vec_dot, to_f32, type_of
from ggmlrun.core.ir.ops.registry import REQUIRED, OpResult, OpSpec, register
from ggmlrun.core.ir.ops.elementwise import gelu_fp16_table


def _pad(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


# --- set_rows ------------------------------------------------------------------------------

def _set_rows_infer(srcs):
    a, b, c = srcs
    need_dtype("set_rows", b, FLOATS, "b (rows)")
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


# --- flash_attn_ext ------------------------------------------------------------------------

_FA_PARAMS = {"scale": REQUIRED, "max_bias": 0.0, "logit_softcap": 0.0, "prec": "f32"}


def _fa_infer(srcs, *, scale, max_bias, logit_softcap, prec):
    q, k, v = srcs[:3]
    op = "flash_attn_ext"
    need_float(op, q, "q")
    for role, t in (("k", k), ("v", v)):
        gtype = TYPES[t.dtype]
        if not (gtype.is_block or t.dtype in ("f32", "f16", "bf16")):
            raise InputError(f"{op}: {role} {who(t)} must be a float or quantized type")
        if gtype.is_block and t.shape[-1] % gtype.block_size:   # ggml_row_size asserts it
            raise InputError(f"{op}: {role} {who(t)} is {t.dtype}, whose rows are "
                             f"{gtype.block_size}-value blocks, but its head size is {t.shape[-1]}")
    for role, t in (("q", q), ("k", k), ("v", v)):
        need_ndim(op, t, 4, 4, role)
    s, h, t_len, d = q.shape
    sk, hkv, kv, dk = k.shape
    sv, hv, kv_v, dv = v.shape
    if dk != d or sk != s or sv != s or kv_v != kv or hv != hkv:
        raise InputError(f"{op}: q {fmt(q.shape)} [S, H, T, D], k {fmt(k.shape)} [S, Hkv, KV, D] "
                         f"and v {fmt(v.shape)} [S, Hkv, KV, Dv] disagree")
    if h % hkv:
        raise InputError(f"{op}: q's {h} heads must be a multiple of k's {hkv} (GQA)")
    want_number(op, "scale", scale)
    want_number(op, "max_bias", max_bias, nonneg=True)
    want_number(op, "logit_softcap", logit_softcap, nonneg=True)
    if prec not in ("f32", "default"):
        raise InputError(f"{op}: prec must be 'f32' or 'default', got {prec!r}")
    if len(srcs) >= 4:
        mask = srcs[3]
        need_dtype(op, mask, ("f16",), "mask")
        need_mask_fits(op, mask, (s, h, t_len, kv))
    elif max_bias > 0:
        raise InputError(f"{op}: max_bias > 0 (ALiBi) needs a mask")
    if len(srcs) == 5:
        need_sinks(op, srcs[4], h)
    return OpResult((s, t_len, h, dv), "f32")


def _fa_flops(out, srcs):
    q, k, v = srcs[:3]
    s, h, t_len, d = q.shape
    kv, dv = k.shape[2], v.shape[3]
    return s * h * t_len * kv * (2 * d + 2 * dv + 5)


FA_TILE_Q = 64     # GGML_FA_TILE_Q: from this many tokens on, ggml-cpu takes its tiled path


def _fa_tiled(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> bool:
    """ggml-cpu 0.25.3's choice: the f32 tiled path for batches of >= 64 tokens over an
    f32/f16 cache (k and v of one type); the per-row online softmax otherwise."""
    kv_type = type_of(k)
    return (q.shape[2] >= FA_TILE_Q and kv_type == type_of(v) and kv_type in ("f32", "f16")
            and type_of(q) == "f32")


def _dot(q32: np.ndarray, k32: np.ndarray, tiled: bool) -> np.ndarray:
    """q·kᵀ: in f32 on the tiled path; on the per-row path in f64, rounded once to f32, as
    ggml_vec_dot_f16 sums a row shorter than its SIMD step (64 values on AVX-512) in double;
    a q8_0 cache's per-block sums come closer to that than to an f32 matmul's order too (the
    recorded logits: docs/format.md)."""
    if tiled:
        return np.matmul(q32, k32.T)
    return np.matmul(q32.astype(np.float64), k32.T.astype(np.float64)).astype(F32)


def _expf(x: np.ndarray) -> np.ndarray:
    """libm's expf, as ggml-cpu's per-row path calls it: exp in f64 rounded to f32 (glibc's
    expf is correctly rounded but for rare cases; NumPy's f32 exp is off by an ulp often)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.exp(x.astype(np.float64)).astype(F32)


def _with_sinks(acc: np.ndarray, best: np.ndarray, total: np.ndarray, sinks):
    """ggml-cpu's sinks after the last key: each row's sink logit s joins the running max and
    sum (acc scaled by exp(M - s) where s is the new max, else exp(s - M) added to the sum)."""
    if sinks is None:
        return acc, total
    new_max = sinks > best
    ms = np.where(new_max, np.exp(best - sinks), F32(1)).astype(F32)
    vs = np.where(new_max, F32(1), np.exp(sinks - best)).astype(F32)
    return acc * ms, total * ms + vs


def _online_f16(scores: np.ndarray, v32: np.ndarray, sinks=None) -> np.ndarray:
    """ggml-cpu's per-row flash attention over an f16 v: an online softmax whose V
    accumulator is f16, rounded at every key (ggml_vec_scale_f16, ggml_vec_mad_f16).
    Vectorised over heads and tokens, one key at a time; keys masked for every row skip."""
    rows = scores.shape[:-1] + (1,)
    best = np.full(rows, -np.inf, F32)
    total = np.zeros(rows, F32)
    acc = np.zeros(scores.shape[:-1] + (v32.shape[-1],), np.float16)
    live = ~np.all(np.isneginf(scores), axis=tuple(range(scores.ndim - 1)))
    for ic in np.flatnonzero(live):
        s = scores[..., ic:ic + 1]
        masked = np.isneginf(s)
        new_max = (s > best) & ~masked
        ms = np.where(new_max, _expf(best - s), F32(1)).astype(F32)
        vs = np.where(new_max, F32(1), _expf(s - best)).astype(F32)
        vs[masked] = 0
        best = np.where(new_max, s, best)
        if new_max.any():
            acc = (acc.astype(F32) * ms).astype(np.float16)
        acc = (acc.astype(F32) + v32[ic] * vs).astype(np.float16)
        total = total * ms + vs
    acc, total = _with_sinks(acc.astype(F32), best, total, sinks)
    inv = np.where(total > 0, F32(1) / np.where(total > 0, total, F32(1)), F32(0))
    return acc * inv


def _softmax_f32(scores: np.ndarray, v32: np.ndarray, sinks=None) -> np.ndarray:
    top = np.max(scores, axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks)
    weights = np.exp(scores - np.where(np.isneginf(top), F32(0), top))
    total = np.sum(weights, axis=-1, keepdims=True, dtype=np.float64)
    if sinks is not None:
        total = total + np.exp(sinks - top).astype(np.float64)
    inv = np.where(total > 0, 1.0 / np.where(total > 0, total, 1.0), 0.0).astype(F32)
    return np.matmul(weights * inv, v32)


@quiet
def _fa_kernel(out, q, k, v, mask=None, sinks=None, *, scale, max_bias, logit_softcap, prec):
    """ggml-cpu's numerics (see docs/format.md): on its tiled path everything is f32; on
    the per-row path q is first rounded to k's vec_dot type (f16 for an f16 cache) and an f16
    v is accumulated in f16. One (sequence, kv head) at a time to bound memory. `sinks`: a
    logit per head, as one more key with no value (gpt-oss)."""
    sink32 = None if sinks is None else np.asarray(sinks, dtype=F32)
    s_n, h_n, t_len, _ = q.shape
    hkv = k.shape[1]
    group = h_n // hkv
    tiled = _fa_tiled(q, k, v)
    q32 = to_f32(q) if tiled else round_like_vec_dot(to_f32(q), type_of(k))
    accumulate = _softmax_f32 if tiled or type_of(v) != "f16" else _online_f16
    slopes = alibi_slopes(h_n, max_bias)
    mask32 = None if mask is None else to_f32(mask)[..., :t_len, :]
    kq_scale = F32(scale / logit_softcap) if logit_softcap else F32(scale)
    for si in range(s_n):
        for g in range(hkv):
            k32 = to_f32(k[si, g])                                      # [KV, D]
            v32 = to_f32(v[si, g])                                      # [KV, Dv]
            heads = slice(g * group, (g + 1) * group)
            scores = _dot(q32[si, heads], k32, tiled) * kq_scale        # [G, T, KV]
            if logit_softcap:
                scores = F32(logit_softcap) * np.tanh(scores)
            if mask32 is not None:
                m = mask32[si % mask32.shape[0]]                        # [M2, T, KV]
                idx = np.arange(g * group, (g + 1) * group) % m.shape[0]
                scores = scores + slopes[heads, None, None] * m[idx]
            sink = None if sink32 is None else sink32[heads].reshape(-1, 1, 1)
            result = accumulate(scores.astype(F32), v32, sink)          # [G, T, Dv]
            store(out[si, :, heads, :], np.swapaxes(result, 0, 1))


register(OpSpec(name="flash_attn_ext", n_src=(3, 5), infer=_fa_infer, kernel=_fa_kernel,
                params=dict(_FA_PARAMS), flops=_fa_flops,
                summary="softmax(q·kᵀ·scale + mask)·v per head (GQA); q [S, H, T, D] -> "
                        "f32 [S, T, H, Dv]; optional 5th src: sinks f32 [H]"))


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
    want_number("glu", "alpha", alpha)
    want_number("glu", "limit", limit)
    if not isinstance(swapped, bool):
        raise InputError(f"glu: param 'swapped' must be true or false, got {swapped!r}")
    if len(srcs) == 2:
        b = srcs[1]
        if b.shape != a.shape or b.dtype != a.dtype:
            raise InputError(f"glu: b {who(b)} must have a's shape and dtype ({who(a)})")
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
                flops=lambda out, srcs: 5 * out.n_elements,
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
    need_float("cast", a)
    if TYPES[dtype].is_block and a.shape[-1] % TYPES[dtype].block_size:
        raise InputError(f"cast: a {who(a)} rows are not whole blocks of {dtype}")
    return OpResult(a.shape, dtype)


@quiet
def _cast_kernel(out, a, *, dtype):
    encoded = from_f32(to_f32(a), dtype)
    np.copyto(out, encoded.reshape(out.shape), casting="unsafe")


register(OpSpec(name="cast", n_src=(1, 1), infer=_cast_infer, kernel=_cast_kernel,
                params={"dtype": REQUIRED}, flops=lambda out, srcs: 0,
                summary="a converted to dtype, a new contiguous tensor (ggml_cast)"))
