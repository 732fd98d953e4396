"""Numbers as people read them: one formatter per kind, shared by every report."""

from __future__ import annotations


def align_up(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def clip(text, limit: int = 80) -> str:
    """A value or name as an error shows it: at most `limit` characters, an ellipsis if cut,
    so a megabyte name never becomes a megabyte error line."""
    text = str(text) if not isinstance(text, str) else text
    return text if len(text) <= limit else text[:limit - 1] + "…"
