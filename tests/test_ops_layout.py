"""Layout ops: repeat, concat, cont, cpy, and the views' shape/stride/offset rules.

View results are read back the way the executor would: an ndarray over the root's bytes at
the node's view_offset with its strides (np.ndarray also bounds-checks that)."""

from __future__ import annotations

import numpy as np
import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.ir.ops import make_node
from opkit import leaf_for, node_for, randn, run, scattered

F16, F32, I32 = np.float16, np.float32, np.int32


def read_view(root: np.ndarray, node) -> np.ndarray:
    assert root.flags.c_contiguous
    return np.ndarray(node.shape, root.dtype, buffer=root, offset=node.view_offset,
                      strides=node.strides)


# --- repeat --------------------------------------------------------------------------------

@pytest.mark.parametrize("ashape,shape", [((2, 3), (4, 6)), ((3,), (2, 5, 3)),
                                          ((2, 1, 3), (2, 4, 2, 3)), ((2, 3), (2, 3))])
def test_repeat(ashape, shape):
    a = randn(*ashape)
    got = run("repeat", [scattered(a)], {"shape": list(shape)})
    a_full = a.reshape((1,) * (len(shape) - a.ndim) + a.shape)
    np.testing.assert_array_equal(got, np.tile(a_full, [n // m for n, m in
                                                         zip(shape, a_full.shape)]))
    i = np.arange(6, dtype=I32).reshape(2, 3)
    assert run("repeat", [i], {"shape": [2, 6]}).tolist() == [[0, 1, 2, 0, 1, 2],
                                                               [3, 4, 5, 3, 4, 5]]


@pytest.mark.parametrize("shape,msg", [([4, 5], "does not tile"), ([3], "does not tile"),
                                       ([2, 0], ">= 1"), ([1, 1, 1, 2, 3], "1 to 4 dims"),
                                       (6, "list of integers"), ([2.0, 3], "list of integers")])
def test_repeat_errors(shape, msg):
    with pytest.raises(InputError, match=msg):
        node_for("repeat", [randn(2, 3)], {"shape": shape})


# --- concat --------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat(axis):
    a = randn(2, 3, 4)
    shape_b = list(a.shape)
    shape_b[axis] = 5
    b = randn(*shape_b)
    got = run("concat", [scattered(a), scattered(b)], {"axis": axis})
    ax = axis % 3
    want = np.empty(got.shape, F32)
    cut = [slice(None)] * 3
    cut[ax] = slice(0, a.shape[ax])
    want[tuple(cut)] = a
    cut[ax] = slice(a.shape[ax], None)
    want[tuple(cut)] = b
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("srcs,axis,msg", [
    ([randn(2, 3), randn(2, 3).astype(F16)], 0, "same dtype"),
    ([randn(2, 3), randn(3)], 0, "differ in rank"),
    ([randn(2, 3), randn(3, 3)], 1, "every dim but axis 1"),
    ([randn(2, 3), randn(2, 3)], 2, "out of range"),
    ([randn(2, 3), randn(2, 3)], True, "must be an integer"),
])
def test_concat_errors(srcs, axis, msg):
    with pytest.raises(InputError, match=msg):
        node_for("concat", srcs, {"axis": axis})


# --- cont ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F16, I32])
def test_cont(dtype):
    x = (randn(3, 4, 5) * 10).astype(dtype)
    src = scattered(x).transpose(2, 0, 1)
    got = run("cont", [src])
    assert got.flags.c_contiguous and got.dtype == dtype
    np.testing.assert_array_equal(got, x.transpose(2, 0, 1))


# --- cpy -----------------------------------------------------------------------------------

def test_cpy_writes_into_b_in_logical_order_converting_dtype():
    a = randn(2, 3, 4)
    root = np.zeros((4, 6), F16)
    b_leaf = leaf_for("b", root)
    b_view = make_node("bt", "transpose", [b_leaf])                     # [6, 4] view
    node = make_node("c", "cpy", [leaf_for("a", a), b_view])
    assert node.shape == (6, 4) and node.dtype == "f16"
    assert node.strides == b_view.strides and node.view_src is b_leaf
    assert node.view_offset == 0
    out = read_view(root, node)
    from ggmlrun.core.ir.ops import get_op
    get_op("cpy").kernel(out, scattered(a), out, **node.params)
    np.testing.assert_array_equal(root.T.reshape(-1), a.reshape(-1).astype(F16))


def test_cpy_to_i32_and_count_check():
    a = np.array([[1.7, -2.2], [3.0, 40.9]], F32)
    b = np.zeros(4, I32)
    run("cpy", [a, b], out=b)
    assert b.tolist() == [1, -2, 3, 40]
    with pytest.raises(InputError, match="has 6 elements but b"):
        node_for("cpy", [randn(2, 3), randn(5)])


# --- views ---------------------------------------------------------------------------------

def test_view_default_contiguous_and_offset():
    x = randn(4, 6)
    node = node_for("view", [x], {"shape": [2, 6], "offset": 24})
    assert node.strides == (24, 4) and node.view_offset == 24
    np.testing.assert_array_equal(read_view(x, node), x.reshape(-1)[6:18].reshape(2, 6))


