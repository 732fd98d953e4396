"""Kernels on quantized weights: mul_mat and get_rows at a 7B layer's matrix size.

Prints, per weight type, the time of one mul_mat [4096, 4096] weight x [N, 4096] and of
get_rows picking 32 rows of a [32000, 4096] table, both including the decoding ggmlrun does on
every call (no cache). Figures only; nothing is asserted.
"""

from __future__ import annotations

import numpy as np

from _common import best_of, machine
from gguf import quants as gq
from gguf.constants import GGMLQuantizationType as Q

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.ir.ops.quant import storage_view
from ggmlrun.core.ir.types import TYPES


def typed(raw: np.ndarray, name: str, shape):
    leaf = Tensor(name="w", shape=shape, dtype=name, role="weight")
    buf = np.frombuffer(np.ascontiguousarray(raw).tobytes(), np.uint8).copy()
    return storage_view(buf, 0, leaf.shape, leaf.strides, TYPES[name])


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"# bench_quant: {machine()}")
    m = k = 4096
    weights = rng.standard_normal((m, k), dtype=np.float32) * 0.02
    table = rng.standard_normal((8192, k), dtype=np.float32)
    for name in ("q8_0", "q4_0", "q5_1"):
        a = typed(gq.quantize(weights, Q[name.upper()]), name, (m, k))
        rows = typed(gq.quantize(table, Q[name.upper()]), name, (8192, k))
        for n in (1, 32):
            b = rng.standard_normal((n, k), dtype=np.float32)
            out = np.empty((n, m), np.float32)
            t = best_of(lambda: get_op("mul_mat").kernel(out, a, b), 3)
            print(f"mul_mat {name:5s} [{m}x{k}] x [{n}x{k}]: {t * 1e3:8.1f} ms")
        idx = rng.integers(0, 8192, 32).astype(np.int32)
        out = np.empty((32, k), np.float32)
        t = best_of(lambda: get_op("get_rows").kernel(out, rows, idx), 5)
        print(f"get_rows {name:5s} 32 rows of [8192x{k}]: {t * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
