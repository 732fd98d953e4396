"""rope: ggml_rope_ext and ggml_rope_multi, the rotary embedding with YaRN's extension and
optional frequency factors, in the normal, NeoX, M-RoPE and IMROPE modes.

Float-only, keeps `a`'s dtype. θ is formed in f32 as ggml's rope cache forms it (products, not
powers), so positions far into a long context agree; each rotated pair is computed before it
is overwritten, so `out` may be the source's own memory.
"""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.ir.ops.common import (
    F32, fmt, is_int, need_dtype, need_float, need_ndim, need_rows, per_element, quiet, store,
    want_int, want_number, who)
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register

# rope_ext's params (ggml_rope_ext): YaRN's ext_factor/attn_factor/beta_* and the optional
# third source freq_factors (Llama 3's per-pair divisors of θ). With ext_factor 0,
# attn_factor 1 and no factors it is the plain rotary embedding, bit for bit as before.

_ROPE_PARAMS = {"n_dims": None, "mode": 0, "n_ctx_orig": 0, "freq_base": 10000.0,
                "freq_scale": 1.0, "ext_factor": 0.0, "attn_factor": 1.0,
                "beta_fast": 32.0, "beta_slow": 1.0, "sections": None}
# ggml_rope_multi's modes: M-RoPE (8) and Qwen3-VL's interleaved IMROPE (40) read four positions
# per token (b is [4 T]: t, h, w, e) and pick one per rotated pair by `sections` (4 counts)
ROPE_MULTI = (8, 40)


def _rope_infer(srcs, *, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                attn_factor, beta_fast, beta_slow, sections):
    a, pos = srcs[0], srcs[1]
    need_float("rope", a)
    need_ndim("rope", a, 3, 4)
    need_dtype("rope", pos, ("i32",), "b (positions)")
    need_rows("rope", a)
    if not is_int(mode) or mode not in (0, 2, *ROPE_MULTI):
        raise InputError(f"rope: mode must be 0 (normal), 2 (NeoX), 8 (M-RoPE) or 40 (IMROPE), "
                         f"got {mode!r} (ggml's vision mode 24 and others are not modelled)")
    n_pos = 4 if mode in ROPE_MULTI else 1
    if pos.shape != (n_pos * a.shape[-3],):
        raise InputError(f"rope: b (positions) {who(pos)} must be [{'4 T' if n_pos > 1 else 'T'}]"
                         f" = [{n_pos * a.shape[-3]}] for a [(B), T, H, D] = {fmt(a.shape)}")
    if (sections is not None) != (mode in ROPE_MULTI) or sections is not None and (
            not isinstance(sections, (list, tuple)) or len(sections) != 4
            or not all(is_int(x) and x >= 0 for x in sections) or not any(sections[:3])):
        raise InputError(f"rope: sections (4 counts, one of the first three > 0) go with modes "
                         f"8 and 40 (multi-rope) only; got mode {mode!r}, sections {sections!r}")
    d = a.shape[-1]
    n = d
    if n_dims is not None:
        n = want_int("rope", "n_dims", n_dims, lo=2)
        if n % 2 or n > d:
            raise InputError(f"rope: n_dims must be even and at most D = {d}, got {n}")
    elif d % 2:
        raise InputError(f"rope: D = {d} is odd; give an even n_dims <= D")
    if sections is not None and sum(sections) > n // 2:
        raise InputError(f"rope: sections {list(sections)} add up past n_dims/2 = {n // 2}")
    want_int("rope", "n_ctx_orig", n_ctx_orig, lo=0)
    want_number("rope", "freq_base", freq_base, positive=True)
    want_number("rope", "freq_scale", freq_scale, positive=True)
    for key, value in (("ext_factor", ext_factor), ("attn_factor", attn_factor),
                       ("beta_fast", beta_fast), ("beta_slow", beta_slow)):
        want_number("rope", key, value)
    if ext_factor != 0 and n_ctx_orig == 0:
        raise InputError("rope: ext_factor != 0 (YaRN) needs n_ctx_orig > 0")
    if len(srcs) == 3:
        factors = srcs[2]
        need_dtype("rope", factors, ("f32",), "c (freq_factors)")
        if len(factors.shape) != 1 or factors.shape[0] < n // 2:   # ggml: c->ne[0] >= n_dims/2
            raise InputError(f"rope: c (freq_factors) {who(factors)} must be one row of at "
                             f"least n_dims/2 = {n // 2} values")
    return OpResult(a.shape, a.dtype)


