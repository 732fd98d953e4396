"""Atomic file writes: a temporary file beside the target, then a rename.

A crash or an error never leaves a half-written file, and an existing file is replaced only
by a complete one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ggmlrun.core.util.errors import RunError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, write) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written file."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise RunError(f"cannot write {path}: {err.strerror}") from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())     # mkstemp's 0600 is not what a user expects
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise RunError(f"cannot write {path}: {err.strerror}") from None
        raise
