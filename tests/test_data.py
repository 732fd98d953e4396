"""Leaf data: every init and its keys, seeding that ignores the rest of the graph, files, --input."""

from __future__ import annotations

import hashlib
import pickle
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.frontend.data import data_seed, leaf_array, load_input_override, load_npy
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.frontend.loader import load_graph

NODES = "nodes: [{name: out, op: relu, src: [%s]}]\n"


def graph_of(tmp_path: Path, tensors: str, *, seed: int | None = None, use: str | None = None,
             name: str = "g.yaml"):
    """A graph holding `tensors` (YAML lines under `tensors:`) and one node using the first."""
    body = textwrap.dedent(tensors).strip("\n")
    first = use or body.split(":")[0].strip()
    text = (f"seed: {seed}\n" if seed is not None else "") + "tensors:\n"
    text += textwrap.indent(body, "  ") + "\n" + NODES % first
    path = tmp_path / name
    path.write_text(text)
    return load_graph(path)


def arrays(graph) -> dict[str, np.ndarray]:
    return {t.name: leaf_array(t, graph.seed) for t in graph.leafs}


# --- each init ------------------------------------------------------------------------------
def test_every_init(tmp_path):
    graph = graph_of(tmp_path, """
        z:  {shape: [2, 3], init: zeros}
        zi: {shape: [4], dtype: i32}
        o:  {shape: [2, 3], dtype: f16, init: ones}
        f:  {shape: [3], init: full, value: -2.5}
        fi: {shape: [3], dtype: i32, init: full, value: 7}
        fn: {shape: [2], init: full, value: -.inf}
        ar: {shape: [2, 3], init: arange, start: 1, step: 0.5}
        ai: {shape: [2, 2], dtype: i32, init: arange, start: 10, step: -3}
        rn: {shape: [256, 256], init: randn, mean: 3, scale: 0.5}
        rh: {shape: [64, 64], dtype: f16, init: randn}
        un: {shape: [256, 256], init: uniform, low: -2, high: 6}
        ri: {shape: [1000], dtype: i32, init: randint, low: -3, high: 4}
        rf: {shape: [1000], init: randint, high: 2}
        v:  {shape: [2, 2], values: [[1, 2.5], [3, 4]]}
        vi: {shape: [3], dtype: i32, values: [1, -2, 2147483647]}
        """)
    a = arrays(graph)
    for t in graph.leafs:
        arr = a[t.name]
        assert arr.shape == t.shape and arr.dtype == t.np_dtype, t.name
        assert arr.flags.c_contiguous and arr.flags.writeable, t.name
    assert not a["z"].any() and not a["zi"].any() and a["zi"].dtype == np.int32
    assert (a["o"] == 1).all() and a["o"].dtype == np.float16
    assert (a["f"] == -2.5).all() and (a["fi"] == 7).all() and np.isneginf(a["fn"]).all()
    np.testing.assert_array_equal(a["ar"], [[1, 1.5, 2], [2.5, 3, 3.5]])
    np.testing.assert_array_equal(a["ai"], [[10, 7], [4, 1]])
    assert abs(a["rn"].mean() - 3) < 0.01 and abs(a["rn"].std() - 0.5) < 0.01
    assert abs(float(a["rh"].astype(np.float32).std()) - 1) < 0.05
    assert a["un"].min() >= -2 and a["un"].max() < 6 and abs(a["un"].mean() - 2) < 0.05
    assert set(np.unique(a["ri"])) == set(range(-3, 4))
    assert set(np.unique(a["rf"])) == {0.0, 1.0} and a["rf"].dtype == np.float32
    np.testing.assert_array_equal(a["v"], [[1, 2.5], [3, 4]])
    np.testing.assert_array_equal(a["vi"], [1, -2, 2**31 - 1])


def test_each_call_is_a_fresh_array(tmp_path):
    graph = graph_of(tmp_path, "x: {shape: [4]}")
    x = graph.tensor("x")
    first = leaf_array(x, graph.seed)
    first[:] = 0
    assert leaf_array(x, graph.seed).any()


# --- seeding --------------------------------------------------------------------------------
def test_same_seed_name_init_same_data(tmp_path):
    a = graph_of(tmp_path, "w: {shape: [8, 8], init: randn, scale: 0.1}", name="a.yaml")
    b = graph_of(tmp_path, "w: {shape: [8, 8], scale: 0.1}", name="b.yaml")
    np.testing.assert_array_equal(arrays(a)["w"], arrays(b)["w"])


def test_explicit_defaults_are_the_same_data(tmp_path):
    a = graph_of(tmp_path, "w: {shape: [16]}", name="a.yaml")
    b = graph_of(tmp_path, "w: {shape: [16], init: randn, mean: 0, scale: 1.0}", name="b.yaml")
    np.testing.assert_array_equal(arrays(a)["w"], arrays(b)["w"])


def test_reordering_and_adding_tensors_changes_nothing_else(tmp_path):
    a = graph_of(tmp_path, """
        w1: {shape: [8, 8]}
        w2: {shape: [8], init: uniform}
        i:  {shape: [8], dtype: i32, init: randint, high: 100}
        """, seed=3, name="a.yaml")
    b = graph_of(tmp_path, """
        extra: {shape: [1000]}
        i:  {shape: [8], dtype: i32, init: randint, high: 100}
        w2: {shape: [8], init: uniform}
        more: {shape: [8], init: uniform}
        w1: {shape: [8, 8]}
        """, seed=3, name="b.yaml", use="w1")
    da, db = arrays(a), arrays(b)
    for name in ("w1", "w2", "i"):
        np.testing.assert_array_equal(da[name], db[name])
    assert not np.array_equal(db["w2"], db["more"])   # the name seeds it