def test_view_with_strides_may_overlap():
    x = np.arange(13, dtype=F32)     # 12 elements from byte 4 end at its last byte (ggml's bound)
    node = node_for("view", [x], {"shape": [4, 3], "strides": [8, 4], "offset": 4})
    assert node.shape == (4, 3) and node.strides == (8, 4)
    want = [[1 + 2 * i + j for j in range(3)] for i in range(4)]
    assert read_view(x, node).tolist() == want


@pytest.mark.parametrize("params,msg", [
    ({"shape": [4, 3], "strides": [8, 4], "offset": 8}, "past the end"),
    ({"shape": [11]}, "past the end"),
    ({"shape": [2], "offset": 36}, "past the end"),
    ({"shape": [2], "offset": -4}, "'offset' must be >= 0"),
    ({"shape": [2, 2], "strides": [-4, 4]}, ">= 0 bytes"),
    ({"shape": [2, 2], "strides": [4]}, "differ in length"),
    ({"shape": [2], "offset": False}, "'offset' must be an integer"),
    ({"shape": [-1]}, ">= 0"),          # zero-element views are ggml's (llama.cpp's build_rs)
])
def test_view_errors(params, msg):
    with pytest.raises(InputError, match=msg):
        node_for("view", [np.zeros(10, F32)], params)


def test_view_chain_accumulates_offset_on_the_root():
    x = np.arange(24, dtype=F32).reshape(4, 6)
    root = leaf_for("x", x)
    v1 = make_node("v1", "view", [root], {"shape": [3, 6], "offset": 24})
    v2 = make_node("v2", "view", [v1], {"shape": [2, 2], "offset": 8, "strides": [24, 4]})
    assert v2.view_src is root and v2.view_offset == 32
    assert read_view(x, v2).tolist() == [[8, 9], [14, 15]]
    with pytest.raises(InputError, match="past the end"):
        make_node("v3", "view", [v1], {"shape": [19]})        # from byte 24: past x's end


def test_a_view_of_a_view_is_bounded_by_the_root_as_ggml_bounds_it():
    """ggml resolves a view of a view to the root and bounds it there (ggml_new_tensor_impl):
    llama.cpp's deepstack views reach past their source, an n_embd-wide view of padded rows
    (qwen3vl), into the padding."""
    x = np.arange(24, dtype=F32).reshape(2, 12)
    first = make_node("embd", "view", [leaf_for("x", x)],
                      {"shape": [2, 4], "strides": [48, 4]})
    assert first.nbytes == 64
    ds = make_node("ds", "view", [first], {"shape": [2, 4], "strides": [48, 4], "offset": 32})
    assert ds.view_offset == 32 and read_view(x, ds).tolist() == [[8, 9, 10, 11],
                                                                  [20, 21, 22, 23]]
    with pytest.raises(InputError, match="past the end"):
        make_node("v", "view", [first], {"shape": [2, 4], "strides": [48, 4], "offset": 36})


def test_view_of_a_permuted_source_stays_within_its_span():
    x = np.arange(6, dtype=F32).reshape(2, 3)
    t = make_node("t", "transpose", [leaf_for("x", x)])
    assert t.nbytes == 24
    make_node("v", "view", [t], {"shape": [6]})
    with pytest.raises(InputError, match="past the end"):
        make_node("v", "view", [t], {"shape": [7]})


def test_reshape():
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    node = node_for("reshape", [x], {"shape": [4, -1]})
    assert node.shape == (4, 6) and node.strides == (24, 4) and node.view_offset == 0
    np.testing.assert_array_equal(read_view(x, node), x.reshape(4, 6))
    root = leaf_for("x", x)
    t = make_node("t", "transpose", [root])
    with pytest.raises(InputError, match="not contiguous"):
        make_node("r", "reshape", [t], {"shape": [24]})
    for shape, msg in [([-1, -1, 6], "at most one -1"), ([5, -1], "cannot fit"),
                       ([5, 5], "has 24 elements"), ([0, 24], ">= 1"),
                       ([1, 1, 1, 4, 6], "1 to 4 dims")]:
        with pytest.raises(InputError, match=msg):
            node_for("reshape", [x], {"shape": shape})


@pytest.mark.parametrize("axes", [[2, 0, 1], [1, 0, 2], [0, 1, 2], [-1, 0, -2]])
def test_permute_is_numpy_transpose(axes):
    x = np.arange(24, dtype=F16).reshape(2, 3, 4)
    node = node_for("permute", [x], {"axes": axes})
    want = x.transpose(axes)
    assert node.shape == want.shape and node.strides == want.strides
    np.testing.assert_array_equal(read_view(x, node), want)


@pytest.mark.parametrize("axes", [[0, 0, 1], [0, 1], [0, 1, 3], "012", [0, 1, 2.0]])
def test_permute_errors(axes):
    with pytest.raises(InputError, match="'axes'|permutation"):
        node_for("permute", [randn(2, 3, 4)], {"axes": axes})


def test_transpose():
    x = np.arange(120, dtype=I32).reshape(2, 3, 4, 5)
    node = node_for("transpose", [x])
    want = np.swapaxes(x, -1, -2)
    assert node.shape == want.shape and node.strides == want.strides
    np.testing.assert_array_equal(read_view(x, node), want)
    with pytest.raises(InputError, match="2 to 4 dims"):
        node_for("transpose", [randn(3)])
