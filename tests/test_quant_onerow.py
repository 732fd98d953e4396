"""mul_mat by one row of b on q8_0/q4_0/q4_K weights (ops/onerow.py): ggml's vec_dot
arithmetic (b's integer quants times the weight's, block scales per block), without a decoded
panel. Held to the exact (f64) value of decoded weight times rounded b, to the decode path,
across panel and thread seams, and with non-finite b (which keeps the decode path)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as Q

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op, make_node, onerow, panels
from ggmlrun.core.ir.ops.panels import PanelProduct, Workers
from ggmlrun.core.ir.ops.quant import round_like_vec_dot, storage_view, to_f32
from ggmlrun.core.ir.types import TYPES

F16, F32, F64 = np.float16, np.float32, np.float64


def weight(name: str, m: int, k: int, seed: int) -> np.ndarray:
    """An [m, k] weight's storage: gguf's encoder for q8_0/q4_0, random q4_K blocks with
    ordinary scales (gguf has no q4_K encoder)."""
    rng = np.random.default_rng(seed)
    if name == "q4_K":
        raw = rng.integers(0, 256, (m, k // 256, 144), dtype=np.uint8)
        raw[:, :, 0:2] = (rng.standard_normal((m, k // 256, 1)) * 0.01).astype(F16).view(np.uint8)
        raw[:, :, 2:4] = (rng.random((m, k // 256, 1)) * 0.002).astype(F16).view(np.uint8)
        raw = raw.reshape(m, -1)
    else:
        raw = gq.quantize(rng.standard_normal((m, k)).astype(F32), Q[name.upper()])
    gtype = TYPES[name]
    leaf = Tensor(name="w", shape=(m, k), dtype=name, role="weight")
    return storage_view(np.ascontiguousarray(raw).reshape(-1), 0, leaf.shape, leaf.strides,
                        gtype)


@pytest.fixture(autouse=True)
def any_size(monkeypatch):
    """The path is taken for weights of 1M values and more; these tests use small ones."""
    monkeypatch.setattr(onerow, "MIN_VALUES", 0)


def exact(a, b: np.ndarray) -> np.ndarray:
    """Decoded weight times b rounded to the vec_dot type, in f64: what both paths round."""
    return to_f32(a).astype(F64) @ round_like_vec_dot(b, a.ggml_type)[0].astype(F64)


@pytest.mark.parametrize("name", onerow.TYPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_one_row_equals_the_exact_product_across_panel_and_thread_seams(name, threads,
                                                                         monkeypatch):
    m, k = 77, 512
    a = weight(name, m, k, seed=len(name) + threads)
    b = np.random.default_rng(threads).standard_normal((1, k)).astype(F32)
    b[0, :32] = 0                                    # an all-zero block of b: quants 0
    monkeypatch.setattr(onerow, "PANEL_VALUES", 5 * k)          # 5-10 rows a panel
    monkeypatch.setattr(panels, "SPLIT_MIN_MACS", 0)
    product = PanelProduct(a, name, k, Workers(threads), n=1)
    got = np.full((1, m), np.nan, F32)
    assert product.one_row(got, b)
    want = exact(a, b)
    scale = np.abs(want).max()
    assert np.abs(got[0] - want).max() <= 1e-6 * scale
    decoded = np.empty((1, m), F32)
    product(decoded, round_like_vec_dot(b, name))              # the decode path
    assert np.abs(got - decoded).max() <= 2e-6 * scale


def test_each_block_meets_its_own_scale():
    """One nonzero quant per row, in a different block each row: a block/scale mix-up (the
    wrong block's d, or q4_K's sub-block order) would show."""
    for name in onerow.TYPES:
        k = 512
        a = weight(name, 16, k, seed=3)
        b = np.zeros((1, k), F32)
        for at in (0, 17, 40, 255, 300, 511):
            b[:] = 0
            b[0, at] = 1.5
            got = np.empty((1, 16), F32)
            assert PanelProduct(a, name, k, None, n=1).one_row(got, b)
            want = exact(a, b)
            np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=1e-7 * np.abs(want).max(),
                                       err_msg=f"{name} at {at}")


def test_other_cases_keep_the_decode_path(monkeypatch):
    a = weight("q4_0", 8, 64, seed=1)
    product = PanelProduct(a, "q4_0", 64, None, n=2)
    out = np.empty((2, 8), F32)
    assert not product.one_row(out, np.ones((2, 64), F32))                # two rows
    b = np.ones((1, 64), F32)
    b[0, 5] = np.inf
    assert not product.one_row(out[:1], b)                                # inf in b
    with np.errstate(over="ignore", under="ignore", invalid="raise"):   # no inf cast to int16
        assert not product.one_row(out[:1], np.full((1, 64), 1e-39, F32))
        k_product = PanelProduct(weight("q4_K", 4, 256, seed=2), "q4_K", 256, None, n=1)
        assert not k_product.one_row(out[:1, :4], np.full((1, 256), 1e-39, F32))
    q41 = weight("q8_0", 8, 64, seed=2)
    q41.ggml_type = "q4_1"
    assert not PanelProduct(q41, "q4_1", 64, None).one_row(out[:1], np.ones((1, 64), F32))
    monkeypatch.setattr(onerow, "MIN_VALUES", 8 * 64 + 1)
    assert not product.one_row(out[:1], np.ones((1, 64), F32))            # a small weight


@pytest.mark.parametrize("name", onerow.TYPES)
def test_the_mul_mat_kernel_takes_it_for_one_row(name):
    """The kernel (and the executor's binding) route a one-row b here; its result equals the
    batched decode path's within f32 rounding."""
    k = 256
    a = weight(name, 40, k, seed=9)
    b = np.random.default_rng(4).standard_normal((1, 1, k)).astype(F32)
    node = make_node("n", "mul_mat", [Tensor(name="a", shape=(40, k), dtype=name, role="weight"),
                                      Tensor(name="b", shape=(1, 1, k), dtype="f32", role="input")])
    out = np.empty(node.shape, F32)
    get_op("mul_mat").kernel(out, a, b)
    want = exact(a, b.reshape(1, k))
    assert np.abs(out.reshape(-1) - want).max() <= 1e-6 * np.abs(want).max()


@pytest.mark.parametrize("k", [4096, 14336, 768])
def test_q4_k_products_sit_a_fixed_distance_after_b_mod_4_kib(k):
    """q4_K's int16 products are half-major, and each row of each half starts UNDER_LEAD
    bytes (mod 4 KiB) after that half of the thread's copy of b's quants (rows padded to
    whole 4 KiB where that costs a quarter or less), so `products *= under` never waits on
    its own recent stores (4K aliasing)."""
    b = np.random.default_rng(1).standard_normal(k).astype(F32)
    prepared = onerow.OneRow(b, "q4_K")
    row_bytes = k // 256 * 144
    scratch = prepared.scratch(row_bytes)
    rows = prepared.panel_rows(row_bytes)
    assert scratch.wide.shape == (2, rows, k // 2)
    assert np.array_equal(scratch.under.reshape(prepared.under.shape), prepared.under)
    assert not np.shares_memory(scratch.under, prepared.under)
    leads = {(scratch.wide[h, i].ctypes.data - scratch.under[h].ctypes.data) % onerow.PAGE
             for h in range(2) for i in range(rows)}
    if k != 768:                       # a 768-value row would double to reach 4 KiB
        assert leads == {onerow.UNDER_LEAD}
    else:
        assert (scratch.wide[0, 0].ctypes.data - scratch.under[0].ctypes.data) \
            % onerow.PAGE == onerow.UNDER_LEAD