def test_seed_name_and_keys_each_change_the_data(tmp_path):
    base = arrays(graph_of(tmp_path, "w: {shape: [32]}", seed=1, name="a.yaml"))["w"]
    other_seed = arrays(graph_of(tmp_path, "w: {shape: [32]}", seed=2, name="b.yaml"))["w"]
    other_name = arrays(graph_of(tmp_path, "v: {shape: [32]}", seed=1, name="c.yaml"))["v"]
    other_mean = arrays(graph_of(tmp_path, "w: {shape: [32], mean: 1}", seed=1,
                                 name="d.yaml"))["w"]
    for other in (other_seed, other_name, other_mean):
        assert not np.array_equal(base, other)


def test_dtype_only_rounds_the_same_draws(tmp_path):
    a = arrays(graph_of(tmp_path, "w: {shape: [64]}", name="a.yaml"))["w"]
    b = arrays(graph_of(tmp_path, "w: {shape: [64], dtype: f16}", name="b.yaml"))["w"]
    np.testing.assert_array_equal(a.astype(np.float16), b)


def test_data_seed_is_stable():
    """A sha256 of canonical JSON: the same on every platform and Python version."""
    keys = {"mean": 0.0, "scale": 1.0}
    assert data_seed(0, "w", "randn", keys) == data_seed(0, "w", "randn", dict(reversed(
        list(keys.items()))))
    canonical = b'{"init":"randn","keys":{"mean":0.0,"scale":1.0},"name":"w","seed":0}'
    pinned = int.from_bytes(hashlib.sha256(canonical).digest()[:16], "little")
    assert data_seed(0, "w", "randn", keys) == pinned == 228755888354055098364765613966128121043


# --- files ----------------------------------------------------------------------------------
def test_file_data(tmp_path):
    want = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "c.npy", want)
    np.save(tmp_path / "f.npy", np.asfortranarray(want))
    np.save(tmp_path / "big.npy", want.astype(">f4"))
    np.save(tmp_path / "ids.npy", np.array([3, 1], dtype=np.int32))
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "sub" / "h.npy", want.astype(np.float16))
    graph = graph_of(tmp_path, """
        c: {shape: [2, 3], file: c.npy}
        f: {shape: [2, 3], file: f.npy}
        big: {shape: [2, 3], file: big.npy}
        ids: {shape: [2], dtype: i32, file: ids.npy}
        h: {shape: [2, 3], dtype: f16, file: sub/h.npy}
        """)
    a = arrays(graph)
    for name in ("c", "f", "big"):
        np.testing.assert_array_equal(a[name], want)
        assert a[name].flags.c_contiguous and a[name].dtype == np.dtype("=f4")
    np.testing.assert_array_equal(a["ids"], [3, 1])
    assert a["h"].dtype == np.float16


def test_file_changed_after_loading(tmp_path):
    np.save(tmp_path / "c.npy", np.zeros((2, 3), np.float32))
    graph = graph_of(tmp_path, "c: {shape: [2, 3], file: c.npy}")
    np.save(tmp_path / "c.npy", np.zeros((2, 3), np.float64))
    with pytest.raises(InputError) as info:
        leaf_array(graph.tensor("c"), graph.seed)
    message = str(info.value)
    assert "tensor 'c'" in message and "c.npy" in message and "holds float64" in message


def test_npz_is_not_npy(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros(2, np.float32))
    with pytest.raises(InputError, match="is not a .npy file"):
        load_npy(tmp_path / "a.npz", (2,), "f32")


# --- run --input NAME=FILE.npy ------------------------------------------------------------
@pytest.fixture
def input_graph(tmp_path):
    return graph_of(tmp_path, """
        x: {shape: [2, 3], role: input}
        ids: {shape: [4], dtype: i32, role: input}
        w: {shape: [2, 3]}
        """)


def test_input_override(tmp_path, input_graph):
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    tensor, arr = load_input_override(input_graph, f"x={tmp_path / 'x.npy'}")
    assert tensor is input_graph.tensor("x")
    np.testing.assert_array_equal(arr, np.ones((2, 3)))


@pytest.mark.parametrize("make, spec, expect", [
    (None, "x", "expected NAME=FILE.npy"),
    (None, "=x.npy", "expected NAME=FILE.npy"),
    (None, "q={dir}/x.npy", "no tensor 'q' in the graph; its inputs: x, ids"),
    (None, "w={dir}/x.npy", "'w' is a weight, not a graph input; --input sets role: input "
                            "tensors: x, ids"),
    (None, "out={dir}/x.npy", "'out' is a node"),
    (None, "x={dir}/none.npy", "not found"),
    (lambda: np.zeros((2, 3)), "x={dir}/x.npy", "holds float64, expected float32 (f32); "
                                                "convert with arr.astype(np.float32)"),
    (lambda: np.zeros(4, np.int64), "ids={dir}/x.npy", "expected int32 (i32)"),
    (lambda: np.zeros((3, 2), np.float32), "x={dir}/x.npy",
     "has shape [3, 2], expected [2, 3]"),
    ("pickle", "x={dir}/x.npy", "is not a .npy file"),
    ("objects", "x={dir}/x.npy", "Python objects"),
])
def test_bad_input_override(tmp_path, input_graph, make, spec, expect):
    target = tmp_path / "x.npy"
    if make == "pickle":
        target.write_bytes(pickle.dumps(np.zeros((2, 3), np.float32)))
    elif make == "objects":
        np.save(target, np.array([None, 1], dtype=object), allow_pickle=True)
    elif make is not None:
        np.save(target, make())
    with pytest.raises(InputError) as info:
        load_input_override(input_graph, spec.format(dir=tmp_path))
    message = str(info.value)
    assert expect in message and "\n" not in message
    assert "--input" in message
    assert info.value.exit_code == 2
