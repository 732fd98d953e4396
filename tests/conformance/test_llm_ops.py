"""The kernels llama.cpp's graph needs, against real ggml's CPU backend (ggml 0.15.3).

Each case builds one ggml op on tensors filled from NumPy (quantized weights as their bytes),
computes it on one thread in a fresh process (`gb.isolated`: an abort cannot take pytest
down) and compares with ggmlrun's kernel on the same bytes. ggml 0.15.3's CPU kernels for these
ops are the ones 0.25.3 uses for the cases here (flash attention: fewer than 64 tokens, the
per-row path; see docs/format.md).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as Q

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op, make_node
from ggmlrun.core.ir.ops.quant import storage_view
from ggmlrun.core.ir.types import TYPES

from . import ggml_bridge as gb

F16, F32 = np.float16, np.float32


def _ggml_compute(op: str, sources: list[tuple[np.ndarray, str]], params: dict,
                  out_shape: tuple[int, ...]) -> np.ndarray:
    """In the child: tensors (NumPy order; raw bytes for block types), one op, f32 result."""
    import ggml

    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 << 20, mem_buffer=None,
                                               no_alloc=False))
    try:
        tensors = []
        for arr, name in sources:
            gtype = TYPES[name]
            shape = list(arr.shape)
            if gtype.numpy is None:              # raw bytes: bf16 and the block types
                shape[-1] = shape[-1] // gtype.type_size * gtype.block_size
            ne = shape[::-1] + [1] * (4 - len(shape))
            t = ggml.ggml_new_tensor_4d(ctx, gtype.id, *ne)
            data = np.ascontiguousarray(arr)
            ctypes.memmove(ggml.ggml_get_data(t), data.ctypes.data, data.nbytes)
            tensors.append(t)
        if op == "mul_mat":
            out = ggml.ggml_mul_mat(ctx, tensors[0], tensors[1])
        elif op == "flash_attn_ext":
            out = ggml.ggml_flash_attn_ext(ctx, *tensors[:4], params["scale"], 0.0, 0.0)
            ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_F32)
            if len(tensors) == 5:
                ggml.ggml_flash_attn_ext_add_sinks(out, tensors[4])
        elif op == "soft_max":
            out = ggml.ggml_soft_max_ext(ctx, tensors[0], tensors[1], params["scale"],
                                         params["max_bias"])
            if len(tensors) == 3:
                ggml.ggml_soft_max_add_sinks(out, tensors[2])
        elif op == "add_id":
            out = ggml.ggml_add_id(ctx, *tensors)
        elif op == "glu" and params["op"] == "swiglu_oai":
            out = ggml.ggml_swiglu_oai(ctx, tensors[0], tensors[1], params["alpha"],
                                       params["limit"])
        elif op == "rope":
            out = ggml.ggml_rope_ext(ctx, tensors[0], tensors[1], tensors[2], params["n_dims"],
                                     0, params["n_ctx_orig"], params["freq_base"],
                                     params["freq_scale"], params["ext_factor"],
                                     params["attn_factor"], params["beta_fast"],
                                     params["beta_slow"])
        elif op == "get_rows":
            out = ggml.ggml_get_rows(ctx, tensors[0], tensors[1])
        else:
            raise ValueError(op)
        graph = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(graph, out)
        ggml.ggml_graph_compute_with_ctx(ctx, graph, 1)
        n = math.prod(out_shape)
        ptr = ctypes.cast(ggml.ggml_get_data(out), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy().reshape(out_shape)
    finally:
        ggml.ggml_free(ctx)


def _ours(op: str, sources: list[tuple[np.ndarray, str]], params: dict) -> np.ndarray:
    leafs, arrays = [], []
    for i, (arr, name) in enumerate(sources):
        gtype = TYPES[name]
        if gtype.numpy is None:
            shape = arr.shape[:-1] + (arr.shape[-1] // gtype.type_size * gtype.block_size,)
            leaf = Tensor(name=f"s{i}", shape=shape, dtype=name, role="weight")
            buf = np.frombuffer(np.ascontiguousarray(arr).tobytes(), np.uint8).copy()
            arrays.append(storage_view(buf, 0, leaf.shape, leaf.strides, gtype))
        else:
            leaf = Tensor(name=f"s{i}", shape=arr.shape, dtype=name, role="input")
            arrays.append(arr)
        leafs.append(leaf)
    node = make_node("n", op, leafs, params)
    out = np.empty(node.shape, node.np_dtype)
    get_op(op).kernel(out, *arrays, **node.params)
    return out


def _weights(name: str, m: int, k: int, rng) -> np.ndarray:
    """Bytes of an [m, k] weight: gguf's encoder where it has one, else sane random blocks."""
    if name in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "mxfp4"):
        raw = gq.quantize(rng.standard_normal((m, k)).astype(F32), Q[name.upper()])
        return raw.view(np.uint8).reshape(m, -1)
    raw = rng.integers(0, 256, size=(m, TYPES[name].row_bytes(k)), dtype=np.uint8)
    for _ in range(100):                     # redraw rows whose f16 scales decode to inf/nan
        with np.errstate(all="ignore"):
            values = gq.dequantize(raw, Q[name.upper()])
        bad = ~np.isfinite(values).all(axis=1) | (np.abs(values).max(axis=1) > 1e3)
        if not bad.any():
            return raw
        raw[bad] = rng.integers(0, 256, size=(int(bad.sum()), raw.shape[1]), dtype=np.uint8)
    raise AssertionError("could not draw finite blocks")


