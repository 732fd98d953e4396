"""mul_mat's panel path (ops/panels.py) against plain NumPy, and the executor's use of it.

The panel path takes every single-matrix a (each weight); the batched path keeps attention's
rank-3/4 products. Both are checked against an f64 NumPy reference, with panel counts that do
not divide a's rows, one and several threads, and f16 values NumPy's own cast is the judge of.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants as gq

from ggmlrun.core import engine
from ggmlrun.core.backends.spec import default_cpu
from ggmlrun.core.frontend.gen import mlp
from ggmlrun.core.frontend.loader import load_graph
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op, make_node
from ggmlrun.core.ir.ops import panels
from ggmlrun.core.ir.ops.matmul import _mul_mat_batched, _mul_mat_bind, _mul_mat_bind_any
from ggmlrun.core.ir.ops.quant import storage_view
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util import host
from ggmlrun.core.run.exec import Executor
from opkit import leaf_for, randn

F16, F32, F64 = np.float16, np.float32, np.float64
INF_NAN_BITS = [0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7FFF, 0xFFFF]


def product(a, b, workers=None, constant=(False, False)):
    """mul_mat of a one-matrix a [M, ..] (any storage) through the panel path, which must
    take it, into a fresh out [.., N, M]."""
    out = np.full(b.shape[:-1] + (a.shape[0],), np.nan, F32)
    call = _mul_mat_bind(out, a, b, workers=workers, constant=constant)
    assert call is not None, "the panel path should take a single matrix"
    fn, args = call
    with np.errstate(all="ignore"):
        fn(*args)
    return out


def typed(raw: np.ndarray, name: str, shape: tuple[int, ...]):
    leaf = Tensor(name="w", shape=shape, dtype=name, role="weight")
    buf = np.frombuffer(np.ascontiguousarray(raw).tobytes(), np.uint8).copy()
    return storage_view(buf, 0, leaf.shape, leaf.strides, TYPES[name])


def test_f16_bits_become_the_value_times_2_to_the_minus_112_for_every_finite_f16():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    finite = np.isfinite(bits.view(F16))
    scratch = np.empty(bits.size, np.int32)
    got = panels.f16_scaled(bits.view(F16), scratch).astype(F64) * 2.0 ** 112
    want = bits.view(F16).astype(F64)
    np.testing.assert_array_equal(got[finite], want[finite])          # denormals, -0 included
    assert np.signbit(got[finite]).tolist() == np.signbit(want[finite]).tolist()


def test_inf_and_nan_f16_are_found_and_the_largest_finite_are_not():
    clean = np.array([65504, -65504, 0, -0.0, 6e-8], F16)
    assert not panels.f16_has_inf_nan(clean)
    for bits in INF_NAN_BITS:
        dirty = clean.copy()
        dirty.view(np.uint16)[2] = bits
        assert panels.f16_has_inf_nan(dirty), hex(bits)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("m", [1, 17, 300])
def test_f32_and_f16_panels_match_numpy_with_odd_row_counts(threads, m):
    k = 4096 // 16          # 256: f16 panels of 1024 rows, f32 of 4096 -> shrink to force many
    a, b = randn(m, k), randn(3, 5, k)
    workers = panels.Workers(threads)
    old = panels.DECODED_PANEL_BYTES, panels.F32_PANEL_BYTES, panels.SPLIT_MIN_MACS
    panels.DECODED_PANEL_BYTES = panels.F32_PANEL_BYTES = 16 * 4 * k   # 16-row panels
    panels.SPLIT_MIN_MACS = 0
    try:
        got32 = product(a, b, workers)
        a16 = a.astype(F16)
        got16 = product(a16, b, workers)
    finally:
        panels.DECODED_PANEL_BYTES, panels.F32_PANEL_BYTES, panels.SPLIT_MIN_MACS = old
    np.testing.assert_allclose(got32, b.astype(F64) @ a.astype(F64).T, rtol=1e-5, atol=1e-4)
    b16 = b.astype(F16).astype(F64)             # ggml rounds b to f16 for an f16 a
    np.testing.assert_allclose(got16, b16 @ a16.astype(F64).T, rtol=1e-5, atol=1e-4)
    assert got16.shape == (3, 5, m)


def test_f16_panels_with_denormals_give_what_numpys_cast_gives():
    a = (randn(40, 64) * 1e-5).astype(F16)       # many f16 denormals (below 6.1e-5)
    assert (np.abs(a.astype(F32)) < 6.1e-5).mean() > 0.5
    b = randn(4, 64) * 1000
    want = np.empty((4, 40), F32)
    _mul_mat_batched(want, a, b)                 # NumPy's cast, the unchanged path
    np.testing.assert_allclose(product(a, b), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("bits", INF_NAN_BITS)
def test_inf_and_nan_in_an_f16_matrix_come_out_as_ggml_gives_them(bits, constant):
    a = randn(20, 32).astype(F16)
    a.view(np.uint16)[7, 3] = bits
    b = randn(2, 32)
    want = np.empty((2, 20), F32)
    with np.errstate(all="ignore"):
        _mul_mat_batched(want, a, b)
    got = product(a, b, constant=(constant, False))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-6)
    assert not np.isfinite(got[:, 7]).any()


def test_a_constant_f16_weight_is_checked_once_at_bind():
    """constant=(True, ..) promises a's bits never change: a clean a skips later checks, so
    an inf written afterwards is (knowingly) not seen; without the promise it is."""
    a = randn(20, 32).astype(F16)
    b = randn(2, 32)
    out = np.empty((2, 20), F32)
    fn, args = _mul_mat_bind(out, a, b, constant=(True, False))
    a.view(np.uint16)[0, 0] = 0x7C00
    fn(*args)
    assert np.isfinite(out).all()                # the promise was taken at its word
    fn, args = _mul_mat_bind(out, a, b, constant=(False, False))
    with np.errstate(all="ignore"):
        fn(*args)
    assert not np.isfinite(out[:, 0]).any()


@pytest.mark.parametrize("name", ["q8_0", "q4_1", "q4_K", "bf16"])
def test_quantized_panels_match_the_whole_matrix_decode(name):
    a, b = randn(50, 256), randn(2, 3, 256)
    if name == "bf16":
        raw = (a.view(np.uint32) >> 16).astype(np.uint16)
    elif name == "q4_K":                         # gguf cannot encode it: random blocks
        raw = np.random.default_rng(5).integers(0, 256, size=(50, 144), dtype=np.uint8)
        raw[:, 0:2] = np.frombuffer(F16(0.01).tobytes(), np.uint8)    # d
        raw[:, 2:4] = np.frombuffer(F16(0.002).tobytes(), np.uint8)   # dmin
    else:
        raw = gq.quantize(a, Q[name.upper()])
    arr = typed(raw, name, (50, 256))
    old = panels.DECODED_PANEL_BYTES
    panels.DECODED_PANEL_BYTES = 16 * 4 * 256
    try:
        got = product(arr, b, panels.Workers(2))
    finally:
        panels.DECODED_PANEL_BYTES = old
    want = np.empty(got.shape, F32)
    _mul_mat_batched(want, arr, b)               # decodes a whole, one broadcasting matmul
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("name", ["q8_0", "q4_K", "f16", "f32"])
@pytest.mark.parametrize("threads", [2, 3])
def test_b_rounded_by_shared_rows_gives_one_threads_bits(name, threads, monkeypatch):
    """A wide b's rounding to a's vec_dot type is shared by rows among the threads (each
    row is rounded on its own: the bits cannot depend on who rounds it)."""
    a, b = randn(40, 256), randn(7, 256) * 3
    if name == "q4_K":
        raw = np.random.default_rng(6).integers(0, 256, size=(40, 144), dtype=np.uint8)
        raw[:, 0:2] = np.frombuffer(F16(0.01).tobytes(), np.uint8)
        raw[:, 2:4] = np.frombuffer(F16(0.002).tobytes(), np.uint8)
    elif name == "f16":
        raw = a.astype(F16)
    elif name == "f32":
        raw = a
    else:
        raw = gq.quantize(a, Q[name.upper()])
    arr = typed(raw, name, (40, 256)) if name not in ("f16", "f32") else raw
    monkeypatch.setattr(panels, "SPLIT_MIN_MACS", 1 << 40)       # panels on one thread
    want = product(arr, b, panels.Workers(1))
    calls = []
    real = panels.Workers.share_evenly
    monkeypatch.setattr(panels.Workers, "share_evenly",
                        lambda self, work, count, *rest: calls.append(count)
                        or real(self, work, count, *rest))
    monkeypatch.setattr(panels, "ROUND_SHARE_MIN_VALUES", 1)
    got = product(arr, b, panels.Workers(threads))
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert calls == ([] if name == "f32" else [7])               # f32: nothing to round


@pytest.mark.parametrize("a_shape,b_shape", [((4, 6, 8), (8, 5, 8)), ((2, 3, 6, 8), (2, 6, 5, 8)),
                                             ((1, 6, 8), (3, 5, 8))])
def test_batched_and_single_matrix_products_both_match_numpy(a_shape, b_shape):
    a, b = randn(*a_shape), randn(*b_shape)
    node = make_node("n", "mul_mat", [leaf_for("a", a), leaf_for("b", b)])
    out = np.empty(node.shape, F32)
    get_op("mul_mat").kernel(out, a, b)
    rank = len(node.shape)
    a4 = a.reshape((1,) * (rank - a.ndim) + a.shape)
    reps = [nb // na for na, nb in zip(a4.shape[:-2], b.shape[:-2])]
    a_rep = a4
    for axis, r in enumerate(reps):
        a_rep = np.repeat(a_rep, r, axis=axis)
    want = b.astype(F64) @ np.swapaxes(a_rep, -1, -2).astype(F64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    single = all(d == 1 for d in a.shape[:-2])
    assert (_mul_mat_bind(out, a, b) is not None) == single


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("kind", ["kq", "kqv"])
def test_attention_products_shared_among_threads_give_one_thread_blas_bits(threads, kind):
    """kq and kqv as llama's graph makes them: a the f16 cache (strided views, 3 KV heads for
    6 query heads), b permuted or the softmax. Shared out by KV head (BLAS at one thread per
    part), the bits are those of the whole batched product with BLAS at one thread."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(threads)
    if kind == "kq":
        a = rng.standard_normal((3, 40, 16)).astype(F16)[None, :, :24]       # cache [.., cells, d]
        b = rng.standard_normal((1, 24, 6, 16)).astype(F32).transpose(0, 2, 1, 3)
        shape = (1, 6, 24, 24)
    else:
        a = rng.standard_normal((3, 16, 40)).astype(F16)[None, :, :, :24]    # transposed V
        b = rng.random((1, 6, 24, 24)).astype(F32)
        shape = (1, 6, 24, 16)
    want = np.empty(shape, F32)
    with threadpool_limits(limits=1, user_api="blas"):
        _mul_mat_batched(want, a, b)
    got = np.full(shape, np.nan, F32)
    old = panels.SPLIT_MIN_MACS
    panels.SPLIT_MIN_MACS = 0
    try:
        call = _mul_mat_bind_any(got, a, b, workers=panels.Workers(threads))
    finally:
        panels.SPLIT_MIN_MACS = old
    assert (call is None) == (panels.Workers(threads).threads == 1)
    if call is None:
        return
    call[0](*call[1])
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_an_out_that_is_not_rows_takes_the_batched_path():
    a, b = randn(6, 8), randn(2, 3, 8)
    out = np.empty((3, 2, 6), F32).transpose(1, 0, 2)   # [2, 3, 6]: rows not one stride apart
    assert _mul_mat_bind(out, a, b) is None
    get_op("mul_mat").kernel(out, a, b)
    np.testing.assert_allclose(out, b @ a.T, rtol=1e-5, atol=1e-5)


