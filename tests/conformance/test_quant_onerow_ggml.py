"""mul_mat by ONE row of b on quantized weights (ops/onerow.py: integer block sums, no
decoded panel) against real ggml, as test_llm_ops does for five rows."""

from __future__ import annotations

import numpy as np
import pytest

from ggmlrun.core.ir.ops import onerow

from .test_llm_ops import _compare, _weights

F32 = np.float32


@pytest.mark.parametrize("name", ["q8_0", "q4_0", "q4_K"])
@pytest.mark.parametrize("k", [256, 512])
def test_one_row_mul_mat_on_quantized_weights_equals_ggml(name, k, monkeypatch):
    monkeypatch.setattr(onerow, "MIN_VALUES", 0)          # small weights take the path too
    rng = np.random.default_rng(k + len(name))
    raw = _weights(name, 24, k, rng)
    b = rng.standard_normal((1, k)).astype(F32)
    _compare("mul_mat", [(raw, name), (b, "f32")], {}, 2e-6)
