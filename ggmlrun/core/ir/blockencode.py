"""The block encoders ggml-cpu writes a cache with (set_rows' from_float) where gguf.quants has
none (iq4_nl) or rounds otherwise (q8_0), so that a quantized KV cache holds ggml's bytes.

- q8_0: ggml-cpu's x86 quantize_row_q8_0 (AVX/AVX2): the quants are rint(x * 127/amax), half
  to even; gguf's reference code multiplies by 1/d and rounds half away from zero, which
  differ in the last bit of one value in a few hundred.
- iq4_nl: quantize_row_iq4_nl_ref (ggml-quants.c, which ggml-cpu's from_float calls): each
  block's d from its signed largest value over kvalues_iq4nl[0], every value to the nearest
  of the 16 non-linear levels (best_index_int8), then d refitted by least squares weighted by
  x², summed in block order in f32.
"""

from __future__ import annotations

from ggmlrun.core.util.lazynumpy import np, numpy_later

F32 = numpy_later(lambda np: np.float32)
# ggml-common.h: kvalues_iq4nl, the 16 levels of an iq4_nl (and iq4_xs) quant
IQ4NL_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
GROUP_MAX_EPS = 1e-15      # ggml-quants.c: a block whose largest |x| is below it is all 0


def _blocks(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=F32).reshape(-1, 32)


def _packed(values: np.ndarray, d: np.ndarray, body: np.ndarray) -> np.ndarray:
    """Blocks of [f16 d, body bytes] as the rows' storage (rows in the last axis)."""
    out = np.empty((d.shape[0], 2 + body.shape[1]), np.uint8)
    out[:, :2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = body
    return out.reshape(values.shape[:-1] + (-1,))


def encode_q8_0(values: np.ndarray) -> np.ndarray:
    blocks = _blocks(values)
    amax = np.abs(blocks).max(axis=1)
    d = amax / F32(127)
    inv = np.zeros_like(d)
    np.divide(F32(127), amax, out=inv, where=amax != 0)
    q = np.rint(blocks * inv[:, None]).astype(np.int8)
    return _packed(values, d, q.view(np.uint8))


def best_index_iq4nl(x: np.ndarray) -> np.ndarray:
    """best_index_int8(16, kvalues_iq4nl, x): the nearest level, the upper one on a tie."""
    levels = np.asarray(IQ4NL_LEVELS, dtype=F32)
    mu = np.clip(np.searchsorted(levels, x, side="right"), 1, 15)
    lower = (x - levels[mu - 1]) < (levels[mu] - x)
    index = np.where(lower, mu - 1, mu)
    index = np.where(x <= levels[0], 0, index)
    return np.where(x >= levels[15], 15, index)


def encode_iq4_nl(values: np.ndarray) -> np.ndarray:
    blocks = _blocks(values)
    levels = np.asarray(IQ4NL_LEVELS, dtype=F32)
    ax = np.abs(blocks)
    first = np.argmax(ax, axis=1)                    # the first largest, as `ax > amax` keeps
    amax = ax[np.arange(len(blocks)), first]
    signed = blocks[np.arange(len(blocks)), first]
    live = amax >= F32(GROUP_MAX_EPS)
    d = np.where(live, signed / levels[0], F32(1)).astype(F32)
    inv = (F32(1) / d).astype(F32)
    index = best_index_iq4nl(inv[:, None] * blocks)
    q = levels[index]
    weight = blocks * blocks
    sum_qx = np.zeros(len(blocks), F32)
    sum_q2 = np.zeros(len(blocks), F32)
    for j in range(32):                             # in block order, as the C loop sums
        wq = weight[:, j] * q[:, j]
        sum_qx += wq * blocks[:, j]
        sum_q2 += wq * q[:, j]
    fitted = np.zeros_like(sum_qx)
    np.divide(sum_qx, sum_q2, out=fitted, where=sum_q2 > 0)
    fitted[~live] = 0
    index[~live] = 0
    nibbles = index.astype(np.uint8)
    body = nibbles[:, :16] | (nibbles[:, 16:] << 4)
    return _packed(values, fitted, body)


ENCODERS = {"q8_0": encode_q8_0, "iq4_nl": encode_iq4_nl}


def encode_fast(values: np.ndarray, name: str) -> np.ndarray | None:
    """ggml-cpu's bytes for these f32 rows as type `name`, where this module has its encoder;
    None otherwise (gguf's reference encoders are ggml's for the other types)."""
    encode = ENCODERS.get(name)
    return None if encode is None else encode(values)
