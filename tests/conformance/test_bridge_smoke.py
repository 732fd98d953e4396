"""The bridge itself, on the 4-node MLP of notes/ggml-today.md, against real ggml.

x[32,512] (input) -> h = mul_mat(w1[2048,512], x) -> a = gelu(h) -> y0 = mul_mat(w2[512,2048], a)
-> y = add(y0, x) (output). ggml 0.15.3 plans it into 393,216 bytes (CPU buffer, alignment 32):
x (64 KiB) + h (256 KiB, which gelu reuses in place) + y0 (64 KiB, which add reuses in place).
"""

from __future__ import annotations

import numpy as np
import pytest

from ggmlrun.core.util.errors import InputError

import ggmlrun.core.ir.ops  # noqa: F401  (registers the ops)
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import make_node

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
    # ggml's CPU scale kernel takes only f32: GGML_ABORT in a compute thread
    x = Tensor("x", (4, 4), dtype="f16", role="input")
    with pytest.raises(InputError, match="must be f32"):    # ggmlrun refuses it at load
        make_node("y", "scale", [x], {"s": 2.0})
    y = Tensor("y", (4, 4), dtype="f16", op="scale", src=[x], params={"s": 2.0})  # as it was
    y.is_output = True
    g = Graph(name="bad", leafs=[x], nodes=[y], outputs=[y])
    with pytest.raises(gb.GgmlAborted, match="fatal error"):
        gb.isolated(gb.compute_outputs, g, {"x": np.ones((4, 4))})
    assert gb.isolated(gb.gallocr_buffer_size, mlp_graph()) == 393216


def test_strided_sources_are_refused_before_ggml_aborts():
    x = Tensor("x", (4, 6), role="input")
    t = make_node("t", "transpose", [x])
    with pytest.raises(InputError, match="insert a cont"):  # ggmlrun refuses it at load
        make_node("y", "add", [t, t])
    y = Tensor("y", (6, 4), op="add", src=[t, t])          # the graph as it was accepted
    y.is_output = True
    g = Graph(name="bad", leafs=[x], nodes=[t, y], outputs=[y])
    with pytest.raises(gb.Unsupported, match="innermost stride"):
        gb.gallocr_buffer_size(g)


# --- facts about ggml 0.15.3's graph allocator, read from real offsets -----------------------

def _graph(leafs, nodes, outputs) -> Graph:
    for t in outputs:
        t.is_output = True
    return Graph(name="g", leafs=leafs, nodes=nodes, outputs=outputs)


def test_ggml_fact_no_inplace_over_a_view_parent():
    # x (4 KiB) stays alive to the end, so no free hole hides the answer
    x = Tensor("x", (1024,), role="input")
    h = make_node("h", "mul", [x, x])
    r = make_node("r", "reshape", [h], {"shape": [32, 32]})
    s = make_node("s", "scale", [r], {"s": 2.0})                 # in-place op, same layout as r
    s2 = make_node("s2", "reshape", [s], {"shape": [1024]})
    t = make_node("t", "add", [s2, x])
    got = gb.gallocr_offsets(_graph([x], [h, r, s, s2, t], [t]))
    off = got["offsets"]
    assert off["r"] == off["h"]
    assert off["s"] not in (off["h"], off["x"])     # a fresh slot: never in place over a view
    assert got["buffer_size"] == 3 * 4096
    # the same without the reshape: scale takes h's slot
    s = make_node("s", "scale", [h], {"s": 2.0})
    t = make_node("t", "add", [s, x])
    got = gb.gallocr_offsets(_graph([x], [h, s, t], [t]))
    assert got["offsets"]["s"] == got["offsets"]["h"] and got["buffer_size"] == 2 * 4096


def _view_output_graph():
    x = Tensor("x", (64,), role="input")
    h = make_node("h", "mul", [x, x])
    y = make_node("y", "reshape", [h], {"shape": [8, 8]})        # an output that is a view
    z = make_node("z", "cont", [y])
    w = make_node("w", "scale", [z], {"s": 100.0})
    w2 = make_node("w2", "mul", [w, w])
    return _graph([x], [h, y, z, w, w2], [y, w2])


def test_ggml_fact_a_view_output_loses_its_source():
    g = _view_output_graph()
    off = gb.gallocr_offsets(g)["offsets"]
    assert off["w2"] == off["h"] == off["y"]        # h freed after z read y; w2 took its slot
    xv = np.arange(64, dtype=np.float32)
    raw = gb.compute_outputs(g, {"x": xv}, keep_view_sources=False)
    assert not np.array_equal(raw["y"].ravel(), xv * xv)     # ggml returns w2's values as y
    np.testing.assert_array_equal(raw["y"].ravel(), (100 * xv * xv) ** 2)
    kept = gb.compute_outputs(g, {"x": xv})                   # SPEC.md's rule: h kept alive
    np.testing.assert_array_equal(kept["y"].ravel(), xv * xv)
    off = gb.gallocr_offsets(g, keep_view_sources=True)["offsets"]
    assert off["w2"] != off["h"]


def test_ggml_fact_inputs_are_placed_first_in_first_use_order():
    a = Tensor("a", (64,), role="input")
    b = Tensor("b", (128,), role="input")
    c = Tensor("c", (32,), role="input")
    unused = Tensor("u", (16,), role="input")
    t1 = make_node("t1", "mul", [c, c])
    t2 = make_node("t2", "add", [b, a])
    got = gb.gallocr_offsets(_graph([a, b, c, unused], [t1, t2], [t1, t2]))
    off = got["offsets"]
    # discovery order c, b, a, then the unused input; packed before any node
    assert (off["c"], off["b"], off["a"], off["u"]) == (0, 128, 640, 896)
    assert off["t1"] >= 960 and off["t2"] == off["b"]     # add takes b's slot in place
