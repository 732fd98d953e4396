"""Helpers for the op tests: build leafs from arrays, run one op's kernel, make odd layouts."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.types import type_name
from ggmlrun.core.ir.ops import get_op, make_node

RNG = np.random.default_rng(1234)


def leaf_for(name: str, arr: np.ndarray, layout: bool = True) -> Tensor:
    """A leaf of arr's shape and dtype; with `layout`, its strides too (else contiguous)."""
    return Tensor(name=name, shape=arr.shape, dtype=type_name(arr.dtype),
                  strides=arr.strides if layout else (), role="input")


def node_for(op: str, arrays, params=None, name="n", layout: bool = True) -> Tensor:
    leafs = [leaf_for(f"s{i}", a, layout) for i, a in enumerate(arrays)]
    return make_node(name, op, leafs, params)


def run(op: str, arrays, params=None, out=None) -> np.ndarray:
    """Infer (from contiguous leafs of the arrays' shapes and types: ggml's layout rules are
    the shape rule's business, tests/test_contract.py), allocate a fresh contiguous out
    (unless given), run the kernel on the arrays as they are laid out, return out."""
    node = node_for(op, arrays, params, layout=False)
    spec = get_op(op)
    if out is None:
        out = np.empty(node.shape, node.np_dtype)
    assert out.shape == node.shape and out.dtype == node.np_dtype
    spec.kernel(out, *arrays, **node.params)
    return out


def scattered(x: np.ndarray, offset_items: int = 1) -> np.ndarray:
    """x's values in a non-contiguous layout: column-major, every other element, offset.

    Built with as_strided on a byte buffer, the way the executor sees arena views.
    """
    x = np.asarray(x)
    item = x.itemsize
    strides, step = [], 2 * item
    for dim in x.shape:
        strides.append(step)
        step *= dim
    total = offset_items * item + 2 * item * max(x.size, 1) + item
    buf = np.zeros(total, np.uint8)
    base = buf[: total - total % item].view(x.dtype)
    arr = as_strided(base[offset_items:], x.shape, tuple(strides))
    arr[...] = x
    assert not arr.flags.c_contiguous or x.size <= 1
    return arr


def randn(*shape, dtype=np.float32, scale=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)
