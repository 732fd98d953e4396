"""One reading of numeric fields for every file and option: integers that fit int64 and their
field's range, finite floats, and MAX_BYTES, the bound on every size (`parse_size` in
frontend/backends_file.py reads sizes with units and checks it). A number out of range is the
user's mistake, so it is an error naming the field (exit 2), never an OverflowError in NumPy.
"""

from __future__ import annotations

import math
import re

from ggmlrun.core.util.fmt import clip

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_BYTES = 1 << 60            # 1 EiB: no memory, tensor or buffer is larger


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked_int(value, field: str, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """`value` as an int in [low, high]; a text that int() reads is accepted (CSV fields)."""
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        if len(text) > 40 or not re.fullmatch(r"[-+]?[0-9]+", text):
            raise ValueError(f"{field}: '{clip(value, 40)}' is not an integer")
        value = int(text)
    if not _is_int(value):
        raise ValueError(f"{field} must be an integer, got {clip(value, 40)}")
    if not low <= value <= high:
        shown = str(value) if abs(value) < 10**30 else f"about 2**{value.bit_length()}"
        if value < 0 <= low:
            raise ValueError(f"{field} {shown} is negative; it must be from {low} to {high}")
        raise ValueError(f"{field} {shown} is out of range; it must be from {low} to {high}")
    return value


def checked_float(value, field: str, low: float = -math.inf, high: float = math.inf) -> float:
    """`value` as a finite float in [low, high]."""
    try:
        number = float(value.replace("_", "") if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{field} must be a number, got {clip(value, 40)}") from None
    if isinstance(value, bool) or not math.isfinite(number):
        raise ValueError(f"{field} must be a finite number, got {clip(value, 40)}")
    if number < low or number > high:
        raise ValueError(f"{field} {number:g} is out of range; it must be from {low:g} to {high:g}")
    return number

