"""Tensor and Graph: pure data, the shared language of every layer.

A `Tensor` is ggml's `ggml_tensor` without the memory: shape, dtype and byte strides (NumPy
order), the op that makes it and its sources, and, for views, the root tensor whose bytes it
aliases (`view_src`, never itself a view, as in ggml) with a byte offset into it. Leafs
(weights and inputs) have no op. Nothing here computes or allocates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.ir.types import TYPES, GgmlType

MAX_DIMS = 4


def contiguous_strides(shape: tuple[int, ...], item: int, block: int = 1) -> tuple[int, ...]:
    """ggml's nb in NumPy order: the innermost dim counts blocks of `block` elements."""
    strides, step = [], item
    for i, dim in enumerate(reversed(shape)):
        strides.append(step)
        step *= dim // block if i == 0 else dim
    return tuple(reversed(strides))


def span_bytes(shape: tuple[int, ...], strides: tuple[int, ...], item: int, block: int = 1) -> int:
    """Bytes from a tensor's first element to the end of its last (ggml_nbytes)."""
    end = item
    last = len(shape) - 1
    for i, (d, s) in enumerate(zip(shape, strides)):
        if d == 0:
            return 0
        end += ((d // block if i == last else d) - 1) * s
    return end


_LAYOUTS: dict = {}        # (shape, dtype) -> (shape as ints, contiguous strides)
MAX_LAYOUTS = 4096         # a big graph has a few dozen distinct shapes; a search makes more


def contiguous_layout(shape, dtype: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A contiguous tensor's shape (as ints) and strides, remembered: a graph of 100k nodes
    repeats a few shapes, and this was a fifth of the time each node took to build. A key that
    compares equal (2 and 2.0) gives the same ints, so the cache changes no result."""
    try:
        return _LAYOUTS[shape if type(shape) is tuple else tuple(shape), dtype]
    except (KeyError, TypeError):
        pass
    ints = tuple(map(int, shape))
    gtype = TYPES[dtype]
    layout = ints, contiguous_strides(ints, gtype.type_size, gtype.block_size)
    if len(_LAYOUTS) >= MAX_LAYOUTS:
        _LAYOUTS.clear()
    try:
        _LAYOUTS[tuple(shape), dtype] = layout
    except TypeError:          # an unhashable dim (the conversion above took it): not kept
        pass
    return layout


@dataclass
class LeafData:
    """Where a leaf's values come from: exactly one of init / values / file."""

    init: str | None = None
    keys: dict = field(default_factory=dict)     # init keys: scale, low, high, value, ...
    values: list | None = None
    file: Path | None = None


@dataclass(eq=False, slots=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str = "f32"
    strides: tuple[int, ...] = ()
    op: str | None = None                 # None for leafs and scheduler copies
    src: list["Tensor"] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    view_src: "Tensor | None" = None      # root tensor whose bytes this one aliases
    view_offset: int = 0                  # bytes into view_src
    role: str | None = None               # leafs: "weight" | "input"; copies: "copy"
    backend: str | None = None            # weights: buffer location; others: a user pin
    data: LeafData | None = None          # leafs only
    is_output: bool = False
    line: int | None = None               # YAML line, for error messages
    index: int = -1                       # row in the tables of the pass that last numbered it

    def __post_init__(self):
        if self.strides:
            self.shape = tuple(map(int, self.shape))
            self.strides = tuple(map(int, self.strides))
            return
        self.shape, self.strides = contiguous_layout(self.shape, self.dtype)

    # --- derived facts -------------------------------------------------------------------
    @property
    def is_leaf(self) -> bool:
        return self.op is None and self.role != "copy"

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def gtype(self) -> GgmlType:
        return TYPES[self.dtype]

    @property
    def np_dtype(self) -> np.dtype:
        """NumPy's dtype for plain types; block types and bf16 have none."""
        return TYPES[self.dtype].numpy

    @property
    def itemsize(self) -> int:
        """Bytes per element, or per block for block types (ggml's nb[0])."""
        return TYPES[self.dtype].type_size

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        gtype = TYPES[self.dtype]
        return span_bytes(self.shape, self.strides, gtype.type_size, gtype.block_size)

    @property
    def is_contiguous(self) -> bool:
        return self.strides == contiguous_layout(self.shape, self.dtype)[1]

    def same_layout(self, other: "Tensor") -> bool:
        """ggml_are_same_layout: the condition for one tensor to take another's slot."""
        return (self.dtype, self.shape, self.strides) == (other.dtype, other.shape, other.strides)

    def describe(self) -> str:
        kind = "tensor" if self.is_leaf else "node"
        return f"{kind} '{self.name}'"

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {list(self.shape)}, {self.dtype}, op={self.op})"


@dataclass
class Graph:
    name: str
    leafs: list[Tensor]                   # file order
    nodes: list[Tensor]                   # execution order
    outputs: list[Tensor]
    seed: int = 0
    backends: list | None = None          # BackendSpec list from the file, if it gave one
    path: Path | None = None
    backends_line: int | None = None
    # the leafs are in ggml's own graph order (ggml_visit_parents from the roots, as a model's
    # builder expands them), not a file's: ggml 0.25.3's allocator places them in that order
    ggml_leaf_order: bool = False

    def __post_init__(self):
        self._by_name = {t.name: t for t in self.leafs + self.nodes}

    def tensor(self, name: str) -> Tensor:
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    @property
    def inputs(self) -> list[Tensor]:
        return [t for t in self.leafs if t.role == "input"]

    @property
    def weights(self) -> list[Tensor]:
        return [t for t in self.leafs if t.role == "weight"]
