"""Values of the types NumPy cannot hold: bf16 and the block (quantized) types.

A tensor of such a type lives in memory as ggml lays it out, and kernels receive it as a
`TypedArray`: a NumPy array of its raw storage (uint16 for bf16; for block types uint8, the
last axis being the row's bytes) that remembers its ggml type. Kernels turn it into f32 with
`to_f32` only where they use it (the rows get_rows picks, the one matrix a mul_mat reads), so
a model's weights are never all held in f32 at once.

Decoding goes through types.decode_blocks: NumPy decoders of its own for the hot types
(core/ir/blockdecode.py, bit-identical to gguf.quants and several times faster) and
`gguf.quants` (the reference code llama.cpp publishes) for the rest; encoding is ggml-cpu's
(core/ir/blockencode.py for q8_0 and iq4_nl, gguf's encoders for the others). `round_like_vec_dot` reproduces what ggml does to mul_mat's `b` before the dot
products: it converts b to the weight's "vec_dot type" (f16, bf16, q8_0 or q8_K) and back.
"""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.lazynumpy import np, numpy_later
from ggmlrun.core.ir.types import TYPES, GgmlType, decode_blocks, encode_blocks

F32 = numpy_later(lambda np: np.float32)
QK_K = 256


@numpy_later
def TypedArray(np):
    class TypedArray(np.ndarray):
        """Raw storage of a bf16 or block-typed tensor; `ggml_type` names the type."""

        ggml_type: str = ""

        def __array_finalize__(self, obj):
            self.ggml_type = getattr(obj, "ggml_type", "")
    return TypedArray


def needs_storage_view(gtype: GgmlType) -> bool:
    return gtype.numpy is None


def storage_view(buffer: np.ndarray, offset: int, shape: tuple[int, ...],
                 strides: tuple[int, ...], gtype: GgmlType) -> TypedArray:
    """The raw view of a bf16/block tensor at `offset` in `buffer` (byte strides, NumPy order).

    A block type's innermost dim is counted in bytes: rows are contiguous in ggml (its
    innermost stride is one block), so a row is `row_bytes` consecutive bytes.
    """
    if gtype.is_block:
        shape = tuple(shape[:-1]) + (gtype.row_bytes(shape[-1]),)
        strides = tuple(strides[:-1]) + (1,)
        dtype = np.uint8
    else:
        dtype = np.uint16 if gtype.type_size == 2 else np.uint8
    arr = np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset, strides=strides)
    typed = arr.view(TypedArray)
    typed.ggml_type = gtype.name
    return typed


