"""norm, rms_norm, soft_max, diag_mask_inf, rope, mul_mat and get_rows against written-out
float64 formulas (loops where the indexing is the point, e.g. mul_mat's j // r batches)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ggmlrun.core.util.errors import InputError, RunError
from opkit import node_for, randn, run, scattered

F16, F32, I32, F64 = np.float16, np.float32, np.int32, np.float64


# --- norm, rms_norm ------------------------------------------------------------------------

def test_norm():
    x = randn(3, 2, 33, scale=4.0) + 1.5
    for eps in (1e-5, 0.1):
        got = run("norm", [scattered(x)], {"eps": eps})
        x64 = x.astype(F64)
        mu = x64.sum(-1, keepdims=True) / 33
        var = ((x64 - mu) ** 2).sum(-1, keepdims=True) / 33
        np.testing.assert_allclose(got, (x64 - mu) / np.sqrt(var + eps), rtol=2e-5, atol=2e-6)
    with pytest.raises(InputError, match="must be f32"):     # ggml-cpu's norm is f32 only
        node_for("norm", [x.astype(F16)])


def test_rms_norm():
    x = randn(4, 64, scale=3.0)
    got = run("rms_norm", [scattered(x).T.T])
    x64 = x.astype(F64)
    want = x64 / np.sqrt((x64 * x64).sum(-1, keepdims=True) / 64 + 1e-6)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    got = run("rms_norm", [x], {"eps": 2.0})
    np.testing.assert_allclose(got, x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 2.0),
                               rtol=2e-6)


@pytest.mark.parametrize("eps", [-1.0, "1e-5", True, float("inf")])
def test_norm_eps_checked(eps):
    with pytest.raises(InputError, match="'eps'"):
        node_for("rms_norm", [randn(2, 3)], {"eps": eps})


# --- soft_max ------------------------------------------------------------------------------

def softmax_ref(a, mask, scale):
    a64 = a.astype(F64) * scale
    out = np.empty_like(a64)
    for idx in itertools.product(*[range(d) for d in a.shape[:-1]]):
        row = a64[idx].copy()
        if mask is not None:
            lead = idx[:-1]
            mlead = tuple(i % m for i, m in zip(lead[len(lead) - (mask.ndim - 2):],
                                                mask.shape[:-2])) if mask.ndim > 2 else ()
            row += mask[mlead + (idx[-1],)].astype(F64)
        e = np.exp(row - row.max())
        out[idx] = e / e.sum()
    return out


@pytest.mark.parametrize("ashape,mshape", [((2, 3, 5), None), ((2, 2, 3, 5), (3, 5)),
                                           ((4, 2, 3, 5), (2, 1, 3, 5)), ((6, 5), (6, 5))])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_soft_max(ashape, mshape, scale):
    a = randn(*ashape, scale=2.0)
    mask = None
    if mshape:
        mask = randn(*mshape)
        mask[..., -1] = -np.inf             # keep a masked column in every row
    srcs = [scattered(a)] + ([scattered(mask)] if mask is not None else [])
    got = run("soft_max", srcs, {"scale": scale})
    want = softmax_ref(a, mask, scale)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    if mask is not None:
        assert (got[..., -1] == 0).all()


def test_soft_max_f16_and_mask_errors():
    a, mask = randn(2, 3, 4), randn(3, 4, dtype=F16)
    got = run("soft_max", [a, mask], {"scale": 2})        # an f16 mask over f32 scores
    assert got.dtype == F32
    np.testing.assert_allclose(got, softmax_ref(a, mask, 2.0), rtol=2e-5, atol=2e-6)
    with pytest.raises(InputError, match="must be f32"):  # ggml-cpu's soft_max is f32 only
        node_for("soft_max", [a.astype(F16), mask])
    with pytest.raises(InputError, match="last dim must equal"):
        node_for("soft_max", [randn(2, 3, 4), randn(3, 5)])
    with pytest.raises(InputError, match="at least 3 rows"):
        node_for("soft_max", [randn(2, 3, 4), randn(2, 4)])
    with pytest.raises(InputError, match="tile"):
        node_for("soft_max", [randn(3, 3, 4), randn(2, 3, 4)])
    with pytest.raises(InputError, match="'scale'"):
        node_for("soft_max", [randn(3, 4)], {"scale": [1]})


# --- diag_mask_inf -------------------------------------------------------------------------

@pytest.mark.parametrize("n_past", [0, 1, 5])
def test_diag_mask_inf(n_past):
    x = randn(2, 3, 4, 6)
    got = run("diag_mask_inf", [scattered(x)], {"n_past": n_past})
    want = x.copy()
    for i, j in itertools.product(range(4), range(6)):
        if j > i + n_past:
            want[..., i, j] = -np.inf
    np.testing.assert_array_equal(got, want)


def test_diag_mask_inf_errors():
    with pytest.raises(InputError, match="2 to 4 dims"):
        node_for("diag_mask_inf", [randn(5)])
    with pytest.raises(InputError, match="'n_past' must be an integer"):
        node_for("diag_mask_inf", [randn(3, 3)], {"n_past": 1.0})
    with pytest.raises(InputError, match="'n_past' must be >= 0"):   # ggml asserts n_past >= 0
        node_for("diag_mask_inf", [randn(3, 3)], {"n_past": -1})


# --- rope ----------------------------------------------------------------------------------

def rope_ref64(x, pos, n_dims, mode, base=10000.0, fscale=1.0):
    """SPEC.md's formula in float64: θ = p·freq_scale·base^(−2i/n_dims)."""
    out = x.astype(F64).copy()
    half = n_dims // 2
    for t, p in enumerate(pos):
        for i in range(half):
            th = p * fscale * base ** (-2.0 * i / n_dims)
            j0, j1 = (2 * i, 2 * i + 1) if mode == 0 else (i, i + half)
            u, v = x[..., t, :, j0].astype(F64), x[..., t, :, j1].astype(F64)
            out[..., t, :, j0] = u * np.cos(th) - v * np.sin(th)
            out[..., t, :, j1] = u * np.sin(th) + v * np.cos(th)
    return out


