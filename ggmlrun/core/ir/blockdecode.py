"""Fast decoders for the block types a model's weights use most.

`gguf.quants` (llama.cpp's reference code in NumPy) decodes about 12 ns an element: it splits
rows into groups of 16, makes a temporary for every step and concatenates the groups. A
quantized mul_mat decodes its whole weight on every call, so that cost lands on the hot path
of `run MODEL`. The decoders here do the same arithmetic on views of the block bytes (the f16
scales read through a uint16 view, the quants bit-unpacked in uint8/int8 and cast to f32
inside the final multiply), a chunk of blocks at a time so the temporaries stay in cache.

Each one is bit-identical to gguf.quants (tests/test_quant_fast.py proves it on random blocks
with edge values): the same f32 products and sums happen in the same order, only fewer
temporaries are made. Types without a decoder here return None and are decoded by gguf.
"""

from __future__ import annotations

from ggmlrun.core.util.lazynumpy import np, numpy_later

F32 = numpy_later(lambda np: np.float32)
U8 = numpy_later(lambda np: np.uint8)
QK_K = 256
_CHUNK_VALUES = 1 << 19          # values decoded per step: 2 MiB of f32, an L2-sized working set


def f16_at(u16: np.ndarray, col: int) -> np.ndarray:
    """The f16 stored at 2-byte column `col` of every block, as f32 (1-D)."""
    return u16[:, col].view(np.float16).astype(F32)


def _split_nibbles(qs: np.ndarray, out: np.ndarray) -> None:
    """qs [n, .., L] bytes -> out [n, .., 2, L] f32: low nibbles, then high (ggml's order).

    The bit operations run in uint8 and NumPy casts their results into `out` as it goes (no
    uint8 temporary: ~15% faster than masking into one and copying it)."""
    np.bitwise_and(qs, U8(15), out=out[..., 0, :])
    np.right_shift(qs, U8(4), out=out[..., 1, :])


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Bit j of each byte of qh [n, L] as [n, count, L] (0/1), j = 0..count-1."""
    shifts = np.arange(count, dtype=U8).reshape(1, count, 1)
    return (qh[:, None, :] >> shifts) & U8(1)


def _q8_0(blocks, out):
    np.copyto(out, blocks[:, 2:].view(np.int8))
    out *= f16_at(blocks.view(np.uint16), 0)[:, None]


def _q4_0(blocks, out):
    n = len(blocks)
    _split_nibbles(np.ascontiguousarray(blocks[:, 2:]), out.reshape(n, 2, 16))
    out -= F32(8)                       # exact: small integers, as ggml's int8 q - 8
    out *= f16_at(blocks.view(np.uint16), 0)[:, None]


def _q4_1(blocks, out):
    n = len(blocks)
    u16 = blocks.view(np.uint16)
    _split_nibbles(np.ascontiguousarray(blocks[:, 4:]), out.reshape(n, 2, 16))
    out *= f16_at(u16, 0)[:, None]
    out += f16_at(u16, 1)[:, None]


def _five_bit(blocks, qh_at: int, qs_at: int, out) -> None:
    """q5_0/q5_1 quants 0..31 into out (f32): bit i of the little-endian u32 qh is value i's
    fifth bit."""
    n = len(blocks)
    qs = blocks[:, qs_at:]
    q = np.empty((n, 2, 16), U8)
    np.bitwise_and(qs, U8(15), out=q[:, 0])
    np.right_shift(qs, U8(4), out=q[:, 1])
    q = q.reshape(n, 32)
    q |= np.unpackbits(blocks[:, qh_at:qh_at + 4], axis=1, bitorder="little") << U8(4)
    np.copyto(out, q)


def _q5_0(blocks, out):
    _five_bit(blocks, 2, 6, out)
    out -= F32(16)                      # exact, as ggml's int8 q - 16
    out *= f16_at(blocks.view(np.uint16), 0)[:, None]


def _q5_1(blocks, out):
    u16 = blocks.view(np.uint16)
    _five_bit(blocks, 4, 8, out)
    out *= f16_at(u16, 0)[:, None]
    out += f16_at(u16, 1)[:, None]


def k_scales(blocks) -> tuple[np.ndarray, np.ndarray]:
    """q4_K/q5_K: the 8 six-bit scales and mins packed in bytes 4..16, as f32 [n, 8] each."""
    both = k_scale_bytes(blocks).view(U8).astype(F32)  # one cast: strided ones cost 5x
    return both[:, :8], both[:, 8:]


def k_scale_bytes(blocks) -> np.ndarray:
    """q4_K/q5_K's scales and mins as bytes: uint32 [n, 4] holding scales 0..7, mins 0..7.

    The 12 bytes are three little-endian uint32 words (d, m, md); every scale and min is a
    byte-wise mask and shift of them, so four bytes are unpacked per operation (~4x fewer
    passes than byte slices; one panel's scales cost as much as a pass over its values)."""
    packed_bytes = blocks[:, 4:16]
    if packed_bytes.strides[-1] != 1:
        packed_bytes = np.ascontiguousarray(packed_bytes)
    words = packed_bytes.view(np.uint32)
    d, m, md = words[:, 0], words[:, 1], words[:, 2]
    low6, top2, low4 = np.uint32(0x3F3F3F3F), np.uint32(0x30303030), np.uint32(0x0F0F0F0F)
    packed = np.empty((len(words), 4), np.uint32)     # bytes: scales 0..7, then mins 0..7
    np.bitwise_and(d, low6, out=packed[:, 0])
    np.bitwise_and(m, low6, out=packed[:, 2])
    for word, col, shift in ((d, 1, 0), (m, 3, 4)):      # j = 4..7: 4 low bits from md,
        high = np.right_shift(word, np.uint32(2))         # the top 2 from bits 6-7 of j-4
        high &= top2
        np.right_shift(md, np.uint32(shift), out=packed[:, col])
        packed[:, col] &= low4
        packed[:, col] |= high
    return packed


def _k_affine(blocks, out) -> None:
    """out (holding the quants) = (d·sc)·q − dmin·m per 32-value sub-block, as gguf rounds it."""
    n = len(blocks)
    u16 = blocks.view(np.uint16)
    sc, mn = k_scales(blocks)
    sc *= f16_at(u16, 0)[:, None]
    mn *= f16_at(u16, 1)[:, None]
    view = out.reshape(n, 8, 32)
    view *= sc[..., None]
    view -= mn[..., None]


def _q4_K(blocks, out):
    n = len(blocks)
    _split_nibbles(np.ascontiguousarray(blocks[:, 16:]).reshape(n, 4, 32),
                   out.reshape(n, 4, 2, 32))
    _k_affine(blocks, out)


def _q5_K(blocks, out):
    n = len(blocks)
    q = _high_bits(blocks[:, 16:48], 8) << U8(4)          # [n, 8, 32]
    qs = np.ascontiguousarray(blocks[:, 48:]).reshape(n, 4, 32)
    q = q.reshape(n, 4, 2, 32)
    q[:, :, 0] |= qs & U8(15)
    q[:, :, 1] |= qs >> U8(4)
    np.copyto(out, q.reshape(n, 256))
    _k_affine(blocks, out)


def _q6_K(blocks, out):
    n = len(blocks)
    low = np.ascontiguousarray(blocks[:, :128]).reshape(n, 2, 64)
    high = (blocks[:, 128:192].reshape(n, 2, 1, 32)
            >> np.array([0, 2, 4, 6], U8).reshape(1, 1, 4, 1)) & U8(3)
    q = (high << U8(4)).reshape(n, 2, 2, 64)
    q[:, :, 0] |= low & U8(15)
    q[:, :, 1] |= low >> U8(4)
    np.copyto(out, q.reshape(n, 256))
    out -= F32(32)                      # exact, as ggml's int8 q - 32
    scale = (blocks[:, 192:208].view(np.int8).astype(F32)
             * f16_at(blocks.view(np.uint16), 104)[:, None])
    out.reshape(n, 16, 16)[...] *= scale[..., None]


# kvalues_mxfp4: the E2M1 values doubled (the scale below is halved to match), as int8
_E2M1 = numpy_later(lambda np: np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                                        np.int8))


