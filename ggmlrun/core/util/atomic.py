"""Atomic file writes: a temporary file beside the target, then a rename.

A crash or an error never leaves a half-written file, and an existing file is replaced only
by a complete one that keeps its permission bits: a 0600 file the user locked down must not
come back world-readable. Run as root, it keeps its owner and group too (best effort): root
replacing a user's file must not leave it root's, unreadable or unwritable to that user. Temporary files in flight are remembered so that a SIGTERM handler
(installed by the command line) can remove them before the process exits; only SIGKILL, which
no process can catch, may leave one behind.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ggmlrun.core.util.errors import RunError

# short enough that even a 255-byte target name leaves room: the temp name is bounded by this
_TEMP_STEM = 40
_live: set[str] = set()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_path(path: Path) -> Path:
    """A fresh name beside `path`, never longer than NAME_MAX whatever `path`'s length."""
    stem = path.name.encode()[:_TEMP_STEM].decode(errors="ignore")
    return path.with_name(f".{stem}.{secrets.token_hex(6)}.tmp")


def _mode_for(path: Path) -> tuple[int, tuple[int, int] | None]:
    """The replaced file's permission bits (a new file: the umask's), and its (uid, gid) when
    this process is root and could give the new file away (None: leave it ours)."""
    try:
        existing = os.stat(path)
    except OSError:
        return 0o666 & ~_umask(), None
    owner = (existing.st_uid, existing.st_gid)
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or owner == (0, 0):
        owner = None
    return stat.S_IMODE(existing.st_mode), owner


def remove_temp_files() -> None:
    """Delete every temporary file still being written (signal handlers call this)."""
    for tmp in list(_live):
        try:
            os.unlink(tmp)
        except OSError:
            pass
        _live.discard(tmp)


def write_atomic(path: Path, write) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written file."""
    path = Path(path)
    from ggmlrun.core.util.inputs import read_by_this_process

    source = read_by_this_process(path)
    if source is not None:         # the last guard: every file read is an input
        from ggmlrun.core.util.errors import InputError
        raise InputError(f"will not write {path}: it is an input of this run ({source})")
    mode, owner = _mode_for(path)
    for _ in range(8):
        tmp = str(_temp_path(path))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            continue
        except OSError as err:
            raise RunError(f"cannot write {path}: {err.strerror}") from None
    else:
        raise RunError(f"cannot write {path}: no free temporary name beside it")
    _live.add(tmp)
    try:
        with os.fdopen(fd, "wb") as handle:
            if owner is not None:
                try:                  # before fchmod: a chown clears setuid/setgid bits
                    os.fchown(handle.fileno(), *owner)
                except OSError:
                    pass
            os.fchmod(handle.fileno(), mode)
            write(handle)
        os.replace(tmp, path)
        _live.discard(tmp)
    except BaseException as err:
        _live.discard(tmp)
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise RunError(f"cannot write {path}: {err.strerror}") from None
        raise