def rope_ref32(x, pos, n_dims, mode, base=10000.0, fscale=1.0):
    """ggml's way: θ in f32 by a running product, rotation in f32."""
    out = x.astype(F32).copy()
    half = n_dims // 2
    step = F32(base) ** (F32(-2.0) / F32(n_dims))
    for t, p in enumerate(pos):
        theta = F32(p)
        for i in range(half):
            th = theta * F32(fscale)
            c, s = np.cos(np.array([th], F32))[0], np.sin(np.array([th], F32))[0]
            j0, j1 = (2 * i, 2 * i + 1) if mode == 0 else (i, i + half)
            u, v = x[..., t, :, j0].astype(F32), x[..., t, :, j1].astype(F32)
            out[..., t, :, j0] = u * c - v * s
            out[..., t, :, j1] = u * s + v * c
            theta = F32(theta * step)
    return out


@pytest.mark.parametrize("mode", [0, 2])
@pytest.mark.parametrize("shape,n_dims", [((2, 5, 3, 16), 16), ((5, 2, 12), 8),
                                          ((2, 5, 1, 10), 4)])
def test_rope_small_positions(mode, shape, n_dims):
    x = randn(*shape)
    pos = np.array([0, 1, 2, 7, 31], I32)
    got = run("rope", [scattered(x), scattered(pos)], {"n_dims": n_dims, "mode": mode})
    np.testing.assert_allclose(got, rope_ref64(x, pos, n_dims, mode), rtol=0, atol=2e-5)
    np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])   # pass-through


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_large_positions_follow_the_f32_running_product(mode):
    x = randn(4, 2, 64)
    pos = np.array([5, 1000, 30000, 65000], I32)
    params = {"n_dims": 48, "mode": mode, "freq_base": 500000.0, "freq_scale": 0.5}
    got = run("rope", [x, pos], params)
    ref32 = rope_ref32(x, pos, 48, mode, 500000.0, 0.5)
    np.testing.assert_allclose(got, ref32, rtol=0, atol=2e-6)
    # Against exact math, θ's f32 rounding grows with p·(pairs): |Δθ| <~ p·(n/2+2)·2⁻²⁴
    # (about 0.1 rad at p = 65000), hence the loose bound here.
    ref64 = rope_ref64(x, pos, 48, mode, 500000.0, 0.5)
    bound = pos[:, None, None] * (48 / 2 + 2) * 2.0**-24 * np.abs(x).max() * 2 + 1e-5
    assert (np.abs(got - ref64) <= bound).all()
    assert np.abs(got - ref64).max() > 1e-4         # the running product really is used


def test_rope_f16_and_defaults():
    x = randn(3, 2, 8, dtype=F16)
    pos = np.array([3, 0, 9], I32)
    got = run("rope", [x, pos])
    assert got.dtype == F16
    np.testing.assert_allclose(got.astype(F64), rope_ref64(x, pos, 8, 0), atol=4e-3)


@pytest.mark.parametrize("srcs,params,msg", [
    ([randn(3, 8), np.arange(3, dtype=I32)], {}, "3 to 4 dims"),
    ([randn(3, 2, 8), np.arange(4, dtype=I32)], {}, r"must be \[T\] = \[3\]"),
    ([randn(3, 2, 8), np.arange(3, dtype=F32)], {}, "must be i32"),
    ([randn(3, 2, 8), np.arange(3, dtype=I32)], {"n_dims": 5}, "even"),
    ([randn(3, 2, 8), np.arange(3, dtype=I32)], {"n_dims": 10}, "at most D"),
    ([randn(3, 2, 8), np.arange(3, dtype=I32)], {"mode": 1}, "mode must be 0"),
    ([randn(3, 2, 8), np.arange(3, dtype=I32)], {"mode": True}, "mode must be 0"),
    ([randn(3, 2, 8), np.arange(3, dtype=I32)], {"freq_base": 0}, "'freq_base' must be > 0"),
    ([randn(3, 2, 7), np.arange(3, dtype=I32)], {}, "odd"),
])
def test_rope_errors(srcs, params, msg):
    with pytest.raises(InputError, match=msg):
        node_for("rope", srcs, params)


