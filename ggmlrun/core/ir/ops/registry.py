"""The op registry: one `OpSpec` per op, and `make_node`, the one way a node comes to be.

Each op is small (ONNX reference style): a shape/dtype rule, a NumPy kernel that writes into
the output's memory, ggml's in-place flag and a FLOP count. Params become keyword arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.util.numbers import INT64_MAX, MAX_BYTES
from ggmlrun.core.util.fmt import exact_key
from ggmlrun.core.ir.graph import Tensor

REQUIRED = object()  # marks a param without a default
MAX_NODE_BYTES = MAX_BYTES   # 1 EiB: ggml's sizes are size_t and its element counts int64


def _check_size(result: "OpResult") -> None:
    """Every node's size is bounded at load, as every leaf's is: a rule multiplies sizes
    (repeat, mul_mat, concat), and a result of 2**160 elements would pass validate only to
    overflow an int64 in measure."""
    from ggmlrun.core.ir.types import TYPES
    from ggmlrun.core.util.fmt import shape_text

    gtype = TYPES.get(result.dtype)
    if gtype is None:
        return
    nbytes = gtype.contiguous_bytes(result.shape)
    if nbytes > MAX_NODE_BYTES or math.prod(result.shape) > INT64_MAX:
        raise InputError(f"result shape {shape_text(result.shape)} {result.dtype} is "
                         f"{nbytes} bytes, over ggml's limit of {MAX_NODE_BYTES} (1 EiB) "
                         f"per tensor")


@dataclass
class OpResult:
    """What an op's shape rule decides about its output."""

    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...] | None = None   # None: contiguous
    view_of: int | None = None               # index of the source whose bytes it aliases
    view_offset: int = 0                     # bytes, relative to that source's first byte


@dataclass(frozen=True)
class OpSpec:
    name: str
    n_src: tuple[int, int]                   # (min, max) number of sources
    infer: Callable[..., OpResult]           # infer(srcs: list[Tensor], **params)
    kernel: Callable[..., None] | None       # kernel(out, *src_arrays, **params); None: no compute
    params: dict[str, Any] = field(default_factory=dict)   # name -> default or REQUIRED
    inplace: bool = False                    # ggml_op_can_inplace
    view_op: bool = False                    # ggml_is_view_op: owns no memory, computes nothing
    flops: Callable[[Tensor, list[Tensor]], int] | None = None   # None: one per output element
    summary: str = ""

    def count_flops(self, out: Tensor, srcs: list[Tensor]) -> int:
        if self.view_op:
            return 0
        return self.flops(out, srcs) if self.flops else out.n_elements


OPS: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    assert spec.name not in OPS, spec.name
    OPS[spec.name] = spec
    return spec


def get_op(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        raise InputError(f"unknown op '{name}'; {did_you_mean(str(name), OPS, ask=True)}") from None


def resolve_params(spec: OpSpec, given: dict | None) -> dict:
    """The op's params in its own order: the given ones, the defaults for the rest."""
    params = dict(spec.params)
    if given:
        for key, value in dict(given).items():
            if key not in params:
                known = "known: " + ", ".join(spec.params) if spec.params else "it takes none"
                raise InputError(f"{spec.name}: unknown param '{key}'; {known}")
            params[key] = value
    for key, value in params.items():
        if value is REQUIRED:
            raise InputError(f"{spec.name}: missing required param '{key}'")
    return params


_RULES: dict = {}          # rule key -> (spec, OpResult): what a node like this one came to
MAX_RULES = 4096           # a big graph repeats a few dozen kinds of node; a search makes more


def _rule_key(op, srcs, params) -> tuple | None:
    """What an op's shape rule reads: the op, each source's layout and the params (see
    `exact_key`). None when a param is of a kind that key leaves out: not remembered."""
    key = [op]
    for src in srcs:
        key += src.shape, src.dtype, src.strides
    if params:
        params_key = exact_key(params)
        if params_key is None:
            return None
        key.append(params_key)
    return tuple(key)


def make_node(name: str, op: str, srcs: list[Tensor], params: dict | None = None, *,
              backend: str | None = None, line: int | None = None) -> Tensor:
    """Check and build one node; errors name the node (the loader adds file and line). A node
    like one built before (same op, source layouts and params) reuses its rule's answer: the
    rules are pure functions of those, and a 10k-node graph has a few dozen kinds of node."""
    key = _rule_key(op, srcs, params) if type(op) is str else None
    try:
        known = _RULES.get(key) if key is not None else None
    except TypeError:          # a source whose layout is not hashable: asked, not remembered
        key = known = None
    if known is not None and known[0] is OPS.get(op):
        spec, result = known
        resolved = {**spec.params, **params} if params else dict(spec.params)
    else:
        try:
            spec = get_op(op)
            lo, hi = spec.n_src
            if not lo <= len(srcs) <= hi:
                want = f"{lo}" if lo == hi else f"{lo} to {hi}"
                raise InputError(f"{op} takes {want} sources, got {len(srcs)}")
            resolved = resolve_params(spec, params)
            result = spec.infer(srcs, **resolved)
            _check_size(result)
        except InputError as err:
            raise err.located(line=line, culprit=f"node '{name}'")
        if key is not None:
            if len(_RULES) >= MAX_RULES:
                _RULES.clear()
            _RULES[key] = spec, result
    node = Tensor(name=name, shape=result.shape, dtype=result.dtype,
                  strides=result.strides or (), op=op, src=list(srcs), params=resolved,
                  backend=backend, line=line)
    if result.view_of is not None:
        parent = srcs[result.view_of]
        root = parent.view_src or parent
        node.view_src = root
        node.view_offset = parent.view_offset + result.view_offset
    return node
