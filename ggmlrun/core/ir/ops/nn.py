"""Row-wise neural-net ops: norm, rms_norm, soft_max, diag_mask_inf and rope.

All are float-only and keep `a`'s dtype; f16 data is computed in f32. Row statistics (means,
softmax sums) accumulate in f64 as ggml's `ggml_float` does. The in-place ones (rms_norm,
soft_max, diag_mask_inf, rope) compute each row's statistics, or each rotated pair, before
overwriting it, so `out` may be the source's own memory.
"""

from __future__ import annotations

import numpy as np

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.ir.ops.common import (
    F32, fmt, is_int, need_dtype, need_float, need_ndim, quiet, store, tile_split, tiles,
    want_int, want_number, who)
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register


def _per_element(cost: int):
    return lambda out, srcs: cost * out.n_elements


# --- norm, rms_norm ------------------------------------------------------------------------

def _norm_infer(op: str):
    def infer(srcs, *, eps):
        (a,) = srcs
        need_float(op, a)
        want_number(op, "eps", eps, nonneg=True)
        return OpResult(a.shape, a.dtype)
    return infer


@quiet
def _norm_kernel(out, a, *, eps):
    x = a.astype(F32)
    x -= np.mean(x, axis=-1, keepdims=True, dtype=np.float64).astype(F32)
    var = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    x *= (1.0 / np.sqrt(var + eps)).astype(F32)
    store(out, x)


@quiet
def _rms_norm_kernel(out, a, *, eps):
    mean_sq = np.mean(np.square(a, dtype=np.float64), axis=-1, keepdims=True)
    inv = (1.0 / np.sqrt(mean_sq + eps)).astype(F32)
    np.multiply(a, inv, out=out, dtype=F32, casting="same_kind")


register(OpSpec(name="norm", n_src=(1, 1), infer=_norm_infer("norm"), kernel=_norm_kernel,
                params={"eps": 1e-5}, flops=_per_element(5),
                summary="(a−mean)/√(var+eps) over the last dim"))
register(OpSpec(name="rms_norm", n_src=(1, 1), infer=_norm_infer("rms_norm"),
                kernel=_rms_norm_kernel, params={"eps": 1e-6}, inplace=True,
                flops=_per_element(3), summary="a/√(mean(a²)+eps) over the last dim"))


# --- soft_max ------------------------------------------------------------------------------

def _soft_max_infer(srcs, *, scale):
    a = srcs[0]
    need_float("soft_max", a)
    want_number("soft_max", "scale", scale)
    if len(srcs) == 2:
        mask = srcs[1]
        need_float("soft_max", mask, "mask")
        tail_a = ((1, 1) + a.shape)[-2:]
        tail_m = ((1, 1) + mask.shape)[-2:]
        if tail_a != tail_m or not tiles(a.shape, mask.shape):
            raise InputError(
                f"soft_max: mask {fmt(mask.shape)} does not fit a {fmt(a.shape)}: its last two "
                f"dims must equal a's and its leading dims must tile a's")
    return OpResult(a.shape, a.dtype)


@quiet
def _soft_max_kernel(out, a, mask=None, *, scale):
    if mask is not None and np.may_share_memory(mask, out):
        mask = mask.copy()     # ggml may give the node its mask's slot; read it before writing
    x = out if out.dtype == F32 else np.empty(out.shape, F32)
    np.multiply(a, F32(scale), out=x, dtype=F32, casting="same_kind")
    if mask is not None:
        x_v, m_v = tile_split(x, mask)
        np.add(x_v, m_v, out=x_v, dtype=F32, casting="same_kind")
    x -= np.max(x, axis=-1, keepdims=True)
    np.exp(x, out=x)
    x *= (1.0 / np.sum(x, axis=-1, keepdims=True, dtype=np.float64)).astype(F32)
    if x is not out:
        store(out, x)


register(OpSpec(name="soft_max", n_src=(1, 2), infer=_soft_max_infer, kernel=_soft_max_kernel,
                params={"scale": 1.0}, inplace=True, flops=_per_element(6),
                summary="softmax over the last dim of a·scale + mask (optional 2nd src)"))


# --- diag_mask_inf -------------------------------------------------------------------------

