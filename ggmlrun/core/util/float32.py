"""C's float, without NumPy: llama.cpp computes some decisions (the layer split) in float32,
and `fit` must not pay NumPy's import (a tenth of a second) to round the same way.

Each IEEE operation on two float32 values carried out in double and rounded once to float32
gives the float32 operation's own result (double has more than 2 x 24 + 2 bits of mantissa),
so `f32(a + b)` and `f32(a / b)` are C's float arithmetic on float32 a and b."""

from __future__ import annotations

import math
from array import array


def f32(x: float) -> float:
    """x rounded to the nearest float32 (out of range: +-inf, as C's cast and NumPy give)."""
    return array("f", (x,))[0]


def f32_div(a: float, b: float) -> float:
    """a / b in float32, with IEEE's answers for a zero divisor (inf, or NaN for 0 / 0)."""
    if b != 0:
        return f32(a / b)
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)      # b is +0.0 or -0.0
