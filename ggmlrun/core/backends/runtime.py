"""Backends at run time: real byte arenas, and the cost model a simulated device reports.

Each backend owns two NumPy byte buffers: its weights and its compute arena (sized by the
measure pass). Every tensor is an ndarray view into one of them at its planned offset, so a
wrong plan gives wrong numbers. A `sim` backend computes with the same kernels as the CPU; what
makes it a device is that its memory is its own (nothing reads it without a copy) and that it
reports modeled times from its `flops`, `mem_bw`, `link_bw` and `link_latency`.
"""

from __future__ import annotations

import numpy as np

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops.quant import needs_storage_view, storage_view


def aligned_bytes(size: int, alignment: int) -> np.ndarray:
    """A zeroed uint8 buffer whose first byte sits on `alignment` (as a backend buffer would)."""
    raw = np.zeros(size + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + size]


def strided_view(buffer: np.ndarray, offset: int, tensor: Tensor) -> np.ndarray:
    if needs_storage_view(tensor.gtype):     # bf16, block types: raw storage, typed
        return storage_view(buffer, offset, tensor.shape, tensor.strides, tensor.gtype)
    return np.ndarray(tensor.shape, dtype=tensor.np_dtype, buffer=buffer, offset=offset,
                      strides=tensor.strides)


class Backend:
    def __init__(self, spec: BackendSpec, arena_bytes: int, weights_bytes: int):
        self.spec = spec
        self.arena = aligned_bytes(arena_bytes, spec.alignment)
        self.weights = aligned_bytes(weights_bytes, spec.alignment)

    @property
    def name(self) -> str:
        return self.spec.name
