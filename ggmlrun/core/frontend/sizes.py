"""Memory sizes as users write them ('8GiB', '512 MiB', bytes).

Its own module, apart from the backends file's reader (core/frontend/backends_file.py, which
re-exports these names): every command parses `--memory`, `--gpu` and `--ram` through here,
and the reader pulls in the YAML parser and the op registry, which `validate` of a model never
needs.
"""

from __future__ import annotations

import math
import re

from ggmlrun.core.util.fmt import clip, is_number
from ggmlrun.core.util.numbers import MAX_BYTES

SIZE_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)\s*\Z")


def parse_size(value) -> int:
    """Bytes from a number or a string: '8GiB', '512 MiB', '64KiB', '100B', '1.5GiB', '4096'.

    Binary units only (B, KiB, MiB, GiB, TiB; case-insensitive); 'GB' and friends are refused
    rather than guessed at, since users mean GiB as often as 10**9. Fractions round down.
    """
    if is_number(value) and not (value <= MAX_BYTES and math.isfinite(float(value))):
        raise ValueError(f"{clip(value, 40)} bytes is more than the 1 EiB any memory has")
    if is_number(value):
        if value < 1:
            raise ValueError(f"must be at least 1 byte, got {value}")
        return int(value)
    if not isinstance(value, str):
        from ggmlrun.core.frontend.yamlfile import describe_value

        raise ValueError(f"expected bytes as an integer or a string like '8GiB', got "
                         f"{describe_value(value)}")
    match = SIZE_RE.match(value)
    unit = match.group(2).lower() if match else ""
    if unit in ("k", "kb", "m", "mb", "g", "gb", "t", "tb"):
        raise ValueError(f"'{clip(value, 40)}': use binary units KiB, MiB, GiB or TiB")
    if match is None or (unit and unit not in SIZE_UNITS):
        raise ValueError(f"cannot read '{clip(value, 40)}' as a size; write bytes or e.g. '8GiB', "
                         "'512MiB', '64KiB'")
    size = float(match.group(1)) * SIZE_UNITS.get(unit, 1)
    if not size <= MAX_BYTES:          # inf and nan too
        raise ValueError(f"'{clip(value, 40)}' is more than the 1 EiB any memory has")
    size = int(size)
    if size < 1:
        raise ValueError(f"'{value}' is less than 1 byte")
    return size
