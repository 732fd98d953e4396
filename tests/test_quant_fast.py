"""The fast block decoders and b's rounding are gguf's/ggml's arithmetic, bit for bit.

Random bytes cover every nibble and bit pattern; the scales are then overwritten with the edge
values a real file can hold (0, -0, subnormal, max f16, inf, nan) so each decoder meets them
in every position. Bitwise equality (uint32 views) is asked, NaN payloads included.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as Q

from ggmlrun.core.ir.blockdecode import DECODERS, decode_fast
from ggmlrun.core.ir.ops.quant import q8_1_sum_error, round_like_vec_dot, to_f32
from ggmlrun.core.ir.types import TYPES, decode_blocks

EDGE_F16 = np.array([0.0, -0.0, 6e-8, -6e-8, 65504.0, -65504.0, np.inf, -np.inf, np.nan,
                     1.0, -1.0, 0.5, 1e-3], dtype=np.float16)

# byte offsets of each type's f16 scales within a block
SCALE_AT = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2),
            "q4_K": (0, 2), "q5_K": (0, 2), "q6_K": (208,),
            "mxfp4": ()}     # its E8M0 scale byte: any of the 256, random bytes cover them


def random_blocks(name: str, n_blocks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = TYPES[name].type_size
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for at in SCALE_AT[name]:
        scales = rng.choice(EDGE_F16, n_blocks)
        normal = rng.random(n_blocks) < 0.5       # half the blocks keep an ordinary scale
        scales[normal] = (rng.standard_normal(normal.sum()) * 0.01).astype(np.float16)
        raw[:, at:at + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


def gguf_decode(raw: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gq.dequantize(raw, Q[name.upper()])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_every_hot_type_has_a_fast_decoder():
    assert set(SCALE_AT) == set(DECODERS)
    for name, (_, block, size) in DECODERS.items():
        assert (TYPES[name].block_size, TYPES[name].type_size) == (block, size)


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_fast_decoder_is_bit_identical_to_gguf(name):
    raw = random_blocks(name, 3000, seed=len(name) + ord(name[1]))
    rows = raw.reshape(300, -1)               # 10 blocks a row
    assert same_bits(decode_fast(rows, name), gguf_decode(rows, name))


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_all_nibble_values_with_a_plain_scale(name):
    """Every byte value in every quant position, with the f16 scales (and mins) 1, so the
    quants are not hidden behind a zero or non-finite scale."""
    size = TYPES[name].type_size
    raw = np.tile(np.arange(256, dtype=np.uint8), (size + 255) // 256 * 2)
    raw = np.stack([np.roll(raw, k)[:size] for k in range(256)])
    for at in SCALE_AT[name]:
        raw[:, at:at + 2] = np.ones(1, np.float16).view(np.uint8).reshape(1, 2)
    assert same_bits(decode_fast(raw, name), gguf_decode(raw, name))


def test_decoding_a_chunked_batch_matches_row_by_row():
    """More blocks than one chunk, in a 3-D batch: chunk seams and shapes are invisible."""
    raw = random_blocks("q4_0", 2 * 40000, seed=7).reshape(4, 10, -1)
    whole = decode_blocks(raw, "q4_0")
    assert whole.shape == (4, 10, 2000 * 32)
    assert same_bits(whole, gguf_decode(raw, "q4_0"))
    assert same_bits(decode_blocks(raw[2, 3], "q4_0"), whole[2, 3])


def test_types_without_a_fast_decoder_still_decode():
    values = np.linspace(-1, 1, 256 * 4, dtype=np.float32).reshape(2, -1)
    raw = gq.quantize(values, Q.Q8_0)
    assert decode_fast(raw, "q2_K") is None
    q2 = random_blocks("q4_K", 4, seed=1)[:, :84]          # any 84 bytes are a q2_K block
    assert same_bits(decode_blocks(q2, "q2_K"), gguf_decode(q2, "q2_K"))


def test_a_torn_row_is_refused():
    with pytest.raises(ValueError, match="not whole blocks"):
        decode_fast(np.zeros((2, 35), np.uint8), "q8_0")


# --- b's rounding, against the straightforward formulas it replaces ----------------------------

def edge_activations(n_rows: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    b = rng.standard_normal((n_rows, k)).astype(np.float32) * 3
    b[0, :32] = 0.0                                         # an all-zero block: d = 0
    b[0, 32:64] = -0.0
    b[1, :32] = np.float32(1e-39)                           # subnormal block
    b[1, 40] = np.float32(127.5)                            # ties at the block max
    b[2, 5] = np.float32(3e38)                              # huge values
    b[2, 200] = -np.float32(3e38)
    b[3, 64:96] = np.arange(32, dtype=np.float32) - 15.5    # halves: rint rounds to even
    return b


def slow_q8_0_round(x):
    blocks = x.reshape(-1, 32)
    d = np.max(np.abs(blocks), axis=1, keepdims=True) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0))
    return (np.rint(blocks * inv) * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


def slow_q8_k_round(x):
    blocks = x.reshape(-1, 256)
    idx = np.argmax(np.abs(blocks), axis=1)
    signed_max = blocks[np.arange(blocks.shape[0]), idx][:, None]
    iscale = np.float32(-127) / np.where(signed_max != 0, signed_max, np.float32(1))
    out = np.minimum(np.rint(blocks * iscale), np.float32(127)) * (np.float32(1) / iscale)
    return np.where(signed_max != 0, out, np.float32(0)).reshape(x.shape).astype(np.float32)


def slow_q8_1_sum_error(b):
    blocks = b.reshape(b.shape[:-1] + (-1, 32))
    d = np.max(np.abs(blocks), axis=-1) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0))
    total = np.sum(np.rint(blocks * inv[..., None]), axis=-1, dtype=np.float32)
    stored = (d * total).astype(np.float16).astype(np.float32)
    return stored - d.astype(np.float16).astype(np.float32) * total


@pytest.mark.parametrize("weight, slow", [("q4_0", slow_q8_0_round), ("q8_0", slow_q8_0_round),
                                          ("q4_K", slow_q8_k_round), ("q6_K", slow_q8_k_round)])
def test_b_rounding_is_unchanged(weight, slow):
    b = edge_activations(7, 512, seed=3)
    with np.errstate(all="ignore"):
        assert same_bits(round_like_vec_dot(b, weight), slow(b))


def test_q8_1_sum_error_is_unchanged():
    b = edge_activations(5, 256, seed=4).reshape(5, 1, 256)
    with np.errstate(all="ignore"):
        assert same_bits(q8_1_sum_error(b), slow_q8_1_sum_error(b))


def test_to_f32_of_a_typed_weight_uses_the_fast_path():
    from ggmlrun.core.ir.ops.quant import storage_view
    raw = random_blocks("q6_K", 8, seed=5)
    buf = np.ascontiguousarray(raw).reshape(-1).copy()
    typed = storage_view(buf, 0, (2, 1024), (4 * 210, 1), TYPES["q6_K"])
    assert same_bits(to_f32(typed), gguf_decode(raw.reshape(2, -1), "q6_K"))


# --- f32 -> f16 -> f32 rounding (b of an f16 weight: attention's q and softmax) ---------------

def f32_sweep() -> np.ndarray:
    """Every 1021st f32 bit pattern, plus, for every sign and exponent, mantissas whose low 13
    bits sit at and around the f16 halfway point (ties, both parities) and the ends."""
    coarse = np.arange(0, 1 << 32, 1021, dtype=np.uint64).astype(np.uint32)
    high = np.arange(1 << 9, dtype=np.uint32)[None, :] << np.uint32(13)     # 9 of the 10 kept
    parity = np.array([0, 1 << 13], np.uint32)[:, None, None]               # the 10th: even/odd
    low = np.array([0, 1, 0xFFE, 0xFFF, 0x1000, 0x1001, 0x1FFE, 0x1FFF], np.uint32)[:, None]
    mantissas = (high[None] | parity | low[None]).reshape(-1) & np.uint32(0x7FFFFF)
    exponents = np.arange(256, dtype=np.uint32) << np.uint32(23)
    signs = np.array([0, 1 << 31], np.uint32)
    dense = (signs[:, None, None] | exponents[None, :, None] | mantissas[None, None, :])
    return np.concatenate([coarse, dense.reshape(-1)]).view(np.float32)


def test_f16_round_gives_numpys_round_trip_bit_for_bit():
    from ggmlrun.core.ir.ops.quant import f16_round
    x = f32_sweep()
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).astype(np.float32)
        got = f16_round(x)
    assert same_bits(got, want)
    assert same_bits(f16_round(x[:1000].reshape(10, 100)), want[:1000].reshape(10, 100))


def test_f16_round_of_non_negative_chunks_takes_the_four_pass_path(monkeypatch):
    """0 <= x < 65520 (a softmax) is rounded by adding and subtracting 2^(e+13); the sweep's
    non-negative part, subnormals and the f16 overflow edge give NumPy's bits, and a chunk
    holding a negative value, inf, nan or 65520 takes the general path."""
    from ggmlrun.core.ir.ops import quant
    x = f32_sweep()
    bits = x.view(np.uint32)
    plain = x[bits < np.uint32(0x477FF000)]
    edges = np.array([0.0, 2.0 ** -149, 2.0 ** -25, 3 * 2.0 ** -26, 2.0 ** -24, 2.0 ** -14,
                      2.0 ** -14 - 2.0 ** -25, 1.0, 2048.5, 65504.0, 65519.996], np.float32)
    taken = []
    real = quant._f16_round_plain
    monkeypatch.setattr(quant, "_f16_round_plain", lambda *a: taken.append(1) or real(*a))
    for values, plain_path in [(plain, True), (edges, True), (np.append(edges, -1.0), False),
                               (np.append(edges, 65520.0), False),
                               (np.append(edges, np.inf), False)]:
        taken.clear()
        with np.errstate(all="ignore"):
            want = values.astype(np.float16).astype(np.float32)
        assert same_bits(quant.f16_round(values), want)
        assert bool(taken) == plain_path


def test_f16_round_checks_for_nan_only_where_a_chunk_took_the_general_path(monkeypatch):
    """All-plain input (a softmax) skips the whole-array nan pass; a nan in a later chunk,
    after plain ones, still gets NumPy's own conversion (its payload), as do negative chunks
    beside plain ones."""
    from ggmlrun.core.ir.ops import quant
    monkeypatch.setattr(quant, "_F16_CHUNK", 64)
    rng = np.random.default_rng(3)
    soft = rng.random(64 * 5).astype(np.float32)
    payload = np.array([0x7FC00123, 0xFFC00001, 0x7F800001], np.uint32).view(np.float32)
    for x in (soft, np.concatenate([soft, payload, soft[:61]]), np.concatenate([soft, -soft])):
        with np.errstate(all="ignore"):
            want = x.astype(np.float16).astype(np.float32)
        assert same_bits(quant.f16_round(x), want)
    monkeypatch.setattr(np, "isnan", lambda *a, **k: pytest.fail("nan pass on plain input"))
    quant.f16_round(soft)
