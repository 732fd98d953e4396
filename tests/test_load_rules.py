"""make_node remembers a shape rule's answer for a node like one built before: a remembered
answer must never stand in for a node whose params or sources differ in a way the rule sees."""

from __future__ import annotations

import pytest

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import make_node
from ggmlrun.core.ir.ops import registry
from ggmlrun.core.util.errors import InputError


@pytest.fixture(autouse=True)
def fresh_rules():
    registry._RULES.clear()
    yield
    registry._RULES.clear()


def outcome(op, srcs, params):
    try:
        node = make_node("n", op, srcs, params)
    except InputError as err:
        return "error: " + str(err)
    return node.shape, node.strides, node.dtype, node.view_offset, node.params


@pytest.mark.parametrize("op, srcs, first, second", [
    ("scale", [(4, 8)], {"s": 1}, {"s": True}),            # equal keys, not equal params
    ("scale", [(4, 8)], {"s": 1.0}, {"s": True}),
    ("scale", [(4, 8)], {"s": 0.0}, {"s": -0.0}),
    ("reshape", [(4, 8)], {"shape": [8, 4]}, {"shape": [8.0, 4]}),
    ("reshape", [(4, 8)], {"shape": [8, 4]}, {"shape": [True, 32]}),
    ("reshape", [(4, 8)], {"shape": [8, 4]}, {"shape": [8, 4], "bogus": 1}),
    ("permute", [(2, 3, 4)], {"axes": [1, 0, 2]}, {"axes": [1, 0, 2, 3]}),
    ("add", [(4, 8), (4, 8)], None, None),
])
def test_a_remembered_rule_gives_what_the_rule_gives(op, srcs, first, second):
    tensors = [Tensor(name=f"t{i}", shape=shape) for i, shape in enumerate(srcs)]
    outcome(op, tensors, first)                                   # remembered, when it passes
    remembered = outcome(op, tensors, second)
    registry._RULES.clear()
    assert remembered == outcome(op, tensors, second)


def test_source_layout_is_part_of_the_key():
    x = Tensor(name="x", shape=(2, 3, 4))
    moved = make_node("m", "permute", [x], {"axes": [1, 0, 2]})
    plain = Tensor(name="p", shape=moved.shape)                 # same shape, other strides
    assert make_node("a", "permute", [moved], {"axes": [1, 0, 2]}).strides == x.strides
    again = make_node("b", "permute", [plain], {"axes": [1, 0, 2]})
    assert again.strides != x.strides and again.view_src is plain
    assert len(registry._RULES) == 3                            # x, moved, plain


def test_each_node_gets_its_own_params_and_sources():
    x = Tensor(name="x", shape=(4, 8))
    a = make_node("a", "reshape", [x], {"shape": [8, 4]})
    b = make_node("b", "reshape", [x], {"shape": [8, 4]})
    assert len(registry._RULES) == 1
    assert a.params == b.params and a.params is not b.params and a.src is not b.src


def test_a_replaced_op_is_asked_again(monkeypatch):
    x = Tensor(name="x", shape=(4, 8))
    make_node("a", "silu", [x])
    spec = registry.OPS["silu"]
    refusing = registry.OpSpec(name="silu", n_src=spec.n_src, kernel=None,
                               infer=lambda srcs: (_ for _ in ()).throw(InputError("no")))
    monkeypatch.setitem(registry.OPS, "silu", refusing)
    with pytest.raises(InputError, match="no"):
        make_node("b", "silu", [x])


def load(tmp_path, tensors: str, nodes: str = "  - {name: y, op: add, src: [a, b]}\n"):
    from ggmlrun.core.frontend.loader import load_graph
    path = tmp_path / "g.yaml"
    path.write_text(f"tensors:\n{tensors}nodes:\n{nodes}")
    return load_graph(path)


def test_leafs_with_one_spec_are_alike_but_their_own(tmp_path):
    g = load(tmp_path, "  a: {shape: [4, 8], init: randn, scale: 1}\n"
                       "  b: {shape: [4, 8], init: randn, scale: 1}\n"
                       "  c: {shape: [4, 8], init: randn, scale: 1.0}\n")
    a, b, c = g.leafs
    assert [t.line for t in g.leafs] == [2, 3, 4]
    assert a.data.keys == b.data.keys == c.data.keys == {"mean": 0.0, "scale": 1.0}
    assert a.data is not b.data and a.data.keys is not b.data.keys
    assert (a.shape, a.strides, a.dtype, a.role) == (b.shape, b.strides, b.dtype, b.role)


@pytest.mark.parametrize("second, message", [
    ("{shape: [4, 8], init: randn, scale: true}", "'scale' must be a number, got a boolean"),
    ("{shape: [4, 8.0], init: randn, scale: 1}", r"shape\[1\] must be an integer, got the number 8.0"),
    ("{shape: [4, 8], init: randn, scale: 1, 1: 2}", "unknown key"),
])
def test_a_leaf_unlike_a_valid_one_still_fails(tmp_path, second, message):
    from ggmlrun.core.util.errors import InputError
    with pytest.raises(InputError, match=message) as err:
        load(tmp_path, f"  a: {{shape: [4, 8], init: randn, scale: 1}}\n  b: {second}\n")
    assert err.value.line == 3 and "'b'" in str(err.value)
