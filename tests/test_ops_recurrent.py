"""The ops of llama.cpp's hybrid (delta-net) layers against written-out NumPy formulas in
float64: softplus, ssm_conv, gated_delta_net (ggml-cpu's loops, its transposed state and its
output layout) and rope's multi-position modes (M-RoPE, IMROPE); zero-element views."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ggmlrun.core.util.errors import InputError
from opkit import node_for, randn, run, scattered

F32, F64, I32 = np.float32, np.float64, np.int32


def test_softplus_is_ggmls():
    x = np.array([-30.0, -1.0, 0.0, 0.5, 19.9, 20.0, 20.5, 80.0], F32)
    want = [v if v > 20 else math.log1p(math.exp(v)) for v in x.astype(F64)]
    # logf(1 + expf(x)) in float: 1 + e^-30 is 1, so ggml's softplus(-30) is 0
    np.testing.assert_allclose(run("softplus", [x]), want, rtol=2e-7, atol=1e-12)
    y = randn(3, 5, scale=10)
    np.testing.assert_allclose(run("softplus", [scattered(y)]), np.logaddexp(0, y.astype(F64))
                               * (y <= 20) + y * (y > 20), rtol=3e-6, atol=2e-7)


def ssm_conv_ref(sx, c):
    n_s, d_inner, cols = sx.shape
    d_conv = c.shape[1]
    n_t = cols - d_conv + 1
    out = np.zeros((n_s, n_t, d_inner), F64)
    for s in range(n_s):
        for t in range(n_t):
            for i in range(d_inner):
                out[s, t, i] = sum(F64(sx[s, i, t + k]) * c[i, k] for k in range(d_conv))
    return out


@pytest.mark.parametrize("n_s, d_inner, d_conv, n_t", [(1, 6, 4, 5), (2, 3, 2, 1)])
def test_ssm_conv_slides_each_channel(n_s, d_inner, d_conv, n_t):
    sx, c = randn(n_s, d_inner, d_conv - 1 + n_t), randn(d_inner, d_conv)
    got = run("ssm_conv", [sx, c])
    assert got.shape == (n_s, n_t, d_inner)
    np.testing.assert_allclose(got, ssm_conv_ref(sx, c), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="ssm_conv"):
        node_for("ssm_conv", [randn(n_s, d_inner + 1, d_conv + n_t), c])


def gdn_ref(q, k, v, g, beta, state, K=1):
    """ggml_compute_forward_gated_delta_net, element by element, in float64."""
    B, T, H, S = v.shape
    attn = np.zeros((B, T, H, S))
    snaps = np.zeros((K, B, H, S, S))
    for s in range(B):
        for h in range(H):
            M = state[s, h].astype(F64).copy()          # M[j, i] = S[i][j]
            hq, hk = h % q.shape[2], h % k.shape[2]
            for t in range(T):
                if g.shape[-1] == 1:
                    M *= math.exp(g[s, t, h, 0])
                else:
                    M *= np.exp(g[s, t, h].astype(F64))[None, :]
                kk, qq = k[s, t, hk].astype(F64), q[s, t, hq].astype(F64)
                delta = (v[s, t, h] - M @ kk) * beta[s, t, h, 0]
                M += np.outer(delta, kk)
                attn[s, t, h] = (M @ qq) / math.sqrt(S)
                if 0 <= T - 1 - t < K:
                    snaps[T - 1 - t, s, h] = M
    return attn, snaps


@pytest.mark.parametrize("B, T, H_k, H, S, K, kda", [(1, 5, 2, 4, 8, 1, False),
                                                   (2, 3, 1, 2, 4, 1, True),
                                                   (1, 4, 2, 2, 4, 2, False)])
def test_gated_delta_net_output_then_states(B, T, H_k, H, S, K, kda):
    q, k = randn(B, T, H_k, S, scale=0.5), randn(B, T, H_k, S, scale=0.5)
    v = randn(B, T, H, S)
    g = -np.abs(randn(B, T, H, S if kda else 1, scale=0.3))
    beta = 1 / (1 + np.exp(-randn(B, T, H, 1)))
    state = randn(B, H, S, S, scale=0.2)
    got = run("gated_delta_net", [q, k, v, g, beta.astype(F32), state], {"K": K})
    assert got.shape == (T * B + K * S * B, S * H)
    attn, snaps = gdn_ref(q, k, v, g, beta, state, K)
    flat = got.reshape(-1)
    np.testing.assert_allclose(flat[:B * T * H * S].reshape(B, T, H, S), attn, rtol=2e-4,
                               atol=2e-5)
    written = min(T, K)
    np.testing.assert_allclose(flat[B * T * H * S:].reshape(K, B, H, S, S)[:written],
                               snaps[:written], rtol=2e-4, atol=2e-5)
    with pytest.raises(InputError, match="state"):
        node_for("gated_delta_net", [q, k, v, g, beta, randn(B, H, S, S + 1)], {"K": 1})


def rope_multi_ref(x, pos4, n_dims, sections, imrope, base=10000.0):
    """ggml_mrope_cache_init + NeoX rotation: each pair's position by its sector."""
    T, H, D = x.shape
    out = x.astype(F64).copy()
    total = sum(sections)
    for t in range(T):
        for i in range(n_dims // 2):
            sector = i % total
            if imrope:
                j = (1 if sector % 3 == 1 and sector < 3 * sections[1] else
                     2 if sector % 3 == 2 and sector < 3 * sections[2] else
                     0 if sector % 3 == 0 and sector < 3 * sections[0] else 3)
            else:
                s0, s1, s2 = sections[0], sections[0] + sections[1], sum(sections[:3])
                j = 0 if sector < s0 else 1 if sector < s1 else 2 if sector < s2 else 3
            theta = pos4[j * T + t] * base ** (-2 * i / n_dims)
            c, s = math.cos(theta), math.sin(theta)
            u, w = x[t, :, i].astype(F64), x[t, :, i + n_dims // 2].astype(F64)
            out[t, :, i], out[t, :, i + n_dims // 2] = u * c - w * s, u * s + w * c
    return out


@pytest.mark.parametrize("mode, sections", [(40, [3, 3, 2, 0]), (8, [2, 1, 1, 0]),
                                            (40, [1, 1, 1, 1])])
def test_rope_multi_takes_each_pairs_position(mode, sections):
    T, H, D, n_dims = 5, 3, 24, 16
    x = randn(T, H, D)
    pos4 = np.concatenate([np.arange(T), 2 * np.arange(T) + 1, 3 * np.arange(T),
                           np.arange(T) + 7]).astype(I32)
    params = {"n_dims": n_dims, "mode": mode, "sections": sections}
    got = run("rope", [scattered(x), pos4], params)
    np.testing.assert_allclose(got, rope_multi_ref(x, pos4, n_dims, sections, mode == 40),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got[..., n_dims:], x[..., n_dims:])
    with pytest.raises(InputError, match="positions"):
        node_for("rope", [x, pos4[:T]], params)
    with pytest.raises(InputError, match="sections"):
        node_for("rope", [x, pos4], {"n_dims": n_dims, "mode": mode})


def test_imrope_of_text_positions_is_neox():
    """Text tokens have t = h = w (and e = 0): every IMROPE pair then turns as NeoX's."""
    T, H, D = 4, 2, 32
    x = randn(T, H, D)
    p = np.arange(T, dtype=I32) + 3
    pos4 = np.concatenate([p, p, p, np.zeros(T, I32)])
    got = run("rope", [x, pos4], {"n_dims": 16, "mode": 40, "sections": [3, 3, 2, 0]})
    np.testing.assert_array_equal(got, run("rope", [x, p], {"n_dims": 16, "mode": 2}))


def test_zero_element_views_and_rows():
    """llama.cpp's build_rs makes zero-element get_rows / view / cpy nodes in every reserve."""
    a = randn(1, 6)
    view = node_for("view", [a], {"shape": [0, 6], "strides": [24, 4], "offset": 24})
    assert view.shape == (0, 6) and view.nbytes == 0
    idx = np.zeros(0, I32)
    assert run("get_rows", [a, idx]).shape == (0, 6)
    with pytest.raises(InputError, match=">= 0"):
        node_for("view", [a], {"shape": [-1, 6]})
