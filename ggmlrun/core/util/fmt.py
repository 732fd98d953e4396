"""Numbers as people read them: one formatter per kind, shared by every layer.

They live at the bottom of the stack so that an error message in the loader, a kernel's
complaint and a DOT label all print a shape, a size or a duration the same way.
"""

from __future__ import annotations

import numbers


def align_up(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


def human_bytes(n: int) -> str:
    if n < 0:                      # a shortfall: formatted like any size, never raw bytes
        return "-" + human_bytes(-n)
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def shape_text(shape) -> str:
    """`[2, 3]`: how every message and label writes a shape."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def microseconds(seconds: float) -> float:
    """Seconds as microseconds, to the nanosecond (trace timestamps)."""
    return round(seconds * 1e6, 3)


def us_text(seconds: float) -> str:
    """`12.5 us`: a modeled duration in a sentence."""
    return f"{seconds * 1e6:.1f} us"


def is_int(value) -> bool:
    """An integer from YAML or NumPy; bool is an int to Python but never a size or an axis.
    NumPy's integer types are `numbers.Integral` (its bool is not), so asking needs no NumPy."""
    return type(value) is int or (isinstance(value, numbers.Integral)      # (the usual case
                                  and not isinstance(value, bool))          # first)


def is_number(value) -> bool:
    """A real number from YAML or NumPy (NumPy's integer and float types are `numbers.Real`);
    never a bool."""
    return type(value) in _PLAIN_NUMBERS or (isinstance(value, numbers.Real)
                                              and not isinstance(value, bool))


_PLAIN_NUMBERS = frozenset({int, float})
_PLAIN_INT = frozenset({int})


def all_plain_ints(items) -> bool:
    """Every item is exactly a Python int (no bool, no NumPy type), decided in C: the usual
    case of a graph file's shapes and axes, checked without a Python step per item."""
    return _PLAIN_INT.issuperset(map(type, items))


def clip(text, limit: int = 80) -> str:
    """A value or name as an error shows it: at most `limit` characters, an ellipsis if cut,
    so a megabyte name never becomes a megabyte error line; a control character (a newline)
    shown escaped, so the error stays one line."""
    text = str(text) if not isinstance(text, str) else text
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def exact_key(mapping) -> tuple | None:
    """A YAML mapping's items as a dict key that two mappings share only when their every
    value is the same to any check: each value with its type (1, 1.0 and true are equal keys,
    not equal values), floats by their bits (-0.0 == 0.0), a flat list of ints as a tuple.
    None for any other value (nested data, NumPy scalars) or a name that is not a string (1
    and true again): such a mapping is not remembered."""
    key = []
    for name, value in mapping.items():
        kind = type(value)
        if type(name) is not str:
            return None
        if kind is float:
            value = value.hex()
        elif kind is list and all_plain_ints(value):
            value = tuple(value)
        elif kind is not int and kind is not str and kind is not bool and value is not None:
            return None
        key += name, kind, value
    return tuple(key)


def is_terminal(stream) -> bool:
    """Whether the stream is a terminal (a closed or fake stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
