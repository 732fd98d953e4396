"""soft_max bound by the executor (ops/nn.py `_soft_max_bind`): attention's scores shared
among the run's threads by head, a head at a time. Held to the kernel's bits, with and
without a mask (causal -inf, padded rows, f16), in place, for 1-3 threads; and the cases the
kernel keeps (ALiBi, a per-head mask, small scores, a mask sharing the output's memory)."""

from __future__ import annotations

import numpy as np
import pytest

from ggmlrun.core.ir.ops import nn
from ggmlrun.core.ir.ops.panels import Workers

F32 = np.float32


@pytest.fixture(autouse=True)
def any_size(monkeypatch):
    monkeypatch.setattr(nn, "SOFT_MAX_SHARE_MIN", 1)


def scores(shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 4).astype(F32)


def causal(rows, cols, pad=0, dtype=F32):
    mask = np.zeros((1, 1, rows + pad, cols), dtype)
    mask[0, 0][np.triu(np.ones((rows + pad, cols), bool), cols - rows + 1)] = -np.inf
    return mask


def kernel(a, mask, scale, max_bias=0.0):
    out = np.empty(a.shape, F32)
    nn._soft_max_kernel(out, a, mask, scale=scale, max_bias=max_bias)
    return out


def shared(a, mask, scale, threads, max_bias=0.0, out=None):
    out = np.empty(a.shape, F32) if out is None else out
    call = nn._soft_max_bind(out, a, mask, scale=scale, max_bias=max_bias,
                             workers=Workers(threads))
    assert call is not None
    fn, args = call
    fn(*args)
    return out


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("mask", [None, "causal", "padded", "f16"])
def test_bits_equal_the_kernel(threads, mask):
    a = scores((1, 5, 16, 24), seed=threads)
    m = {None: None, "causal": causal(16, 24), "padded": causal(16, 24, pad=8),
         "f16": causal(16, 24, dtype=np.float16)}[mask]
    want = kernel(a, m, 0.125)
    got = shared(a, m, 0.125, threads)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


def test_in_place_and_fully_masked_rows():
    """The node may hold its source's memory; a row masked whole gives nan, as the kernel."""
    a = scores((2, 3, 8, 8), seed=5)
    m = causal(8, 8)
    m[0, 0, 2] = -np.inf
    want = kernel(a, m, 0.5)
    a_inplace = a.copy()
    got = shared(a_inplace, m, 0.5, 2, out=a_inplace)
    assert np.isnan(want[:, :, 2]).all()
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


def test_largest_leading_dim_is_split():
    """[H, T, KV] without a batch dim, and a batch larger than the heads."""
    for shape in [(6, 4, 8), (7, 2, 4, 8)]:
        a = scores(shape, seed=len(shape))
        want = kernel(a, None, 1.0)
        assert np.array_equal(want.view(np.uint32), shared(a, None, 1.0, 2).view(np.uint32))


def test_kernel_keeps_what_a_slice_cannot_do_alone(monkeypatch):
    a = scores((1, 4, 8, 8))
    out = np.empty(a.shape, F32)
    bind = nn._soft_max_bind
    w = Workers(2)
    assert bind(out, a, causal(8, 8), scale=1.0, max_bias=8.0, workers=w) is None   # ALiBi
    per_head = np.zeros((1, 4, 8, 8), F32)
    assert bind(out, a, per_head, scale=1.0, max_bias=0.0, workers=w) is None
    assert bind(out, a, out, scale=1.0, max_bias=0.0, workers=w) is None     # mask = out's slot
    assert bind(out[0, 0], a[0, 0], None, scale=1.0, max_bias=0.0, workers=w) is None  # 2-D
    assert bind(out, a, None, scale=1.0, max_bias=0.0) is None                # no run context
    monkeypatch.setattr(nn, "SOFT_MAX_SHARE_MIN", 1 << 20)
    assert bind(out, a, None, scale=1.0, max_bias=0.0, workers=w) is None     # small
