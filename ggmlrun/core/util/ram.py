"""Memory checked before it is taken: an allocation the machine cannot give fails with one
clear line (exit 1), not a MemoryError deep in NumPy or the kernel's OOM killer."""

from __future__ import annotations

from ggmlrun.core.util.errors import RunError
from ggmlrun.core.util.fmt import human_bytes


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (MemTotal if the kernel is too old); None elsewhere."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
    except OSError:
        return None
    for key in ("MemAvailable", "MemTotal"):
        if key in fields:
            return int(fields[key].split()[0]) * 1024
    return None


def ensure_memory(nbytes: int, what: str) -> None:
    """Refuse `what` when it needs more bytes than the machine has available now."""
    free = available_bytes()
    if free is not None and nbytes > free:
        raise RunError(f"{what} needs {human_bytes(nbytes)}, but this machine has only "
                       f"{human_bytes(free)} of memory available")