def _compare(op, sources, params, atol_rel):
    ours = _ours(op, sources, params)
    theirs = gb.isolated(_ggml_compute, op, sources, params, ours.shape)
    scale = float(np.abs(theirs).max())
    assert np.abs(ours - theirs).max() <= atol_rel * scale, (
        f"{op}: {np.abs(ours - theirs).max() / scale:.2e} of the largest value")


# b rounded to the vec_dot type (and, for q4_1/q5_1, q8_1.s rounded block sums) makes these
# equal to ggml but for the order of f32 sums
@pytest.mark.parametrize("name,tol", [("q8_0", 2e-6), ("q4_0", 2e-6), ("q5_0", 2e-6),
                                      ("q4_1", 2e-6), ("q5_1", 2e-6), ("q2_K", 2e-6),
                                      ("q3_K", 2e-6), ("q4_K", 2e-6), ("q5_K", 2e-6),
                                      ("q6_K", 2e-6), ("bf16", 2e-6), ("mxfp4", 2e-6)])
def test_mul_mat_on_quantized_weights_equals_ggml(name, tol):
    rng = np.random.default_rng(5)
    raw = _weights(name, 16, 512, rng)
    b = rng.standard_normal((5, 512)).astype(F32)
    _compare("mul_mat", [(raw, name), (b, "f32")], {}, tol)


@pytest.mark.parametrize("name", ["q4_0", "q8_0", "q6_K"])
def test_get_rows_on_quantized_tables_equals_ggml(name):
    rng = np.random.default_rng(6)
    raw = _weights(name, 12, 256, rng)
    idx = np.array([11, 0, 5, 5], np.int32)
    _compare("get_rows", [(raw, name), (idx, "i32")], {}, 0.0)


def _per_row_attention(seed: int):
    """7 tokens (under GGML_FA_TILE_Q: the per-row path) of 8 heads over 2 KV heads of 64 and
    256 f16 cells, causally masked from cell 200 on."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 8, 7, 64)).astype(F32)
    k = rng.standard_normal((1, 2, 256, 64)).astype(F16)
    v = rng.standard_normal((1, 2, 256, 64)).astype(F16)
    mask = np.zeros((1, 1, 64, 256), F16)
    for t in range(7):
        mask[0, 0, t, 200 + t + 1:] = -np.inf
    return q, k, v, mask


def test_flash_attn_ext_per_row_path_equals_ggml():
    q, k, v, mask = _per_row_attention(7)
    _compare("flash_attn_ext", [(q, "f32"), (k, "f16"), (v, "f16"), (mask, "f16")],
             {"scale": 0.125}, 5e-4)


@pytest.mark.parametrize("kv", [("q8_0", "q8_0"), ("f16", "q8_0")])
def test_flash_attn_ext_on_a_q8_0_cache_equals_ggml(kv):
    """`--kv-type q8_0 --flash-attn on`: q rounded to q8_0 (K's vec_dot type) before the dots,
    a q8_0 V decoded to f32 and accumulated in f32 (ggml-cpu's per-row path)."""
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 8, 7, 64)).astype(F32)
    srcs = []
    for name in kv:
        x = rng.standard_normal((1, 2, 256, 64)).astype(F32)
        if name == "q8_0":
            raw = gq.quantize(x.reshape(-1, 64), Q.Q8_0).view(np.uint8)
            srcs.append((raw.reshape(1, 2, 256, -1), "q8_0"))
        else:
            srcs.append((x.astype(F16), "f16"))
    mask = np.zeros((1, 1, 64, 256), F16)
    for t in range(7):
        mask[0, 0, t, 200 + t + 1:] = -np.inf
    _compare("flash_attn_ext", [(q, "f32"), *srcs, (mask, "f16")], {"scale": 0.125}, 5e-4)


