"""The ops llama.cpp's graph needs, against written-out NumPy formulas.

Quantized data is made with gguf.quants (llama.cpp's reference codec) and checked through
gguf's own decoder; the rounding of mul_mat's b is written out here per ggml's C code
(quantize_row_q8_0 / quantize_row_q8_K_ref), not taken from the kernel's module.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as Q

from ggmlrun.core.util.errors import InputError, RunError
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op, make_node
from ggmlrun.core.ir.ops.quant import storage_view
from ggmlrun.core.ir.types import TYPES
from opkit import leaf_for, node_for, randn, run, scattered

F16, F32, F64, I32, I64 = np.float16, np.float32, np.float64, np.int32, np.int64
RNG = np.random.default_rng(99)


def typed(raw: np.ndarray, name: str, shape: tuple[int, ...]):
    """A leaf and its kernel array for raw storage of type `name` (logical `shape`)."""
    gtype = TYPES[name]
    leaf = Tensor(name=f"w_{name}", shape=shape, dtype=name, role="weight")
    buf = np.frombuffer(np.ascontiguousarray(raw).tobytes(), np.uint8).copy()
    return leaf, storage_view(buf, 0, leaf.shape, leaf.strides, gtype)


def run_typed(op, leafs, arrays, params=None):
    node = make_node("n", op, leafs, params)
    out = np.empty(node.shape, node.np_dtype)
    get_op(op).kernel(out, *arrays, **node.params)
    return out


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, by integer arithmetic on the f32 bits."""
    u = x.astype(F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(F32)


def q8_0_ref(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 then dequantize, block by block in plain loops."""
    out = np.empty_like(x, dtype=F32)
    flat, res = x.reshape(-1, 32), out.reshape(-1, 32)
    for i, block in enumerate(flat):
        d = F32(np.abs(block).max()) / F32(127)
        inv = F32(1) / d if d else F32(0)
        res[i] = np.rint(block * inv) * F32(F16(d))
    return out


def q8_k_ref(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x, dtype=F32)
    flat, res = x.reshape(-1, 256), out.reshape(-1, 256)
    for i, block in enumerate(flat):
        mx = block[np.argmax(np.abs(block))]
        if mx == 0:
            res[i] = 0
            continue
        iscale = F32(-127) / F32(mx)
        q = np.minimum(np.rint(block * iscale), 127)
        res[i] = q * (F32(1) / iscale)
    return out


# --- get_rows ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_get_rows_on_a_quantized_table_decodes_the_picked_rows(name):
    table = randn(10, 64)
    raw = gq.quantize(table, Q[name.upper()])
    leaf, arr = typed(raw, name, (10, 64))
    idx = np.array([3, 0, 9, 3], I32)
    got = run_typed("get_rows", [leaf, leaf_for("i", idx)], [arr, idx])
    want = gq.dequantize(raw, Q[name.upper()])[idx]
    np.testing.assert_array_equal(got, want)
    assert np.abs(got - table[idx]).max() < 0.15 * np.abs(table).max()   # the table, quantized


def test_get_rows_on_k_quants_and_bf16():
    raw = RNG.integers(0, 256, size=(4, 144), dtype=np.uint8)     # q4_K, 256 per row
    raw[:, 0:2] = np.frombuffer(F16(0.01).tobytes(), np.uint8)   # d
    raw[:, 2:4] = np.frombuffer(F16(0.002).tobytes(), np.uint8)  # dmin
    leaf, arr = typed(raw, "q4_K", (4, 256))
    idx = np.array([2, 1], I32)
    got = run_typed("get_rows", [leaf, leaf_for("i", idx)], [arr, idx])
    np.testing.assert_array_equal(got, gq.dequantize(raw, Q.Q4_K)[idx])

    values = randn(5, 8)
    leaf, arr = typed(bf16_bits(values), "bf16", (5, 8))
    idx = np.array([4, 4, 0], I32)
    got = run_typed("get_rows", [leaf, leaf_for("i", idx)], [arr, idx])
    np.testing.assert_array_equal(got, from_bf16(bf16_bits(values))[idx])


# --- mul_mat -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q5_0"])
def test_mul_mat_quantized_rounds_b_to_q8(name):
    a, b = randn(6, 64), randn(2, 3, 64)
    raw = gq.quantize(a, Q[name.upper()])
    leaf, arr = typed(raw, name, (6, 64))
    got = run_typed("mul_mat", [leaf, leaf_for("b", b)], [arr, scattered(b)])
    a_deq = gq.dequantize(raw, Q[name.upper()]).astype(F64)
    want = q8_0_ref(b).astype(F64) @ a_deq.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == (2, 3, 6)


@pytest.mark.parametrize("name", ["q4_1", "q5_1"])
def test_mul_mat_with_block_minimums_uses_q8_1s_rounded_sums(name):
    """ggml's q4_1·q8_1 dot, block by block: d_a·d_b·Σq_a·q_b + m_a·s_b with s_b = f16(d·Σq_b)."""
    a, b = randn(3, 64), randn(2, 64)
    raw = gq.quantize(a, Q[name.upper()])
    leaf, arr = typed(raw, name, (3, 64))
    got = run_typed("mul_mat", [leaf, leaf_for("b", b)], [arr, b])
    a_deq = gq.dequantize(raw, Q[name.upper()]).astype(F64)
    size = TYPES[name].type_size
    want = np.zeros((2, 3))
    for n in range(2):
        for m in range(3):
            for blk in range(2):
                x = b[n, blk * 32:(blk + 1) * 32]
                d = F32(np.abs(x).max()) / F32(127)
                q = np.rint(x * (F32(1) / d))
                m_a = float(np.frombuffer(raw[m, blk * size + 2:blk * size + 4].tobytes(), F16)[0])
                s_b = float(F16(d * F32(q.sum())))
                # a_deq = d_a·q_a + m_a, so a_deq·(d_b·q) - m_a·d_b·Σq = d_a·d_b·Σq_a·q
                d_b = float(F16(d))
                dot = float(a_deq[m, blk * 32:(blk + 1) * 32] @ (q * d_b)) - m_a * d_b * q.sum()
                want[n, m] += dot + m_a * s_b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_mul_mat_k_quant_rounds_b_to_q8_k():
    raw = RNG.integers(0, 256, size=(3, 210), dtype=np.uint8)   # q6_K: 210 bytes / 256
    raw[:, 208:210] = np.frombuffer(F16(0.003).tobytes(), np.uint8)
    leaf, arr = typed(raw, "q6_K", (3, 256))
    b = randn(4, 256)
    got = run_typed("mul_mat", [leaf, leaf_for("b", b)], [arr, b])
    want = q8_k_ref(b).astype(F64) @ gq.dequantize(raw, Q.Q6_K).astype(F64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_mul_mat_bf16_rounds_b_to_bf16():
    a, b = randn(5, 16), randn(3, 16)
    leaf, arr = typed(bf16_bits(a), "bf16", (5, 16))
    got = run_typed("mul_mat", [leaf, leaf_for("b", b)], [arr, b])
    want = from_bf16(bf16_bits(b)).astype(F64) @ from_bf16(bf16_bits(a)).astype(F64).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mul_mat_rejects_integer_weights():
    with pytest.raises(InputError, match="quantized"):
        node_for("mul_mat", [np.ones((2, 4), I32), randn(3, 4)])


# --- set_rows ------------------------------------------------------------------------------

def test_set_rows_writes_converted_rows_and_is_a_view_of_a():
    cache = np.zeros((2, 6, 4), F16)
    rows = randn(2, 3, 4)
    idx = np.array([5, 0, 2], I64)
    node = node_for("set_rows", [cache, rows, idx])
    assert node.view_src is not None and node.view_src.name == "s0"
    assert node.shape == cache.shape and node.dtype == "f16"
    get_op("set_rows").kernel(cache, cache, rows, idx)
    want = np.zeros((2, 6, 4), F16)
    for batch in range(2):
        for r, target in enumerate(idx):
            want[batch, target] = rows[batch, r].astype(F16)
    np.testing.assert_array_equal(cache, want)


def test_set_rows_element_scatter_like_the_transposed_v_cache():
    cache = np.zeros((12, 1), F32)      # ggml: v cache viewed as [1, n] rows of one element
    vals = randn(4, 1)
    idx = np.array([11, 3, 7, 0], I32)
    get_op("set_rows").kernel(cache, cache, vals, idx)
    assert cache[11, 0] == vals[0, 0] and cache[0, 0] == vals[3, 0]
    assert np.count_nonzero(cache) == 4


def test_set_rows_quantizes_into_a_q8_0_cache():
    leaf, arr = typed(np.zeros((4, 34), np.uint8), "q8_0", (4, 32))
    rows = randn(2, 32)
    idx = np.array([3, 1], I64)
    node = make_node("n", "set_rows", [leaf, leaf_for("r", rows), leaf_for("i", idx)])
    get_op("set_rows").kernel(arr, arr, rows, idx)
    decoded = gq.dequantize(np.asarray(arr).view(np.ndarray), Q.Q8_0)
    np.testing.assert_array_equal(decoded[[3, 1]], gq.dequantize(gq.quantize(rows, Q.Q8_0), Q.Q8_0))
    assert not decoded[[0, 2]].any() and node.dtype == "q8_0"


def test_set_rows_checks():
    with pytest.raises(InputError, match="c \\(row indices\\)"):
        node_for("set_rows", [np.zeros((4, 8), F16), randn(2, 8), np.zeros(3, I64)])
    with pytest.raises(InputError, match="i32 or i64"):
        node_for("set_rows", [np.zeros((4, 8), F16), randn(2, 8), np.zeros(2, F32)])
    with pytest.raises(RunError, match="out of range"):
        run("set_rows", [np.zeros((4, 8), F16), randn(1, 8), np.array([4], I64)])


# --- soft_max with max_bias and a padded mask ----------------------------------------------

def alibi_ref(n_head, max_bias):
    n_log2 = 2 ** math.floor(math.log2(n_head))
    m0, m1 = 2 ** (-max_bias / n_log2), 2 ** (-(max_bias / 2) / n_log2)
    return [m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_head)]


@pytest.mark.parametrize("max_bias", [0.0, 8.0])
def test_soft_max_alibi_and_padded_f16_mask(max_bias):
    x = randn(6, 3, 5)                             # 6 heads, 3 rows, 5 keys
    mask = (randn(1, 8, 5) * 2).astype(F16)        # 8 rows >= 3: the extra ones unused
    mask[0, 1, 4] = -np.inf
    got = run("soft_max", [x, mask], {"scale": 0.5, "max_bias": max_bias})
    slopes = alibi_ref(6, max_bias) if max_bias else [1.0] * 6
    z = x.astype(F64) * 0.5 + np.array(slopes)[:, None, None] * mask[:, :3].astype(F64)
    e = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert got[:, 1, 4].max() == 0


def test_soft_max_mask_with_too_few_rows_is_refused():
    with pytest.raises(InputError, match="at least 3 rows"):
        node_for("soft_max", [randn(2, 3, 5), randn(2, 5)])
    with pytest.raises(InputError, match="needs a mask"):
        node_for("soft_max", [randn(2, 3, 5)], {"max_bias": 1.0})


# --- flash_attn_ext ------------------------------------------------------------------------

def attention_ref(q, k, v, mask, scale, softcap=0.0, max_bias=0.0, q_f16=False):
    """Attention in float64 (q first rounded to f16 where ggml's per-row path does)."""
    s_n, h_n, t_len, _ = q.shape
    hkv = k.shape[1]
    out = np.zeros((s_n, t_len, h_n, v.shape[-1]))
    slopes = alibi_ref(h_n, max_bias) if max_bias else [1.0] * h_n
    for s in range(s_n):
        for h in range(h_n):
            g = h // (h_n // hkv)
            qh = q[s, h].astype(F16) if q_f16 else q[s, h]
            z = qh.astype(F64) @ k[s, g].astype(F64).T * scale
            if softcap:
                z = softcap * np.tanh(z / softcap)
            if mask is not None:
                z = z + slopes[h] * mask[s % mask.shape[0], h % mask.shape[1], :t_len].astype(F64)
            w = np.exp(z - z.max(-1, keepdims=True))
            out[s, :, h] = (w / w.sum(-1, keepdims=True)) @ v[s, g].astype(F64)
    return out


def online_f16_ref(q, k, v, mask, scale):
    """ggml-cpu's ggml_compute_forward_flash_attn_ext_f16_one_chunk for f16 k and v, row by
    row and key by key, transcribed from the C code (VKQ accumulated in f16)."""
    s_n, h_n, t_len, _ = q.shape
    out = np.zeros((s_n, t_len, h_n, v.shape[-1]), F32)
    for s in range(s_n):
        for h in range(h_n):
            g = h // (h_n // k.shape[1])
            for t in range(t_len):
                qq = q[s, h, t].astype(F16).astype(F32)
                m_, s_sum = -np.inf, F32(0)
                acc = np.zeros(v.shape[-1], F16)
                for ic in range(k.shape[2]):
                    mv = F32(mask[0, 0, t, ic])
                    if mv == -np.inf:
                        continue
                    sc = F32(np.dot(qq, k[s, g, ic].astype(F32))) * F32(scale) + mv
                    ms, vs = F32(1), F32(1)
                    if sc > m_:
                        ms, m_ = F32(np.exp(F32(m_ - sc))), sc
                        acc = (acc.astype(F32) * ms).astype(F16)
                    else:
                        vs = F32(np.exp(F32(sc - m_)))
                    acc = (acc.astype(F32) + v[s, g, ic].astype(F32) * vs).astype(F16)
                    s_sum = s_sum * ms + vs
                out[s, t, h] = acc.astype(F32) / s_sum
    return out


def causal_mask(t_len, kv, filled, rows):
    mask = np.zeros((1, 1, rows, kv), F16)     # rows padded past t_len, as llama.cpp pads them
    for t in range(t_len):
        mask[0, 0, t, filled + t + 1:] = -np.inf
    return mask


@pytest.mark.parametrize("softcap,max_bias", [(0.0, 0.0), (20.0, 0.0), (0.0, 4.0)])
def test_flash_attn_ext_tiled_path_is_f32_attention(softcap, max_bias):
    # >= 64 tokens over an f16 cache: ggml-cpu's tiled path, all f32
    s_n, h_n, hkv, t_len, kv, d = 1, 4, 2, 64, 80, 16
    q = randn(s_n, h_n, t_len, d)
    k = randn(s_n, hkv, kv, d).astype(F16)
    v = randn(s_n, hkv, kv, 12).astype(F16)
    mask = causal_mask(t_len, kv, 10, 96)
    params = {"scale": 1 / math.sqrt(d), "logit_softcap": softcap, "max_bias": max_bias}
    node = node_for("flash_attn_ext", [q, k, v, mask], params)
    assert node.shape == (s_n, t_len, h_n, 12) and node.dtype == "f32"
    got = run("flash_attn_ext", [q, scattered(k), v, mask], params)
    want = attention_ref(q, k, v, mask, params["scale"], softcap, max_bias)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_flash_attn_ext_per_row_path_accumulates_v_in_f16():
    s_n, h_n, hkv, t_len, kv, d = 1, 4, 2, 3, 8, 16
    q = randn(s_n, h_n, t_len, d)
    k = randn(s_n, hkv, kv, d).astype(F16)
    v = randn(s_n, hkv, kv, 12).astype(F16)
    mask = causal_mask(t_len, kv, 4, 32)
    got = run("flash_attn_ext", [q, k, v, mask], {"scale": 0.25})
    ref = online_f16_ref(q, k, v, mask, 0.25)
    # equal but for a rare flip of one f16 rounding (the scores' f32 sums run in another order)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)
    assert np.mean(np.abs(got - ref) <= 2e-6) > 0.95
    exact = attention_ref(q, k, v, mask, 0.25, q_f16=True)
    assert np.abs(got - exact).max() < 4e-3      # f16 accumulation: about 1e-3


def test_flash_attn_ext_checks():
    q, k = randn(1, 3, 2, 8), randn(1, 2, 4, 8).astype(F16)
    with pytest.raises(InputError, match="multiple"):
        node_for("flash_attn_ext", [q, k, k], {"scale": 1.0})
    with pytest.raises(InputError, match="missing required param 'scale'"):
        node_for("flash_attn_ext", [randn(1, 2, 2, 8), k, k])
    with pytest.raises(InputError, match="mask"):
        node_for("flash_attn_ext", [randn(1, 2, 2, 8), k, k, np.zeros((1, 1, 2, 4), F32)],
                 {"scale": 1.0})


# --- glu -----------------------------------------------------------------------------------

def exact_gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def table_gelu(x):
    """ggml-cpu's f32 geglu: GELU looked up in its f16 table (ggml_table_gelu_f16) at x rounded
    to f16, 0 at x <= -10, x at x >= 10."""
    table = exact_gelu(np.asarray(x, np.float16).astype(np.float64)).astype(np.float16)
    return np.where(x <= -10, 0.0, np.where(x >= 10, x, table.astype(np.float64)))


GATES = {"swiglu": lambda x: x / (1 + np.exp(-x)),
         "geglu": table_gelu,
         "reglu": lambda x: np.maximum(x, 0)}


def test_geglu_follows_ggml_cpus_f16_table():
    x = np.concatenate([np.linspace(-12, 12, 4001), [-10.0, 10.0, 0.0]]).astype(F32)
    g = np.ones_like(x)
    got = run("glu", [x.reshape(1, -1), g.reshape(1, -1)], {"op": "geglu", "swapped": False})[0]
    np.testing.assert_allclose(got, table_gelu(x.astype(F64)), rtol=1e-3, atol=1e-6)
    assert np.abs(got - exact_gelu(x.astype(F64))).max() < 1e-2      # the table's rounding
    assert got[x <= -10].max() == 0 and np.array_equal(got[x >= 10], x[x >= 10])


@pytest.mark.parametrize("op", sorted(GATES))
@pytest.mark.parametrize("swapped", [False, True])
def test_glu_split_and_fused_forms(op, swapped):
    # its own values: geglu's f16 table is a rounding away from the f64 formula on a few
    # inputs, so the values must not depend on what earlier tests drew from the shared RNG
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((3, 8)).astype(F32) for _ in range(2))
    if swapped:             # ggml_glu_split has no swapped: refused rather than ignored
        with pytest.raises(InputError, match="swapped"):
            node_for("glu", [a, b], {"op": op, "swapped": True})
    else:
        got = run("glu", [scattered(a), b], {"op": op})
        np.testing.assert_allclose(got, GATES[op](a.astype(F64)) * b, rtol=1e-5, atol=1e-6)
    fused = run("glu", [a], {"op": op, "swapped": swapped})
    x, g = (a[:, 4:], a[:, :4]) if swapped else (a[:, :4], a[:, 4:])
    np.testing.assert_allclose(fused, GATES[op](x.astype(F64)) * g, rtol=1e-5, atol=1e-6)
    assert not get_op("glu").inplace


def test_glu_checks():
    with pytest.raises(InputError, match="swiglu"):
        node_for("glu", [randn(2, 4)], {"op": "silu"})
    with pytest.raises(InputError, match="odd"):
        node_for("glu", [randn(2, 5)], {"op": "swiglu"})


# --- cont with a shape ---------------------------------------------------------------------

def test_cont_to_a_new_shape_copies_in_logical_order():
    x = randn(2, 3, 4)
    view = np.transpose(x, (1, 0, 2))          # a permuted view, as before ggml_cont_2d
    got = run("cont", [view], {"shape": [3, 8]})
    np.testing.assert_array_equal(got, np.ascontiguousarray(view).reshape(3, 8))
    with pytest.raises(InputError, match="elements"):
        node_for("cont", [x], {"shape": [5, 5]})


# --- rope_ext: freq_factors and YaRN -------------------------------------------------------

def rope_ext_ref(x, pos, n_dims, base, fscale, factors, ext, attn, n_ctx_orig, bfast, bslow):
    """ggml-cpu's rope_yarn in float64, written from the C source."""
    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    lo = max(0.0, math.floor(corr_dim(bfast)))
    hi = min(n_dims - 1.0, math.ceil(corr_dim(bslow)))
    out = x.astype(F64).copy()
    for t, p in enumerate(pos):
        for i in range(n_dims // 2):
            extrap = p * base ** (-2 * i / n_dims) / (factors[i] if factors is not None else 1)
            theta, mscale = fscale * extrap, attn
            if ext:
                y = (i - lo) / max(0.001, hi - lo)
                mix = (1 - min(1, max(0, y))) * ext
                theta = theta * (1 - mix) + extrap * mix
                mscale *= 1 + 0.1 * math.log(1 / fscale)
            c, s = math.cos(theta) * mscale, math.sin(theta) * mscale
            u, v = x[t, :, 2 * i].astype(F64), x[t, :, 2 * i + 1].astype(F64)
            out[t, :, 2 * i], out[t, :, 2 * i + 1] = u * c - v * s, u * s + v * c
    return out


@pytest.mark.parametrize("ext", [0.0, 1.0])
def test_rope_ext_yarn_and_freq_factors(ext):
    x, pos = randn(4, 2, 16), np.array([0, 3, 17, 40], I32)
    factors = (1 + RNG.random(8) * 3).astype(F32)
    params = {"n_dims": 16, "freq_base": 10000.0, "freq_scale": 0.25, "ext_factor": ext,
              "attn_factor": 0.9, "n_ctx_orig": 4096, "beta_fast": 32.0, "beta_slow": 1.0}
    got = run("rope", [x, pos, factors], params)
    want = rope_ext_ref(x, pos, 16, 10000.0, 0.25, factors, ext, 0.9, 4096, 32.0, 1.0)
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-5)


def test_rope_ext_defaults_equal_plain_rope_bit_for_bit():
    x, pos = randn(3, 2, 8), np.array([1, 500, 9000], I32)
    plain = run("rope", [x, pos], {"freq_base": 500000.0})
    ones = run("rope", [x, pos, np.ones(4, F32)], {"freq_base": 500000.0, "n_ctx_orig": 8192})
    np.testing.assert_array_equal(plain, ones)


def test_rope_ext_checks():
    with pytest.raises(InputError, match="freq_factors"):
        node_for("rope", [randn(3, 2, 8), np.arange(3, dtype=I32), np.ones(3, F32)])
    with pytest.raises(InputError, match="n_ctx_orig"):
        node_for("rope", [randn(3, 2, 8), np.arange(3, dtype=I32)], {"ext_factor": 1.0})


def test_views_of_a_quantized_cache_count_blocks():
    cache = Tensor("kc", (2, 8, 64), dtype="q8_0", role="weight")       # 2 blocks per row
    row = make_node("r", "view", [cache], {"shape": [8, 64], "offset": 8 * 68})
    assert row.strides == (68, 34) and row.nbytes == 8 * 68
    heads = make_node("h", "reshape", [cache], {"shape": [16, 64]})
    assert heads.strides == (68, 34)
    with pytest.raises(InputError, match="blocks of 32"):
        make_node("bad", "view", [cache], {"shape": [8, 48]})
    with pytest.raises(InputError, match="past the end"):
        make_node("far", "view", [cache], {"shape": [8, 64], "offset": 9 * 68})


def test_cast_to_f16_rounds_like_numpy_half_and_owns_its_memory():
    x = randn(2, 3, 8) * 100
    node = node_for("cast", [scattered(x)], {"dtype": "f16"})
    assert node.view_src is None and node.dtype == "f16" and node.is_contiguous
    got = run("cast", [scattered(x)], {"dtype": "f16"})
    np.testing.assert_array_equal(got, x.astype(F16))
    with pytest.raises(InputError, match="dtype"):
        node_for("cast", [x], {"dtype": "f8"})


# --- pad -----------------------------------------------------------------------------------

def test_pad_appends_zeros_per_dim():
    a = randn(3, 5)
    got = run("pad", [a], {"pad": [1, 3]})
    want = np.zeros((4, 8), np.float32)
    want[:3, :5] = a
    np.testing.assert_array_equal(got, want)
    with pytest.raises(InputError, match="one integer >= 0 per dim"):
        node_for("pad", [a], {"pad": [1]})
    with pytest.raises(InputError, match="one integer >= 0 per dim"):
        node_for("pad", [a], {"pad": [0, -1]})
