"""Ops the reference evaluator computes with its own code, never the kernel it checks.

Each is the op's formula from docs/format.md written plainly in float64, one (sequence, head)
at a time: nothing is imported from the op's module, so a mistake in the kernel (a mask
broadcast, a head mapping) shows as a difference instead of being repeated here. The kernel
follows ggml-cpu's roundings (f16 accumulation of an f16 V); the formula does not, so outputs
that depend on such an op are compared with `LOOSER[op]` where the op read a non-f32 k or v.
"""

from __future__ import annotations

import math

import numpy as np

# relative tolerance of `run --check` for outputs downstream of the op when it rounds (f16/q8_0
# k or v): ggml-cpu's per-row path accumulates an f16 V in f16 (docs/format.md)
LOOSER = {"flash_attn_ext": 2e-3}


def _f64(arr: np.ndarray) -> np.ndarray:
    if getattr(arr, "ggml_type", ""):            # bf16 bits or block bytes: the type decoder
        from ggmlrun.core.ir.ops.quant import to_f32
        return to_f32(arr).astype(np.float64)
    return np.asarray(arr, dtype=np.float64)


def _alibi(n_head: int, max_bias: float) -> list[float]:
    """ALiBi's slope per head (m0^(h+1) for the first 2^floor(log2 n), then m1^(2(h-n2)+1))."""
    if max_bias <= 0:
        return [1.0] * n_head
    n2 = 2 ** int(math.floor(math.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n2), 2.0 ** (-max_bias / 2.0 / n2)
    return [m0 ** (h + 1) if h < n2 else m1 ** (2 * (h - n2) + 1) for h in range(n_head)]


def flash_attn_ext(out, q, k, v, mask=None, sinks=None, *, scale, max_bias, logit_softcap,
                   prec):
    """out[s, t, h] = softmax_j(z[t, j]) · v[s, g, j] with g = h // (H / Hkv) and
    z = q[s, h, t] · k[s, g, j] · scale (softcap·tanh(z/softcap) when logit_softcap > 0)
    plus slope_h · mask[s mod M3, h mod M2, t, j]; a mask of fewer dims has M3 (and M2) = 1.
    A sink adds exp(sink_h) to the denominator; a row that is -inf everywhere gives 0."""
    qv, kv, vv = _f64(q), _f64(k), _f64(v)
    n_seq, n_head, n_tok, _ = qv.shape
    group = n_head // kv.shape[1]
    slopes = _alibi(n_head, max_bias)
    m = None
    if mask is not None:
        m = _f64(mask)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    for s in range(n_seq):
        for h in range(n_head):
            g = h // group
            z = qv[s, h] @ kv[s, g].T * scale                      # [T, KV]
            if logit_softcap:
                z = logit_softcap * np.tanh(z / logit_softcap)
            if m is not None:
                z = z + slopes[h] * m[s % m.shape[0], h % m.shape[1], :n_tok, :]
            top = z.max(axis=-1, keepdims=True)
            if sinks is not None:
                top = np.maximum(top, float(sinks[h]))
            top = np.where(np.isneginf(top), 0.0, top)
            w = np.exp(z - top)
            total = w.sum(axis=-1, keepdims=True)
            if sinks is not None:
                total = total + np.exp(float(sinks[h]) - top)
            res = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0) @ vv[s, g]
            out[s, :, h, :] = res


OPS = {"flash_attn_ext": flash_attn_ext}


def rounds(node) -> bool:
    """Whether the kernel of this node rounds where the formula does not (k or v not f32)."""
    return node.op == "flash_attn_ext" and any(src.dtype != "f32" for src in node.src[1:3])
