"""The bridge itself, on the 4-node MLP of notes/ggml-today.md, against real ggml.

x[32,512] (input) -> h = mul_mat(w1[2048,512], x) -> a = gelu(h) -> y0 = mul_mat(w2[512,2048], a)
-> y = add(y0, x) (output). ggml 0.15.3 plans it into 393,216 bytes (CPU buffer, alignment 32):
x (64 KiB) + h (256 KiB, which gelu reuses in place) + y0 (64 KiB, which add reuses in place).
"""

from __future__ import annotations

import numpy as np
import pytest

import ggmlrun.core.ops  # noqa: F401  (registers the ops)
from ggmlrun.core.graph import Graph, Tensor
from ggmlrun.core.ops import make_node

from . import ggml_bridge as gb

# ggml's f32 GELU reads an fp16 table: about 8e-4 off the exact formula at worst.
GELU_ATOL = 2e-3
# y = a @ w2ᵀ + x sums 2048 gelu values times weights of scale 0.02: the gelu error averages out.
Y_ATOL = 2e-3


def mlp_graph() -> Graph:
    x = Tensor("x", (32, 512), role="input")
    w1 = Tensor("w1", (2048, 512), role="weight")
    w2 = Tensor("w2", (512, 2048), role="weight")
    h = make_node("h", "mul_mat", [w1, x])
    a = make_node("a", "gelu", [h])
    y0 = make_node("y0", "mul_mat", [w2, a])
    y = make_node("y", "add", [y0, x])
    y.is_output = True
    return Graph(name="mlp", leafs=[x, w1, w2], nodes=[h, a, y0, y], outputs=[y])


def mlp_values(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((32, 512), dtype=np.float32),
            "w1": (0.02 * rng.standard_normal((2048, 512))).astype(np.float32),
            "w2": (0.02 * rng.standard_normal((512, 2048))).astype(np.float32)}


def gelu_exact(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v**3)))


def test_mlp_shapes():
    g = mlp_graph()
    assert [n.shape for n in g.nodes] == [(32, 2048), (32, 2048), (32, 512), (32, 512)]


def test_gallocr_buffer_size_matches_the_notes():
    assert gb.gallocr_buffer_size(mlp_graph()) == 393216


def test_gallocr_offsets_show_inplace_reuse():
    got = gb.gallocr_offsets(mlp_graph())
    off = got["offsets"]
    assert got["buffer_size"] == 393216
    assert off["x"] == 0                      # inputs first
    assert off["a"] == off["h"]               # gelu in place over h
    assert off["y"] == off["y0"]              # add in place over y0


def test_compute_outputs_match_numpy():
    g, vals = mlp_graph(), mlp_values()
    out = gb.compute_outputs(g, vals, all_nodes=True)
    x, w1, w2 = (vals[k].astype(np.float64) for k in ("x", "w1", "w2"))
    h = x @ w1.T
    a = gelu_exact(h)
    y = a @ w2.T + x
    np.testing.assert_allclose(out["h"], h, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["a"], a, rtol=0, atol=GELU_ATOL)
    np.testing.assert_allclose(out["y"], y, rtol=0, atol=Y_ATOL)
    assert out["y"].dtype == np.float32 and out["y"].shape == (32, 512)
    # only the output when all_nodes is off, and the same values
    only = gb.compute_outputs(g, vals)
    assert set(only) == {"y"}
    np.testing.assert_array_equal(only["y"], out["y"])


def test_compute_outputs_needs_every_leaf():
    vals = mlp_values()
    del vals["w2"]
    with pytest.raises(KeyError, match="w2"):
        gb.compute_outputs(mlp_graph(), vals)


def test_sched_cpu_only():
    st = gb.sched_stats(mlp_graph(), device="none")
    assert st["backends"] == ["CPU"] and st["n_splits"] == 1
    assert st["buffer_sizes"] == {"CPU": 393216}
    assert set(st["node_backends"].values()) == {"CPU"}


@pytest.mark.skipif(not gb.HAS_RPC, reason="this ggml-python build has no RPC backend "
                    "(CMAKE_ARGS='-DGGML_RPC=ON' pip install --no-cache-dir ggml-python==0.0.45)")
def test_sched_two_backends_over_rpc():
    g = mlp_graph()
    # every weight on the device: one split on it, x copied in
    st = gb.sched_stats(g, {"w1", "w2"}, device="rpc")
    assert st["backends"] == ["SIM0", "CPU"] and st["device"] == "rpc"
    assert st["n_splits"] == 1
    assert set(st["node_backends"].values()) == {"SIM0"}
    assert st["splits"][0]["backend"] == "SIM0" and st["splits"][0]["inputs"] == ["x"]
    # w2 on the CPU: the second half runs there
    st = gb.sched_stats(g, {"w1"}, device="rpc")
    assert st["n_splits"] == 2
    assert st["node_backends"] == {"h": "SIM0", "a": "SIM0", "y0": "CPU", "y": "CPU"}
    assert [s["backend"] for s in st["splits"]] == ["SIM0", "CPU"]


def test_isolated_turns_an_abort_into_an_error():
    # reshape of a non-contiguous tensor: ggml_reshape's GGML_ASSERT aborts the process
    x = Tensor("x", (4, 6), role="input")
    t = make_node("t", "transpose", [x])
    t.strides = (4, 24)
    bad = Tensor("r", (24,), op="reshape", src=[t], params={"shape": [24]}, view_src=x)
    bad.is_output = True
    g = Graph(name="bad", leafs=[x], nodes=[t, bad], outputs=[bad])
    with pytest.raises(gb.GgmlAborted):
        gb.isolated(gb.gallocr_buffer_size, g)
    assert gb.isolated(gb.gallocr_buffer_size, mlp_graph()) == 393216
