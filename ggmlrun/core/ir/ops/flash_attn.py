"""flash_attn_ext: ggml's fused attention (softmax(scale * Q.K^T + mask) V, with ALiBi, a
logit softcap and optional attention sinks), as ggml-cpu computes it: the online softmax in
f16 accumulators on its per-row path, and from FA_TILE_Q tokens on its tiled path (f32), so
the logits of a model run agree with llama.cpp's on either side of that switch.

Shapes are NumPy order (ggml's ne reversed).
"""

from __future__ import annotations

import functools

from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.ir.ops.common import (
    F32, fmt, need_dtype, need_ndim, need_rows, quiet, store, want_number, who)
from ggmlrun.core.ir.ops.nn import alibi_slopes, need_mask_fits, need_sinks
from ggmlrun.core.ir.ops.quant import (MIN_TYPES, block_mins, q8_1_sum_error,
                                       round_like_vec_dot, to_f32, type_of)
from ggmlrun.core.ir.ops.registry import REQUIRED, OpResult, OpSpec, register




_FA_PARAMS = {"scale": REQUIRED, "max_bias": 0.0, "logit_softcap": 0.0, "prec": "f32"}


def _fa_infer(srcs, *, scale, max_bias, logit_softcap, prec):
    q, k, v = srcs[:3]
    op = "flash_attn_ext"
    need_dtype(op, q, ("f32",), "q")       # ggml-cpu reads q as f32 (an f16 q computes wrongly)
    for role, t in (("k", k), ("v", v)):
        gtype = TYPES[t.dtype]
        if not (gtype.is_block or t.dtype in ("f32", "f16", "bf16")):
            raise InputError(f"{op}: {role} {who(t)} must be a float or quantized type")
        if gtype.is_block and t.shape[-1] % gtype.block_size:   # ggml_row_size asserts it
            raise InputError(f"{op}: {role} {who(t)} is {t.dtype}, whose rows are "
                             f"{gtype.block_size}-value blocks, but its head size is {t.shape[-1]}")
    for role, t in (("q", q), ("k", k), ("v", v)):
        need_ndim(op, t, 4, 4, role)
        need_rows(op, t, role)
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


def _online(scores: np.ndarray, v32: np.ndarray, sinks=None, *, f16_acc: bool) -> np.ndarray:
    """ggml-cpu's per-row flash attention: an online softmax, vectorised over heads and tokens,
    one key at a time (keys masked for every row skip). Over an f16 v (`f16_acc`) the V
    accumulator is f16, rounded at every key (ggml_vec_scale_f16, ggml_vec_mad_f16); over any
    other v (f32 after ggml_cast, bf16, quantized: decoded by its to_float) it is f32, each
    key's v added by a fused multiply-add (ggml_vec_mad_f32), f32 rounding once."""
    rows = scores.shape[:-1] + (1,)
    best = np.full(rows, -np.inf, F32)
    total = np.zeros(rows, F32)
    acc = np.zeros(scores.shape[:-1] + (v32.shape[-1],), np.float16 if f16_acc else F32)
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
            acc = (acc.astype(F32) * ms).astype(acc.dtype)
        if f16_acc:
            acc = (acc.astype(F32) + v32[ic] * vs).astype(np.float16)
        else:
            acc = (acc.astype(np.float64) + v32[ic].astype(np.float64) * vs).astype(F32)
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
    # a q4_1/q5_1 cache's dot with q8_1 adds each block's min times q8_1's stored (rounded)
    # sum: the decoded values miss that rounding, added back per block (as mul_mat does)
    sum_error = q8_1_sum_error(to_f32(q)) if type_of(k) in MIN_TYPES else None
    accumulate = (_softmax_f32 if tiled
                  else functools.partial(_online, f16_acc=type_of(v) == "f16"))
    slopes = alibi_slopes(h_n, max_bias)
    mask32 = None
    if mask is not None:            # 2-D, 3-D or 4-D: [(M3), (M2), Tpad, KV], as ggml pads it
        mask32 = to_f32(mask)[..., :t_len, :]
        mask32 = mask32.reshape((1,) * (4 - mask32.ndim) + mask32.shape)
    kq_scale = F32(scale / logit_softcap) if logit_softcap else F32(scale)
    for si in range(s_n):
        for g in range(hkv):
            k32 = to_f32(k[si, g])                                      # [KV, D]
            v32 = to_f32(v[si, g])                                      # [KV, Dv]
            heads = slice(g * group, (g + 1) * group)
            scores = _dot(q32[si, heads], k32, tiled)                   # [G, T, KV]
            if sum_error is not None:
                mins = block_mins(np.asarray(k[si, g]).view(np.ndarray), type_of(k))
                scores = scores + np.matmul(sum_error[si, heads], mins.T)
            scores = scores * kq_scale
            if logit_softcap:
                scores = F32(logit_softcap) * np.tanh(scores)
            if mask32 is not None:
                m = mask32[si % mask32.shape[0]]                        # [M2, T, KV]
                # sequence s reads mask batch s mod M3, head h mask head h mod M2 (ggml-cpu)
                idx = np.arange(g * group, (g + 1) * group) % m.shape[0]
                scores = scores + slopes[heads, None, None] * m[idx]
            sink = None if sink32 is None else sink32[heads].reshape(-1, 1, 1)
            result = accumulate(scores.astype(F32), v32, sink)          # [G, T, Dv]
            store(out[si, :, heads, :], np.swapaxes(result, 0, 1))


register(OpSpec(name="flash_attn_ext", n_src=(3, 5), infer=_fa_infer, kernel=_fa_kernel,
                params=dict(_FA_PARAMS), flops=_fa_flops,
                summary="softmax(q·kᵀ·scale + mask)·v per head (GQA); q [S, H, T, D] -> "
                        "f32 [S, T, H, Dv]; optional 5th src: sinks f32 [H]"))
