"""Elementwise and reduction ops against independent NumPy formulas; registry errors; in-place.

The references are written out here in float64 (not the kernels called twice), and sources
come in odd layouts (strided views on a byte buffer) as arena views do.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.ir.ops import OPS, get_op
from opkit import leaf_for, node_for, randn, run, scattered

F16, F32, I32 = np.float16, np.float32, np.int32

SPEC_OPS = ("add sub mul div neg abs sqr sqrt log exp relu silu sigmoid tanh gelu scale clamp "
            "sum sum_rows mean argmax norm rms_norm soft_max diag_mask_inf mul_mat get_rows "
            "repeat concat cont rope view reshape permute transpose cpy set_rows flash_attn_ext glu cast "
            "pad softplus ssm_conv ssm_scan gated_delta_net mul_mat_id argsort add_id").split()
SPEC_INPLACE = ("add sub mul div sqr sqrt log scale neg abs relu silu sigmoid tanh gelu exp "
                "diag_mask_inf rope rms_norm soft_max clamp softplus add_id").split()


def test_registry_holds_exactly_the_spec_ops():
    assert set(OPS) == set(SPEC_OPS)
    assert {n for n, s in OPS.items() if s.inplace} == set(SPEC_INPLACE)
    assert {n for n, s in OPS.items() if s.view_op} == {"view", "reshape", "permute",
                                                         "transpose"}
    for spec in OPS.values():
        assert spec.summary
        assert (spec.kernel is None) == spec.view_op


# --- binary --------------------------------------------------------------------------------

REF2 = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def tile_ref(b, shape):
    b = np.asarray(b, np.float64).reshape((1,) * (len(shape) - b.ndim) + b.shape)
    return np.tile(b, [n // m for n, m in zip(shape, b.shape)])


@pytest.mark.parametrize("op", list(REF2))
@pytest.mark.parametrize("ashape,bshape", [((4, 6), (2, 3)), ((2, 5, 3), (3,)),
                                           ((4, 2, 3), (2, 2, 3)), ((3, 4), (3, 4)),
                                           ((2, 3, 4, 5), (1, 3, 1, 5))])
def test_binary_tiles(op, ashape, bshape):
    a, b = randn(*ashape), randn(*bshape) + 3.0
    got = run(op, [scattered(a), scattered(b)])
    want = REF2[op](a.astype(np.float64), tile_ref(b, ashape))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_binary_f16_rounds_once_and_mixed_floats():
    a, b = randn(3, 4, dtype=F16), randn(4, dtype=F16)
    got = run("mul", [a, b])
    assert got.dtype == F16
    np.testing.assert_array_equal(got, (a.astype(np.float64) * b).astype(F16))
    b32 = randn(3, 4)
    got = run("add", [a, scattered(b32)])
    assert got.dtype == F16
    np.testing.assert_array_equal(got, (a.astype(F32) + b32).astype(F16))
    with pytest.raises(InputError, match="f16 a with f32 b"):     # ggml-cpu has no f32 a, f16 b
        node_for("sub", [b32, a])


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_binary_i32_is_refused_as_ggml_cpu_has_none(op):
    with pytest.raises(InputError, match="f32 or f16"):
        node_for(op, [np.arange(24, dtype=I32).reshape(4, 6), np.ones((2, 3), I32)])


def test_binary_errors():
    with pytest.raises(InputError, match="does not tile"):
        node_for("add", [randn(4, 6), randn(4, 4)])
    with pytest.raises(InputError, match="does not tile"):
        node_for("add", [randn(3), randn(2, 3)])
    node_for("add", [randn(3), randn(1, 3)])        # extra leading 1s change nothing
    with pytest.raises(InputError, match="f32 or f16"):
        node_for("add", [randn(3), np.zeros(3, I32)])
    with pytest.raises(InputError, match="f32 or f16"):
        node_for("div", [np.ones(3, I32), np.ones(3, I32)])


# --- unary ---------------------------------------------------------------------------------

def _gelu64(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


REF1 = {
    "neg": lambda x: -x, "abs": np.abs, "sqr": lambda x: x * x, "sqrt": np.sqrt, "log": np.log,
    "exp": np.exp, "relu": lambda x: np.where(x > 0, x, 0.0),
    "silu": lambda x: x / (1 + np.exp(-x)), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh, "gelu": _gelu64,
}
POSITIVE = {"sqrt", "log"}


def _unary_input(op, dtype=F32):
    x = randn(3, 5, 4, scale=2.0)
    if op in POSITIVE:
        x = np.abs(x) + 0.1
    return x.astype(dtype)


@pytest.mark.parametrize("op", list(REF1))
def test_unary_f32_strided(op):
    x = _unary_input(op)
    got = run(op, [scattered(x).transpose(2, 0, 1)])
    want = REF1[op](x.astype(np.float64).transpose(2, 0, 1))
    assert got.dtype == F32
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-6)


@pytest.mark.parametrize("op", list(REF1))
def test_unary_f16(op):
    x = _unary_input(op, F16)
    got = run(op, [x])
    assert got.dtype == F16
    want = REF1[op](x.astype(np.float64))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("op", ["neg", "abs", "sqr", "relu", "sqrt", "log", "exp", "silu",
                                "sigmoid", "tanh", "gelu", "scale", "clamp", "mean", "norm",
                                "rms_norm", "soft_max", "sum", "sum_rows", "argmax"])
def test_float_only_ops_reject_i32(op):
    params = {"s": 2} if op == "scale" else None
    with pytest.raises(InputError, match="must be f32"):
        node_for(op, [np.ones((2, 3), I32)], params)


def test_gelu_is_exact_not_tabulated():
    x = np.linspace(-6, 6, 4001).astype(F32)
    np.testing.assert_allclose(run("gelu", [x]), _gelu64(x.astype(np.float64)),
                               rtol=2e-6, atol=2e-7)


# --- scale, clamp --------------------------------------------------------------------------

def test_scale():
    x = randn(4, 3)
    np.testing.assert_allclose(run("scale", [scattered(x)], {"s": -2.5}), x * -2.5, rtol=1e-7)
    np.testing.assert_allclose(run("scale", [x], {"s": 3}), x * 3.0, rtol=1e-7)
    with pytest.raises(InputError, match="must be f32"):      # ggml-cpu's scale is f32 only
        node_for("scale", [x.astype(F16)], {"s": 0.1})


@pytest.mark.parametrize("bad", [True, "2", None, [1.0], float("nan"), float("inf"), 10**400])
def test_scale_rejects_bad_s(bad):
    with pytest.raises(InputError, match="'s'"):
        node_for("scale", [randn(2)], {"s": bad})


def test_clamp():
    x = randn(5, 4, scale=3.0)
    got = run("clamp", [scattered(x)], {"min": -1, "max": 0.5})
    np.testing.assert_array_equal(got, np.minimum(np.maximum(x, F32(-1)), F32(0.5)))
    np.testing.assert_array_equal(run("clamp", [x], {"min": 0.0}), np.where(x < 0, 0, x))
    np.testing.assert_array_equal(run("clamp", [x]), x)
    h = x.astype(F16)
    got = run("clamp", [scattered(h)], {"min": -0.3, "max": 1})
    assert got.dtype == F16
    np.testing.assert_array_equal(got, np.clip(h.astype(F32), F32(-0.3), 1).astype(F16))
    with pytest.raises(InputError, match="above max"):
        node_for("clamp", [x], {"min": 1, "max": 0})
    with pytest.raises(InputError, match="must be a number"):
        node_for("clamp", [x], {"min": False})


# --- reductions ----------------------------------------------------------------------------

def test_sum_sum_rows_mean():
    x = randn(2, 3, 7)
    xs = scattered(x).transpose(1, 0, 2)
    x64 = x.astype(np.float64).transpose(1, 0, 2)
    got = run("sum", [xs])
    assert got.shape == (1,) and got.dtype == F32
    np.testing.assert_allclose(got[0], x64.sum(), rtol=1e-6)
    got = run("sum_rows", [xs])
    assert got.shape == (3, 2, 1)
    np.testing.assert_allclose(got[..., 0], x64.sum(axis=-1), rtol=1e-6, atol=1e-6)
    got = run("mean", [xs])
    assert got.shape == (3, 2, 1)
    np.testing.assert_allclose(got[..., 0], x64.sum(axis=-1) / 7, rtol=1e-6, atol=1e-6)


def test_reductions_f16():
    h = randn(4, 300, dtype=F16)
    got = run("sum", [h])
    assert got.dtype == F16
    np.testing.assert_array_equal(got, [h.astype(np.float64).sum().astype(F16)])
    for op in ("sum_rows", "mean"):             # f32 only in ggml-cpu
        with pytest.raises(InputError, match="must be f32"):
            node_for(op, [h])


def test_argmax_ties_take_the_last_index():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [5, 1, 5, 4]], F32)
    got = run("argmax", [scattered(x)])
    assert got.dtype == I32 and got.tolist() == [2, 3, 2]
    got = run("argmax", [np.array([7, 9, 9, 1], F32)])
    assert got.shape == (1,) and got.tolist() == [2]
    x = randn(3, 9)
    want = [max(j for j in range(9) if r[j] == r.max()) for r in x]
    assert run("argmax", [x]).tolist() == want
    for bad in (x.astype(F16), np.ones((2, 3), I32), randn(2, 3, 9)):   # ggml_argmax: f32, 2-D
        with pytest.raises(InputError, match="must (be f32|have 1 to 2 dims)"):
            node_for("argmax", [bad])


# --- make_node errors ----------------------------------------------------------------------

def test_unknown_op_lists_alternatives():
    with pytest.raises(InputError, match=r"unknown op 'mulmat'.*mul_mat"):
        node_for("mulmat", [randn(2, 2), randn(2, 2)])


def test_unknown_param_key():
    with pytest.raises(InputError, match=r"unknown param 'sigma'"):
        node_for("norm", [randn(2, 2)], {"sigma": 1})
    with pytest.raises(InputError, match=r"unknown param 'axis'.*takes none"):
        node_for("transpose", [randn(2, 2)], {"axis": 1})


def test_missing_required_param():
    for op, srcs in [("scale", [randn(2)]), ("repeat", [randn(2)]),
                     ("concat", [randn(2), randn(2)]), ("view", [randn(2)]),
                     ("reshape", [randn(2)]), ("permute", [randn(2)])]:
        with pytest.raises(InputError, match="missing required param"):
            node_for(op, srcs)


def test_wrong_source_count_and_error_names_the_node():
    with pytest.raises(InputError, match="takes 2 sources, got 1") as err:
        node_for("add", [randn(2)], name="h")
    assert "node 'h'" in str(err.value)


def test_shape_mismatch_is_input_error():
    with pytest.raises(InputError, match=r"a \[64, 32\] and b \[8, 16\] disagree on K"):
        node_for("mul_mat", [randn(64, 32), randn(8, 16)])


# --- in place ------------------------------------------------------------------------------

INPLACE_CASES = [
    ("add", [randn(4, 6), randn(2, 3)], None), ("sub", [randn(4, 6), randn(4, 6)], None),
    ("mul", [randn(2, 5, 3), randn(3)], None), ("div", [randn(3, 4), randn(3, 4) + 4], None),
    ("sqr", [randn(3, 4)], None), ("sqrt", [np.abs(randn(3, 4))], None),
    ("log", [np.abs(randn(3, 4)) + 0.1], None), ("scale", [randn(3, 4)], {"s": 0.7}),
    ("neg", [randn(3, 4)], None), ("abs", [randn(3, 4)], None), ("relu", [randn(3, 4)], None),
    ("silu", [randn(3, 4)], None), ("sigmoid", [randn(3, 4)], None),
    ("tanh", [randn(3, 4)], None), ("gelu", [randn(3, 4)], None), ("exp", [randn(3, 4)], None),
    ("diag_mask_inf", [randn(2, 4, 4)], {"n_past": 1}),
    ("rope", [randn(2, 5, 3, 8), np.arange(5, dtype=I32) * 7], {"n_dims": 6}),
    ("rope", [randn(5, 3, 8), np.arange(5, dtype=I32)], {"mode": 2}),
    ("rms_norm", [randn(3, 16)], None),
    ("soft_max", [randn(2, 3, 4), np.triu(np.full((3, 4), -np.inf, F32), 1)], {"scale": 0.5}),
    ("soft_max", [randn(3, 4), randn(3, 4)], None),
]


@pytest.mark.parametrize("op,srcs,params", INPLACE_CASES,
                         ids=[f"{c[0]}{i}" for i, c in enumerate(INPLACE_CASES)])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_inplace_out_aliasing_its_source(op, srcs, params, dtype):
    assert get_op(op).inplace
    if dtype is F16 and op in ("scale", "diag_mask_inf", "rms_norm", "soft_max"):
        pytest.skip("ggml-cpu has no f16 form of this op (refused at load)")
    srcs = [s.astype(dtype) if s.dtype == F32 else s for s in srcs]
    fresh = run(op, srcs, params)
    tried = 0
    for k, src in enumerate(srcs):       # ggml's allocator may hand over any source's slot
        if src.shape != fresh.shape or src.dtype != fresh.dtype:
            continue
        parent = scattered(src)                 # the planner's slot: any strides
        given = srcs[:k] + [parent] + srcs[k + 1:]
        aliased = run(op, given, params, out=parent)
        np.testing.assert_array_equal(aliased, fresh)
        np.testing.assert_array_equal(parent, fresh)
        tried += 1
    assert tried >= 1


def test_add_id_in_place_on_its_experts():
    """ggml lists ADD_ID in place (f32 only, so not among the f16/f32 cases above): the biased
    experts may take the experts' slot, whatever its strides."""
    a, b = randn(5, 2, 8), randn(4, 8)
    ids = np.array([[0, 3], [1, 2], [3, 3], [2, 0], [1, 1]], dtype=I32)
    want = run("add_id", [a, b, ids], None)
    parent = scattered(a)
    np.testing.assert_array_equal(run("add_id", [parent, b, ids], None, out=parent), want)
    np.testing.assert_array_equal(parent, want)


def test_soft_max_in_place_on_its_mask():
    a, mask = randn(3, 4), randn(3, 4)
    want = run("soft_max", [a, mask], {"scale": 2.0})
    run("soft_max", [a, mask], {"scale": 2.0}, out=mask)
    np.testing.assert_array_equal(mask, want)


def test_flops():
    n = node_for("mul_mat", [randn(2, 5, 3), randn(6, 4, 3)])
    srcs = n.src
    assert get_op("mul_mat").count_flops(n, srcs) == 2 * 5 * 4 * 3 * 6
    n = node_for("sum_rows", [randn(4, 8)])
    assert get_op("sum_rows").count_flops(n, n.src) == 32
    n = node_for("add", [randn(4, 8), randn(8)])
    assert get_op("add").count_flops(n, n.src) == 32
    n = node_for("gelu", [randn(4, 8)])
    assert get_op("gelu").count_flops(n, n.src) > 32
    n = node_for("permute", [randn(4, 8)], {"axes": [1, 0]})
    assert get_op("permute").count_flops(n, n.src) == 0
    assert leaf_for("x", randn(2)).n_elements == 2