def _mxfp4(blocks, out):
    """ggml's dequantize_row_mxfp4: one E8M0 byte (GGML_E8M0_TO_FP32_HALF: 2^(e - 128), or
    the subnormal 0x00200000 << e below 2), then 32 E2M1 nibbles, low ones first."""
    n = len(blocks)
    q = np.empty((n, 2, 16), U8)
    _split_nibbles(np.ascontiguousarray(blocks[:, 1:]), q)
    np.copyto(out, _E2M1[q.reshape(n, 32)])
    e = blocks[:, 0].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    out *= bits.astype(np.uint32).view(F32)[:, None]


# name -> (decoder, values per block, bytes per block)
DECODERS = {"q8_0": (_q8_0, 32, 34), "q4_0": (_q4_0, 32, 18), "q4_1": (_q4_1, 32, 20),
            "q5_0": (_q5_0, 32, 22), "q5_1": (_q5_1, 32, 24), "q4_K": (_q4_K, QK_K, 144),
            "q5_K": (_q5_K, QK_K, 176), "q6_K": (_q6_K, QK_K, 210),
            "mxfp4": (_mxfp4, 32, 17)}


def decode_fast(raw: np.ndarray, name: str) -> np.ndarray | None:
    """Whole rows of type `name` (bytes in the last axis) as f32; None where there is no fast
    decoder for the type (the caller falls back to gguf.quants)."""
    entry = DECODERS.get(name)
    if entry is None:
        return None
    decode, block_size, type_size = entry
    raw = np.ascontiguousarray(raw, dtype=U8)
    if raw.shape[-1] % type_size:
        raise ValueError(f"{name}: a row of {raw.shape[-1]} bytes is not whole blocks of "
                         f"{type_size}")
    blocks = raw.reshape(-1, type_size)
    out = np.empty((len(blocks), block_size), F32)
    step = max(1, _CHUNK_VALUES // block_size)

    with np.errstate(all="ignore"):          # inf/nan scales decode to inf/nan, as in ggml
        for start in range(0, len(blocks), step):
            decode(blocks[start:start + step], out[start:start + step])
    return out.reshape(raw.shape[:-1] + (raw.shape[-1] // type_size * block_size,))