def test_soft_max_alibi_with_a_padded_mask_equals_ggml():
    rng = np.random.default_rng(8)
    a = rng.standard_normal((1, 6, 5, 32)).astype(F32)
    mask = (rng.standard_normal((1, 1, 8, 32)) * 2).astype(F16)
    _compare("soft_max", [(a, "f32"), (mask, "f16")], {"scale": 0.7, "max_bias": 8.0}, 1e-6)


def test_rope_ext_yarn_with_freq_factors_equals_ggml():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 4, 32)).astype(F32)
    pos = np.array([0, 1, 9, 100, 3000], np.int32)
    factors = (1 + rng.random(16) * 3).astype(F32)
    params = {"n_dims": 32, "n_ctx_orig": 4096, "freq_base": 500000.0, "freq_scale": 0.125,
              "ext_factor": 1.0, "attn_factor": 0.9, "beta_fast": 32.0, "beta_slow": 1.0}
    _compare("rope", [(x, "f32"), (pos, "i32"), (factors, "f32")], params, 2e-6)


# --- gpt-oss ----------------------------------------------------------------------------------

def test_soft_max_with_sinks_equals_ggml():
    rng = np.random.default_rng(21)
    a = rng.standard_normal((1, 4, 5, 32)).astype(F32)
    mask = np.zeros((1, 1, 8, 32), F32)
    mask[..., 25:] = -np.inf
    sinks = np.array([-1.0, 0.5, 3.0, 9.0], F32)
    _compare("soft_max", [(a, "f32"), (mask, "f32"), (sinks, "f32")],
             {"scale": 0.7, "max_bias": 0.0}, 1e-6)


def test_flash_attn_ext_with_sinks_equals_ggml():
    q, k, v, mask = _per_row_attention(22)
    sinks = np.linspace(-2, 6, 8).astype(F32)
    _compare("flash_attn_ext", [(q, "f32"), (k, "f16"), (v, "f16"), (mask, "f16"),
                                (sinks, "f32")], {"scale": 0.125}, 5e-4)


def test_add_id_and_swiglu_oai_equal_ggml():
    rng = np.random.default_rng(23)
    a = rng.standard_normal((5, 3, 32)).astype(F32)
    b = rng.standard_normal((8, 32)).astype(F32)
    ids = np.stack([rng.permutation(8)[:3] for _ in range(5)]).astype(np.int32)
    _compare("add_id", [(a, "f32"), (b, "f32"), (ids, "i32")], {}, 0.0)
    x = (rng.standard_normal((5, 3, 32)) * 6).astype(F32)
    g = (rng.standard_normal((5, 3, 32)) * 6).astype(F32)
    _compare("glu", [(x, "f32"), (g, "f32")],
             {"op": "swiglu_oai", "swapped": False, "alpha": 1.702, "limit": 7.0}, 1e-6)


# ggmlrun's ops that are one of ggml's unary ops (GGML_OP_UNARY) or that ggml names otherwise
_UNARY = {"neg", "abs", "relu", "silu", "sigmoid", "tanh", "gelu", "exp", "softplus"}
_GGML_NAME = {"cast": "CPY"}


def test_the_in_place_ops_are_ggml_s():
    """ggmlrun's in-place ops, less those the 0.15 rules leave out (clamp), are exactly those
    ggml 0.15.3's ggml_op_can_inplace accepts, op by op: the allocator's reuse rule depends on it
    (ADD_ID, missing once, cost gpt-oss's CUDA recordings up to 58,880 bytes)."""
    import ggml

    from ggmlrun.core.ir.ops import OPS
    from ggmlrun.core.util.ggml_version import ggml_version

    can_inplace = ggml.lib.ggml_op_can_inplace
    can_inplace.restype, can_inplace.argtypes = ctypes.c_bool, [ctypes.c_int]
    not_inplace = ggml_version("0.15").not_inplace
    for name, spec in OPS.items():
        ggml_name = "UNARY" if name in _UNARY else _GGML_NAME.get(name, name.upper())
        have = spec.inplace and name not in not_inplace
        assert have == bool(can_inplace(getattr(ggml, f"GGML_OP_{ggml_name}"))), name