def _diag_mask_infer(srcs, *, n_past):
    (a,) = srcs
    need_float("diag_mask_inf", a)
    need_ndim("diag_mask_inf", a, 2)
    want_int("diag_mask_inf", "n_past", n_past)
    return OpResult(a.shape, a.dtype)


@quiet
def _diag_mask_kernel(out, a, *, n_past):
    np.copyto(out, a)
    rows, cols = a.shape[-2:]
    upper = np.triu(np.ones((rows, cols), dtype=bool), k=n_past + 1)
    out[..., upper] = -np.inf


register(OpSpec(name="diag_mask_inf", n_src=(1, 1), infer=_diag_mask_infer,
                kernel=_diag_mask_kernel, params={"n_past": 0}, inplace=True,
                summary="−inf where j > i + n_past over the last two dims [.., i, j]"))


# --- rope ----------------------------------------------------------------------------------

def _rope_infer(srcs, *, n_dims, mode, freq_base, freq_scale):
    a, pos = srcs
    need_float("rope", a)
    need_ndim("rope", a, 3, 4)
    need_dtype("rope", pos, ("i32",), "b (positions)")
    if pos.shape != (a.shape[-3],):
        raise InputError(f"rope: b (positions) {who(pos)} must be [T] = [{a.shape[-3]}] "
                         f"for a [(B), T, H, D] = {fmt(a.shape)}")
    d = a.shape[-1]
    if n_dims is not None:
        n = want_int("rope", "n_dims", n_dims, lo=2)
        if n % 2 or n > d:
            raise InputError(f"rope: n_dims must be even and at most D = {d}, got {n}")
    elif d % 2:
        raise InputError(f"rope: D = {d} is odd; give an even n_dims <= D")
    if not is_int(mode) or mode not in (0, 2):
        raise InputError(f"rope: mode must be 0 (normal) or 2 (NeoX), got {mode!r}")
    want_number("rope", "freq_base", freq_base, positive=True)
    want_number("rope", "freq_scale", freq_scale, positive=True)
    return OpResult(a.shape, a.dtype)


def rope_angles(pos: np.ndarray, n_dims: int, freq_base: float,
                freq_scale: float) -> np.ndarray:
    """θ[t, i] in f32, formed as ggml forms it, so large positions agree with ggml.

    ggml (rope cache): θ₀ = (float)p, θᵢ₊₁ = θᵢ·powf(base, −2/n) as f32 products, and each
    angle is multiplied by freq_scale as it is used.
    """
    half = n_dims // 2
    # C's powf is correctly rounded here and NumPy's f32 power can be one ulp off, which the
    # running product magnifies at large positions: take the power in f64, round to f32
    step = F32(np.float64(F32(freq_base)) ** np.float64(F32(-2.0) / F32(n_dims)))
    theta = np.empty((pos.shape[0], half), F32)
    theta[:, 0] = pos.astype(F32)
    theta[:, 1:] = step
    np.multiply.accumulate(theta, axis=1, out=theta)
    theta *= F32(freq_scale)
    return theta


@quiet
def _rope_kernel(out, a, pos, *, n_dims, mode, freq_base, freq_scale):
    d = a.shape[-1]
    n = d if n_dims is None else n_dims
    half = n // 2
    theta = rope_angles(pos, n, freq_base, freq_scale)[:, None, :]   # [T, 1, n/2]
    cos, sin = np.cos(theta), np.sin(theta)
    if mode == 0:
        first, second = np.s_[..., 0:n:2], np.s_[..., 1:n:2]
    else:
        first, second = np.s_[..., 0:half], np.s_[..., half:n]
    u, v = a[first], a[second]
    new_u = u * cos - v * sin          # both computed before out (maybe a itself) is touched
    new_v = u * sin + v * cos
    if n < d:
        np.copyto(out[..., n:], a[..., n:])
    store(out[first], new_u)
    store(out[second], new_v)


register(OpSpec(name="rope", n_src=(2, 2), infer=_rope_infer, kernel=_rope_kernel,
                params={"n_dims": None, "mode": 0, "freq_base": 10000.0, "freq_scale": 1.0},
                inplace=True, flops=_per_element(6),
                summary="rotary embedding of a [(B), T, H, D] at positions b i32 [T]"))