def _theta_extrap(pos: np.ndarray, n_dims: int, freq_base: float) -> np.ndarray:
    """θ[t, i] in f32 before freq_scale, formed as ggml forms it (agreement at large positions).

    ggml (rope cache): θ₀ = (float)p, θᵢ₊₁ = θᵢ·powf(base, −2/n) as f32 products.
    """
    half = n_dims // 2
    # C's powf is correctly rounded here and NumPy's f32 power can be one ulp off, which the
    # running product magnifies at large positions: take the power in f64, round to f32
    step = F32(np.float64(F32(freq_base)) ** np.float64(F32(-2.0) / F32(n_dims)))
    theta = np.empty((pos.shape[0], half), F32)
    theta[:, 0] = pos.astype(F32)
    theta[:, 1:] = step
    np.multiply.accumulate(theta, axis=1, out=theta)
    return theta


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims, in f32 as ggml computes it."""
    def corr_dim(n_rot: float) -> float:
        return F32(n_dims) * np.log(F32(n_ctx_orig) / (F32(n_rot) * F32(2) * F32(np.pi)),
                                    dtype=F32) / (F32(2) * np.log(F32(freq_base), dtype=F32))
    start = np.floor(corr_dim(beta_fast))
    end = np.ceil(corr_dim(beta_slow))
    return float(max(0.0, start)), float(min(n_dims - 1.0, end))


def rope_cos_sin(pos: np.ndarray, n_dims: int, freq_base: float, freq_scale: float,
                 ext_factor: float, attn_factor: float, corr: tuple[float, float],
                 factors: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """ggml-cpu's rope cache (ggml_rope_cache_init + rope_yarn): cos and sin, [T, n/2]."""
    theta_extrap = _theta_extrap(pos, n_dims, freq_base)
    if factors is not None:      # ggml reads the first n_dims/2 (a head's worth may be given)
        theta_extrap = theta_extrap / factors[:n_dims // 2].astype(F32)
    theta = F32(freq_scale) * theta_extrap
    mscale = F32(attn_factor)
    if ext_factor != 0.0:
        i0 = np.arange(0, n_dims, 2)
        y = (i0 // 2 - F32(corr[0])) / F32(max(0.001, corr[1] - corr[0]))
        ramp_mix = (1 - np.minimum(1, np.maximum(0, y))).astype(F32) * F32(ext_factor)
        theta = theta * (1 - ramp_mix) + theta_extrap * ramp_mix
        mscale = F32(mscale * (F32(1) + F32(0.1) * np.log(F32(1) / F32(freq_scale), dtype=F32)))
    cos, sin = np.cos(theta), np.sin(theta)
    if mscale != 1:
        cos, sin = cos * mscale, sin * mscale
    return cos, sin


def multi_rope_stream(sections, half: int, imrope: bool) -> list[int]:
    """ggml_mrope_cache_init: which of the four positions (0 t, 1 h, 2 w, 3 e) each rotated
    pair i of n_dims/2 takes, by its sector i % sum(sections)."""
    s0, s1, s2, s3 = sections
    total, sec_w = s0 + s1 + s2 + s3, s0 + s1
    out = []
    for i in range(half):
        sector = i % total
        if imrope:
            if sector % 3 == 1 and sector < 3 * s1:
                out.append(1)
            elif sector % 3 == 2 and sector < 3 * s2:
                out.append(2)
            elif sector % 3 == 0 and sector < 3 * s0:
                out.append(0)
            else:
                out.append(3)
        else:
            out.append(0 if sector < s0 else 1 if sector < sec_w else
                       2 if sector < sec_w + s2 else 3)
    return out


@quiet
def _rope_kernel(out, a, pos, factors=None, *, n_dims, mode, n_ctx_orig, freq_base,
                 freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, sections):
    d = a.shape[-1]
    n = d if n_dims is None else n_dims
    half = n // 2
    corr = (0.0, 0.0)
    if ext_factor != 0.0:
        corr = yarn_corr_dims(n, n_ctx_orig, freq_base, beta_fast, beta_slow)
    if mode in ROPE_MULTI:       # each pair's θ from its own position stream (a running product each)
        T = a.shape[-3]
        streams = [rope_cos_sin(pos[j * T:(j + 1) * T], n, freq_base, freq_scale, ext_factor,
                                attn_factor, corr, factors) for j in range(4)]
        pick = np.asarray(multi_rope_stream(sections, half, mode == 40))
        cos = np.choose(pick[None, :], [c for c, _ in streams])
        sin = np.choose(pick[None, :], [s for _, s in streams])
    else:
        cos, sin = rope_cos_sin(pos, n, freq_base, freq_scale, ext_factor, attn_factor, corr,
                                factors)
    cos, sin = cos[:, None, :], sin[:, None, :]                     # [T, 1, n/2]
    if mode == 0:            # NeoX, M-RoPE and IMROPE rotate pairs n_dims/2 apart
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


register(OpSpec(name="rope", n_src=(2, 3), infer=_rope_infer, kernel=_rope_kernel,
                params=dict(_ROPE_PARAMS), inplace=True, flops=per_element(6),
                summary="rotary embedding of a [(B), T, H, D] at positions b i32 [T]; "
                        "rope_ext's YaRN params and optional freq_factors c f32 [n_dims/2]"))