def type_of(arr: np.ndarray) -> str:
    """The ggml type name of a kernel argument (plain arrays: from their NumPy dtype)."""
    name = getattr(arr, "ggml_type", "")
    if name:
        return name
    return {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}.get(arr.dtype,
                                                                       str(arr.dtype))


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(F32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round to nearest even, NaNs kept quiet."""
    bits = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 64, rounded).astype(np.uint16)


def to_f32(arr: np.ndarray) -> np.ndarray:
    """Any kernel argument as f32 values of its logical shape."""
    name = getattr(arr, "ggml_type", "")
    if not name:
        return arr if arr.dtype == F32 else arr.astype(F32)
    raw = np.asarray(arr).view(np.ndarray)
    if name == "bf16":
        return bf16_to_f32(raw)
    if not TYPES[name].is_block:
        raise InputError(f"no f32 conversion for type {name}")
    try:
        return decode_blocks(np.ascontiguousarray(raw), name).astype(F32, copy=False)
    except NotImplementedError:
        raise InputError(f"type {name}: gguf.quants cannot decode it") from None


def from_f32(values: np.ndarray, name: str) -> np.ndarray:
    """f32 values encoded as type `name`'s storage (rows in the last dim)."""
    values = np.asarray(values, dtype=F32)
    if name == "f32":
        return values
    if name == "f16":
        return values.astype(np.float16)
    if name == "bf16":
        return f32_to_bf16(values)
    try:
        return encode_blocks(np.ascontiguousarray(values), name)
    except NotImplementedError:
        raise InputError(f"cannot write values as {name}: no encoder for it (gguf.quants "
                         f"has none)") from None


def can_encode(name: str) -> bool:
    """Whether `from_f32` can produce this type (set_rows into a cache of it)."""
    if name in ("f32", "f16", "bf16"):
        return True
    probe = np.zeros((1, TYPES[name].block_size), F32)
    try:
        encode_blocks(probe, name)
    except (NotImplementedError, ValueError, KeyError):
        return False
    return True


# --- what ggml does to mul_mat's b ----------------------------------------------------------

# ggml-cpu's type_traits_cpu[type].vec_dot_type for the weight types
_VEC_DOT = {"f16": "f16", "bf16": "bf16", "q4_0": "q8_0", "q4_1": "q8_1", "q5_0": "q8_0",
            "q5_1": "q8_1", "q8_0": "q8_0", "q2_K": "q8_K", "q3_K": "q8_K", "q4_K": "q8_K",
            "q5_K": "q8_K", "q6_K": "q8_K", "mxfp4": "q8_0", "iq4_nl": "q8_0"}


def vec_dot_type(weight_type: str) -> str:
    return _VEC_DOT.get(weight_type, "f32")


def q8_0_quants(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q8_0 on [.., 32] blocks: d = amax/127 (f32, before its f16 rounding) and
    the quants rint(x·id) as f32 with id = 127/amax, as ggml-cpu's x86 SIMD from_float computes
    it (not 1/d: the two differ in the last bit often enough to flip a rounding); it rounds
    half to even."""
    amax = np.abs(blocks).max(axis=-1)
    d = amax / F32(127)
    inv = np.zeros_like(d)
    np.divide(F32(127), amax, out=inv, where=amax != 0)
    q = blocks * inv[..., None]
    np.rint(q, out=q)
    return d, q


def _q8_0_round(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 then dequantize: per 32 values, q·f16(d)."""
    d, q = q8_0_quants(x.reshape(-1, 32))
    q *= d.astype(np.float16).astype(F32)[:, None]
    return q.reshape(x.shape)


def _q8_k_parts(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantize_row_q8_K_ref on [.., 256] blocks: iscale = -127/max (signed max), the quants
    q = nearest_int(iscale·x) capped at 127 (as f32), d = 1/iscale kept in f32; and which
    blocks are not all zero (an all-zero block is 0)."""
    idx = np.argmax(np.abs(blocks), axis=1)
    signed_max = np.take_along_axis(blocks, idx[:, None], axis=1)[:, 0]
    nonzero = signed_max != 0
    iscale = np.full_like(signed_max, F32(-127))
    np.divide(F32(-127), signed_max, out=iscale, where=nonzero)
    q = blocks * iscale[:, None]
    np.rint(q, out=q)                      # nearest_int rounds half to even
    np.minimum(q, F32(127), out=q)
    return F32(1) / iscale, q, nonzero


def q8_k_quants(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q8_K's d (f32) and integer quants (as f32) of [.., 256] blocks."""
    d, q, nonzero = _q8_k_parts(blocks)
    q[~nonzero] = 0
    return d, q


def _q8_k_round(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K_ref then dequantize: q·d per 256 values."""
    d, q, nonzero = _q8_k_parts(x.reshape(-1, QK_K))
    q *= d[:, None]
    q[~nonzero] = 0
    return q.reshape(x.shape)


_F16_CHUNK = 1 << 16               # values per step of f16_round: its temporaries stay in L2
# an f16-rounded value of 2^16 or more overflows to inf here
_F16_OVERFLOW_UP = numpy_later(lambda np: np.float32(2.0 ** 112))
_F16_SMALLEST_NORMAL = 0x38800000   # 2^-14 as f32 bits: below it f16 steps by 2^-24


_F16_PLAIN_BELOW = 0x477FF000     # 65520 as f32 bits: 0 <= x below it stays finite in f16


def _f16_round_plain(x: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    """out = the bits of f32(f16(x)) for 0 <= x < 65520 (a softmax: kqv's b), in 4 passes.

    Adding c = 2^(e+13) to x in [2^e, 2^(e+1)) leaves a sum whose last bit is worth 2^(e-10),
    f16's spacing there, so f32's own round-to-nearest-even rounds x to f16 precision, and
    subtracting c again is exact. Below 2^-14, c = 2^-1 rounds to multiples of 2^-24, the
    f16 subnormals'. (Checked against NumPy's round trip for every such f32 pattern.)"""
    c = scratch
    np.bitwise_and(x.view(np.uint32), np.uint32(0x7F800000), out=c)     # 2^e
    np.maximum(c, np.uint32(_F16_SMALLEST_NORMAL), out=c)
    c += np.uint32(13 << 23)                                           # 2^(e+13)
    rounded = out.view(F32)
    np.add(x, c.view(F32), out=rounded)
    rounded -= c.view(F32)


def _f16_round_chunk(x: np.ndarray, out: np.ndarray, magnitude: np.ndarray,
                     small: np.ndarray) -> bool:
    """out (uint32, x's size) = the bits of f32(f16(x)) for every x that is not nan; False
    where the chunk had to take the general path (only there can a nan be)."""
    bits = x.view(np.uint32)
    if bits.max() < _F16_PLAIN_BELOW:          # no sign, inf, nan or f16 overflow here
        _f16_round_plain(x, out, magnitude)
        return True
    np.right_shift(bits, np.uint32(13), out=out)       # keep 10 mantissa bits, ties to even
    out &= np.uint32(1)
    out += np.uint32(0xFFF)
    out += bits
    out &= np.uint32(0xFFFFE000)
    rounded = out.view(F32)
    rounded *= _F16_OVERFLOW_UP                        # 65536 and up become inf, the rest
    rounded *= F32(1) / _F16_OVERFLOW_UP               # are exact powers-of-two scalings
    np.bitwise_and(bits, np.uint32(0x7FFFFFFF), out=magnitude)
    np.less(magnitude, np.uint32(_F16_SMALLEST_NORMAL), out=small)
    subnormal = magnitude.view(F32)                    # f16 subnormals: multiples of 2^-24
    np.multiply(x, F32(2.0 ** 24), out=subnormal)
    np.rint(subnormal, out=subnormal)
    subnormal *= F32(2.0 ** -24)
    np.copyto(rounded, subnormal, where=small)
    return False


def f16_round(x: np.ndarray) -> np.ndarray:
    """x.astype(f16).astype(f32), bit for bit (every f32 was checked), ~3x faster.

    NumPy converts f32 <-> f16 one value at a time (10-100 ns a value here: attention's
    softmax, 8M values at 512 tokens, is rounded to f16 before kqv). This rounds the f32 bits
    in integer and f32 passes over L2-sized chunks: round the mantissa to 10 bits (ties to
    even), let values of 65536 and more overflow to inf, and below 2^-14 (f16 subnormals)
    round to a multiple of 2^-24 with rint. nan keeps NumPy's own conversion (its payload
    rule)."""
    x = np.ascontiguousarray(x, dtype=F32)
    flat = x.reshape(-1)
    bits = np.empty(flat.shape, np.uint32)
    magnitude = np.empty(min(_F16_CHUNK, flat.size), np.uint32)
    small = np.empty(magnitude.shape, bool)
    plain = True
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, flat.size, _F16_CHUNK):
            stop = min(start + _F16_CHUNK, flat.size)
            plain &= _f16_round_chunk(flat[start:stop], bits[start:stop],
                                      magnitude[:stop - start], small[:stop - start])
    rounded = bits.view(F32).reshape(x.shape)
    if plain:                 # every chunk's max said: no nan (two passes fewer; a softmax)
        return rounded
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = x[nan].astype(np.float16).astype(F32)
    return rounded


def round_like_vec_dot(b: np.ndarray, weight_type: str) -> np.ndarray:
    """b (f32, rows in the last dim) after ggml's conversion to the weight's vec_dot type."""
    target = vec_dot_type(weight_type)
    if target == "f32":
        return b
    if target == "f16":
        return f16_round(b)
    if target == "bf16":
        return bf16_to_f32(f32_to_bf16(b)).reshape(b.shape)
    b = np.ascontiguousarray(b, dtype=F32)
    if target == "q8_K":
        return _q8_k_round(b)
    # q8_1 rounds the values as q8_0 does; its extra sum term only feeds the min offset
    return _q8_0_round(b)


# q4_1 and q5_1 blocks hold a minimum m beside the scale d (bytes 2..4, f16). Their dot with a
# q8_1 block is d_a·d_b·Σq_a·q_b + m_a·s_b, where s_b = f16(d·Σq_b) is stored rounded: decoding
# both sides and multiplying gives m_a·f16(d)·Σq_b instead. The difference, summed per block,
# is added back so the result is ggml's.
MIN_TYPES = ("q4_1", "q5_1")


def block_mins(raw: np.ndarray, name: str) -> np.ndarray:
    """m of every block of a q4_1/q5_1 weight: [.., M, K/32] f32."""
    size = TYPES[name].type_size
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[:-1] + (-1, size))
    return blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(F32)


def q8_1_sum_error(b: np.ndarray) -> np.ndarray:
    """Per 32-value block of b: f16(d·Σq) − f16(d)·Σq, the rounding of q8_1's stored sum."""
    blocks = np.ascontiguousarray(b, dtype=F32).reshape(b.shape[:-1] + (-1, 32))
    d, q = q8_0_quants(blocks)
    total = np.sum(q, axis=-1, dtype=F32)      # integers: exact in any order
    stored = (d * total).astype(np.float16).astype(F32)
    return stored - d.astype(np.float16).astype(F32) * total
