"""Row-wise neural-net ops: norm, rms_norm, soft_max, diag_mask_inf and rope.

All are float-only and keep `a`'s dtype; f16 data is computed in f32. Row statistics (means,
softmax sums) accumulate in f64 as ggml's `ggml_float` does. The in-place ones (rms_norm,
soft_max, diag_mask_inf, rope) compute each row's statistics, or each rotated pair, before
overwriting it, so `out` may be the source's own memory.
"""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops.common import (
    F32, fast_path, fmt, is_int, need_dtype, need_float, need_ndim, quiet, store, tile_split, tiles,
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
    # as ggml-cpu computes it: each square in f32, summed in double, the mean rounded to f32,
    # then 1/sqrtf(mean + eps) in f32 (a last-bit difference here flips q8_0 roundings of the
    # next product's activations, which wide q8_0 models amplify to 1e-2 of the logits)
    sums = np.sum(np.square(a, dtype=F32), axis=-1, dtype=np.float64, keepdims=True)
    mean = (sums / a.shape[-1]).astype(F32)
    inv = F32(1) / np.sqrt(mean + F32(eps))
    np.multiply(a, inv, out=out, dtype=F32, casting="same_kind")


register(OpSpec(name="norm", n_src=(1, 1), infer=_norm_infer("norm"), kernel=_norm_kernel,
                params={"eps": 1e-5}, flops=_per_element(5),
                summary="(a−mean)/√(var+eps) over the last dim"))
register(OpSpec(name="rms_norm", n_src=(1, 1), infer=_norm_infer("rms_norm"),
                kernel=_rms_norm_kernel, params={"eps": 1e-6}, inplace=True,
                flops=_per_element(3), summary="a/√(mean(a²)+eps) over the last dim"))


# --- soft_max ------------------------------------------------------------------------------

def _soft_max_infer(srcs, *, scale, max_bias):
    a = srcs[0]
    need_float("soft_max", a)
    want_number("soft_max", "scale", scale)
    want_number("soft_max", "max_bias", max_bias, nonneg=True)
    if len(srcs) >= 2:
        need_mask_fits("soft_max", srcs[1], a.shape)
    elif max_bias > 0:
        raise InputError("soft_max: max_bias > 0 (ALiBi) needs a mask")
    if len(srcs) == 3:
        need_sinks("soft_max", srcs[2], a.shape[-3] if len(a.shape) >= 3 else 1)
    return OpResult(a.shape, a.dtype)


def need_sinks(op: str, sinks: Tensor, n_head: int) -> None:
    """ggml_soft_max_add_sinks / ggml_flash_attn_ext_add_sinks: one f32 logit per head."""
    need_dtype(op, sinks, ("f32",), "sinks")
    if tuple(sinks.shape) != (n_head,):
        raise InputError(f"{op}: sinks {who(sinks)} must be [{n_head}]: one value per head")


def sink_rows(x: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """Each row's sink logit (x [.., H, T, KV]: the head's, broadcast over the rows)."""
    heads = x.shape[-3] if x.ndim >= 3 else 1
    return np.asarray(sinks, dtype=F32).reshape((heads, 1, 1) if x.ndim >= 3 else (1, 1))


def need_mask_fits(op: str, mask: Tensor, scores: tuple[int, ...]) -> None:
    """ggml_soft_max_ext's rule: same row length, at least as many rows (ggml pads the mask's
    rows; the extra ones are never read), leading dims tiling the scores'."""
    need_float(op, mask, "mask")
    rows_s, cols_s = ((1, 1) + tuple(scores))[-2:]
    rows_m, cols_m = ((1, 1) + mask.shape)[-2:]
    lead_s, lead_m = tuple(scores[:-2]), tuple(mask.shape[:-2])
    if cols_m != cols_s or rows_m < rows_s or not tiles(lead_s + (1, 1), lead_m + (1, 1)):
        raise InputError(
            f"{op}: mask {fmt(mask.shape)} does not fit scores {fmt(scores)}: its last dim must "
            f"equal theirs, it needs at least {rows_s} rows, and its leading dims must tile theirs")


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """Per-head mask multipliers as ggml's soft_max and flash_attn_ext form them (f32 powf)."""
    if max_bias <= 0:
        return np.ones(n_head, F32)
    n_log2 = 1 << int(np.floor(np.log2(n_head)))
    m0 = F32(2.0) ** F32(-max_bias / n_log2)
    m1 = F32(2.0) ** F32(-(max_bias / 2.0) / n_log2)
    h = np.arange(n_head)
    return np.where(h < n_log2, m0 ** (h + 1).astype(F32),
                    m1 ** (2 * (h - n_log2) + 1).astype(F32)).astype(F32)


def masked_scores(x: np.ndarray, mask: np.ndarray | None, max_bias: float) -> None:
    """x += slope(head)·mask in place; x [.., H, T, KV], the mask's first T rows used."""
    if mask is None:
        return
    rows = x.shape[-2] if x.ndim >= 2 else 1
    m = mask[..., :rows, :] if mask.ndim >= 2 else mask
    m = np.asarray(m, dtype=F32)        # read only: an f32 mask is not copied
    if max_bias > 0:
        heads = x.shape[-3] if x.ndim >= 3 else 1
        slopes = alibi_slopes(heads, max_bias)
        m_full = np.empty(x.shape, F32)
        out_v, m_v = tile_split(m_full, m)
        np.copyto(out_v, m_v)
        m_full *= slopes.reshape((heads, 1, 1))
        m = m_full
    x_v, m_v = tile_split(x, m)
    np.add(x_v, m_v, out=x_v, dtype=F32, casting="same_kind")


SOFT_MAX_SHARE_MIN = 1 << 20    # values: below this a thread hand-off costs more than it saves


def _soft_max_bind(out, a, mask=None, sinks=None, *, scale, max_bias, workers=None,
                   constant=()):
    """Attention's softmax (8M values at 512 tokens, 7 passes each: ~45-55 ms in one call)
    shared among the run's threads by its largest leading dim (the heads), one slice at a
    time so each slice's passes run in L3 instead of memory (one thread: ~20% faster; two:
    ~2.3x). Rows are independent and each is computed as the kernel computes it, so the
    bits are the kernel's. None (the kernel) where a slice would need its own part of the
    mask or its own ALiBi slopes, or the scores are too small to be worth it."""
    if (workers is None or max_bias > 0 or out.dtype != F32 or sinks is not None
            or out.ndim < 3 or out.size < SOFT_MAX_SHARE_MIN
            or (mask is not None and np.may_share_memory(mask, out))):
        return None
    lead = out.shape[:-2]
    axis = int(np.argmax(lead))
    mask_axis = axis - (out.ndim - mask.ndim) if mask is not None else -1
    if lead[axis] < 2 or (mask_axis >= 0 and mask.shape[mask_axis] != 1):
        return None
    pick = (slice(None),) * axis
    rows = out.shape[-2]

    def run() -> None:
        mask32 = None if mask is None else np.asarray(   # once, not per slice; an f32
            mask[..., :rows, :] if mask.ndim >= 2 else mask, dtype=F32)   # mask: no copy

        def work(lo: int, hi: int) -> None:
            with np.errstate(all="ignore"):           # error state is per thread
                for i in range(lo, hi):
                    x = out[pick + (slice(i, i + 1),)]
                    np.multiply(a[pick + (slice(i, i + 1),)], F32(scale), out=x, dtype=F32,
                                casting="same_kind")
                    masked_scores(x, mask32, max_bias)
                    softmax_rows(x)

        workers.share_evenly(work, lead[axis])

    return run, ()


@fast_path(_soft_max_bind)
@quiet
def _soft_max_kernel(out, a, mask=None, sinks=None, *, scale, max_bias):
    if mask is not None and np.may_share_memory(mask, out):
        mask = mask.copy()     # ggml may give the node its mask's slot; read it before writing
    x = out if out.dtype == F32 else np.empty(out.shape, F32)
    np.multiply(a, F32(scale), out=x, dtype=F32, casting="same_kind")
    masked_scores(x, mask, max_bias)
    softmax_rows(x, None if sinks is None else sink_rows(x, sinks))
    if x is not out:
        store(out, x)


def softmax_rows(x: np.ndarray, sinks: np.ndarray | None = None) -> None:
    """In place over the last dim, the sum in f64 as ggml's ggml_float. With `sinks` (a logit
    per row, broadcast), ggml-cpu's correction as if each row had one more value: the max
    includes it and exp(sink - max) joins the sum, so the row sums to less than 1."""
    top = np.max(x, axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks)
    x -= top
    np.exp(x, out=x)
    total = np.sum(x, axis=-1, keepdims=True, dtype=np.float64)
    if sinks is not None:
        total = total + np.exp(sinks - top).astype(np.float64)
    x *= (1.0 / total).astype(F32)


_soft_max_kernel.binds_run_context = True   # the executor passes workers= and constant=


register(OpSpec(name="soft_max", n_src=(1, 3), infer=_soft_max_infer, kernel=_soft_max_kernel,
                params={"scale": 1.0, "max_bias": 0.0}, inplace=True, flops=_per_element(6),
                summary="softmax over the last dim of a·scale + slope·mask (optional 2nd src; "
                        "ALiBi slopes when max_bias > 0); optional 3rd: sinks f32 [H], one "
                        "more logit per head in each row's max and sum"))


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
    if not is_int(mode) or mode not in (0, 2, *ROPE_MULTI):
        raise InputError(f"rope: mode must be 0 (normal), 2 (NeoX), 8 (M-RoPE) or 40 (IMROPE), "
                         f"got {mode!r}")
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
                params=dict(_ROPE_PARAMS), inplace=True, flops=_per_element(6),
                summary="rotary embedding of a [(B), T, H, D] at positions b i32 [T]; "
                        "rope_ext's YaRN params and optional freq_factors c f32 [n_dims/2]"))
