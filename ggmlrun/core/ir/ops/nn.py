"""Row-wise neural-net ops: norm, rms_norm, soft_max and diag_mask_inf (rope is rope.py's).

All are float-only and keep `a`'s dtype; f16 data is computed in f32. Row statistics (means,
softmax sums) accumulate in f64 as ggml's `ggml_float` does. The in-place ones (rms_norm,
soft_max, diag_mask_inf) compute each row's statistics before overwriting it, so `out` may be
the source's own memory.
"""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops.common import (
    F32, fast_path, fmt, need_contiguous, need_dtype, need_float, need_ndim, need_rows,
    per_element, quiet, store, tile_split, tiles, want_int, want_number, who)
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register


# --- norm, rms_norm ------------------------------------------------------------------------

def _norm_infer(op: str):
    def infer(srcs, *, eps):
        (a,) = srcs
        need_dtype(op, a, ("f32",))
        if op == "rms_norm":
            need_rows(op, a)
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
                params={"eps": 1e-5}, flops=per_element(5),
                summary="(a−mean)/√(var+eps) over the last dim"))
register(OpSpec(name="rms_norm", n_src=(1, 1), infer=_norm_infer("rms_norm"),
                kernel=_rms_norm_kernel, params={"eps": 1e-6}, inplace=True,
                flops=per_element(3), summary="a/√(mean(a²)+eps) over the last dim"))


# --- soft_max ------------------------------------------------------------------------------

def _soft_max_infer(srcs, *, scale, max_bias):
    a = srcs[0]
    need_dtype("soft_max", a, ("f32",))
    need_contiguous("soft_max", a)
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
    rows; the extra ones are never read), leading dims tiling the scores'; contiguous, as
    ggml_soft_max_ext and ggml_flash_attn_ext assert."""
    need_float(op, mask, "mask")
    need_contiguous(op, mask, "mask")
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
                params={"scale": 1.0, "max_bias": 0.0}, inplace=True, flops=per_element(6),
                summary="softmax over the last dim of a·scale + slope·mask (optional 2nd src; "
                        "ALiBi slopes when max_bias > 0); optional 3rd: sinks f32 [H], one "
                        "more logit per head in each row's max and sum"))


# --- diag_mask_inf -------------------------------------------------------------------------

def _diag_mask_infer(srcs, *, n_past):
    (a,) = srcs
    need_dtype("diag_mask_inf", a, ("f32",))
    need_ndim("diag_mask_inf", a, 2)
    need_contiguous("diag_mask_inf", a)
    want_int("diag_mask_inf", "n_past", n_past, lo=0)
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
