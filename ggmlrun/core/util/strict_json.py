"""JSON every parser takes, without NumPy: `--json` output of commands that never touch an
array (fit, measure) must not pay NumPy's import; NumPy scalars, where a command has them, are
turned into numbers through their own `.item()`."""

from __future__ import annotations

import json
import math


def strict_json(data, **options) -> str:
    """JSON every parser takes: NaN and infinities become the strings "nan", "inf", "-inf"
    (docs/format.md), since bare NaN/Infinity are not JSON."""
    return json.dumps(_finite(data), allow_nan=False, default=json_default, **options)


def _finite(value):
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def json_default(value):
    """NumPy scalars as JSON numbers (json.dumps `default=`)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