# --- mul_mat -------------------------------------------------------------------------------

def mul_mat_ref(a, b):
    """Written out: out[j..., n, m] = Σ_k b[j..., n, k]·a[j // r ..., m, k]."""
    rank = max(a.ndim, b.ndim, 2)
    a = a.astype(F64).reshape((1,) * (rank - a.ndim) + a.shape)
    b = b.astype(F64).reshape((1,) * (rank - b.ndim) + b.shape)
    r = [db // da for da, db in zip(a.shape[:-2], b.shape[:-2])]
    out = np.zeros(b.shape[:-2] + (b.shape[-2], a.shape[-2]))
    for j in itertools.product(*[range(d) for d in b.shape[:-2]]):
        ja = tuple(ji // ri for ji, ri in zip(j, r))
        for n in range(b.shape[-2]):
            for m in range(a.shape[-2]):
                out[j + (n, m)] = sum(b[j + (n, k)] * a[ja + (m, k)] for k in range(a.shape[-1]))
    return out


@pytest.mark.parametrize("ashape,bshape", [((5, 3), (4, 3)), ((2, 5, 3), (6, 4, 3)),
                                           ((5, 3), (3, 4, 3)), ((2, 1, 5, 3), (4, 3, 2, 3)),
                                           ((3,), (2, 3)), ((2, 2, 4, 3), (2, 2, 1, 3))])
def test_mul_mat_batches_repeat_interleave(ashape, bshape):
    a, b = randn(*ashape), randn(*bshape)
    got = run("mul_mat", [scattered(a), scattered(b)])
    assert got.dtype == F32
    np.testing.assert_allclose(got, mul_mat_ref(a, b), rtol=1e-5, atol=1e-5)


def test_mul_mat_batch_is_not_tiling():
    a = np.stack([np.eye(2, dtype=F32) * (i + 1) for i in range(2)])       # a[i] = (i+1)·I
    b = np.ones((4, 1, 2), F32)
    got = run("mul_mat", [a, b])
    assert got[:, 0, 0].tolist() == [1, 1, 2, 2]     # j // r, not j % 2


def test_mul_mat_f16_a_rounds_b():
    a = np.ones((2, 8), F16)
    b = np.full((3, 8), 1.0003, F32)                 # 1.0003 rounds to 1.0 in f16
    got = run("mul_mat", [a, b])
    assert got.dtype == F32
    np.testing.assert_array_equal(got, np.full((3, 2), 8.0, F32))
    a, b = randn(3, 4, 16, dtype=F16), randn(6, 5, 16)
    want = mul_mat_ref(a.astype(F64), b.astype(F16).astype(F64))
    np.testing.assert_allclose(run("mul_mat", [a, scattered(b)]), want, rtol=1e-5, atol=1e-5)


def test_mul_mat_errors():
    with pytest.raises(InputError, match=r"b's batch dims \[4\] must each be a multiple"):
        node_for("mul_mat", [randn(3, 5, 2), randn(4, 6, 2)])
    with pytest.raises(InputError, match="f32 or f16"):
        node_for("mul_mat", [np.ones((2, 2), I32), randn(2, 2)])
    n = node_for("mul_mat", [randn(2, 1, 64, 32), randn(2, 3, 8, 32)])
    assert n.shape == (2, 3, 8, 64) and n.dtype == "f32"


# --- get_rows ------------------------------------------------------------------------------

def test_get_rows():
    a = randn(5, 3)
    idx = np.array([4, 0, 4, 2], I32)
    got = run("get_rows", [scattered(a), scattered(idx)])
    assert got.shape == (4, 3) and got.dtype == F32
    np.testing.assert_array_equal(got, np.stack([a[4], a[0], a[4], a[2]]))
    a3 = randn(2, 5, 3, dtype=F16)
    idx3 = np.array([[1, 1], [4, 0]], I32)
    got = run("get_rows", [a3, idx3])
    assert got.dtype == F32
    np.testing.assert_array_equal(got, np.stack([[a3[0, 1], a3[0, 1]],
                                                 [a3[1, 4], a3[1, 0]]]).astype(F32))
    ai = np.arange(15, dtype=I32).reshape(5, 3)
    got = run("get_rows", [ai, np.array([3], I32)])
    assert got.dtype == I32 and got.tolist() == [[9, 10, 11]]


def test_get_rows_errors():
    with pytest.raises(InputError, match="must be i32"):
        node_for("get_rows", [randn(5, 3), np.zeros(2, F32)])
    with pytest.raises(InputError, match=r"a \[B, R, C\] with b \[B, N\]"):
        node_for("get_rows", [randn(2, 5, 3), np.zeros((3, 2), I32)])
    with pytest.raises(InputError, match="must be a"):
        node_for("get_rows", [randn(5, 3), np.zeros((1, 2), I32)])
    with pytest.raises(RunError, match="out of range"):
        run("get_rows", [randn(5, 3), np.array([5], I32)])
