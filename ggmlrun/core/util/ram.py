"""Memory checked before it is taken: an allocation the machine cannot give fails with one
clear line (exit 1), not a MemoryError deep in NumPy or the kernel's OOM killer."""

from __future__ import annotations

from ggmlrun.core.util import host
from ggmlrun.core.util.errors import RunError
from ggmlrun.core.util.fmt import human_bytes


def available_bytes() -> int | None:
    """MemAvailable (MemTotal if the kernel is too old), less what RLIMIT_AS or the cgroup's
    limit leaves; None where unknown. Read through core/util/host.py (GGMLRUN_HOST_AVAILABLE,
    GGMLRUN_HOST_LIMIT override it)."""
    return host.ram_available()


def ensure_memory(nbytes: int, what: str) -> None:
    """Refuse `what` when it needs more bytes than the machine has available now."""
    free = available_bytes()
    if free is not None and nbytes > free:
        raise RunError(f"{what} needs {human_bytes(nbytes)}, but this machine has only "
                       f"{human_bytes(free)} of memory available")