def executor_for(text: str, threads: int):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "g.yaml"
        path.write_text(text)
        graph = load_graph(path)
    sched = engine.schedule(graph, [default_cpu()])
    plan, _ = engine.plan_memory(sched)
    values = engine.leaf_values(graph)
    return Executor(sched, plan, values, threads=threads), graph, values


@pytest.mark.host
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_one_thread_or_two_the_executor_gives_the_same_bits(dtype):
    """Threads share whole panels, so the sums are the same; BLAS at one thread for both
    (it decides its own sum order when threaded)."""
    from threadpoolctl import threadpool_limits

    text = mlp(layers=1, dim=256, hidden=1024, batch=8, dtype=dtype)
    results = []
    old = panels.F32_PANEL_BYTES, panels.DECODED_PANEL_BYTES, panels.SPLIT_MIN_MACS
    panels.F32_PANEL_BYTES = panels.DECODED_PANEL_BYTES = 16 * 4 * 1024
    panels.SPLIT_MIN_MACS = 0
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            for threads in (1, 2):
                executor, graph, values = executor_for(text, threads)
                assert executor.workers.threads == min(threads, host.cores())
                feed = {t: values[t] for t in graph.inputs}
                results.append(executor.run(feed).outputs[graph.outputs[0].name])
    finally:
        panels.F32_PANEL_BYTES, panels.DECODED_PANEL_BYTES, panels.SPLIT_MIN_MACS = old
    np.testing.assert_array_equal(results[0], results[1])


def test_a_weight_that_a_node_writes_into_is_not_constant():
    text = """
tensors:
  w:     {shape: [4, 8], dtype: f16, init: randn}
  cache: {shape: [4, 8], dtype: f16, init: randn}
  x:     {shape: [2, 8], role: input, init: randn}
nodes:
  - {name: slot,  op: view, src: [cache], params: {shape: [2, 8]}}
  - {name: store, op: cpy,  src: [x, slot]}
  - {name: y,     op: mul_mat, src: [w, x]}
  - {name: z,     op: mul_mat, src: [cache, x]}
outputs: [y, z, store]
"""
    executor, graph, _ = executor_for(text, 1)
    executor._compile()
    by_name = {t.name: t for t in list(graph.leafs) + list(graph.nodes)}
    assert executor._constant(by_name["w"])
    assert not executor._constant(by_name["cache"])
    assert not executor._constant(by_name["slot"])     # a view of the written cache
    assert not executor._constant(by_name["x"])
