"""Opening a file the user named: a regular file of bounded size, or a clear refusal.

A FIFO would block the read forever, /dev/zero or /dev/urandom would be read until memory runs
out, and a directory gives an obscure OS error; all three are refused before the first byte.
The file is opened first and checked through its descriptor, so a path swapped between the
check and the read cannot slip past.
"""

from __future__ import annotations

import os
import stat

from ggmlrun.core.util.errors import InputError, missing_file_hint

MiB = 1 << 20
TEXT_LIMIT = 256 * MiB           # graph files, backends files and pack CSVs

# every file this process has read (device, inode) -> the name it was read by: each is an
# input, and no output may replace it (core/util/outputs.py, core/util/atomic.py)
_READ: dict[tuple[int, int], str] = {}


def note_read(path, fd: int | None = None) -> None:
    """Remember a file this process reads (by its open descriptor when there is one)."""
    try:
        info = os.fstat(fd) if fd is not None else os.stat(path)
    except OSError:
        return
    _READ.setdefault((info.st_dev, info.st_ino), str(path))


def forget_reads() -> None:
    """A new command begins (one process may run several: tests, a program calling main)."""
    _READ.clear()


def read_by_this_process(path) -> str | None:
    """The name a file was read by, when this process has read it (None: never read)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return _READ.get((info.st_dev, info.st_ino))


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path, what: str = "file", limit: int | None = TEXT_LIMIT):
    """A binary handle on `path`, refused (InputError, exit 2) unless it is a regular file no
    larger than `limit` bytes. O_NONBLOCK keeps the open itself from waiting on a FIFO."""
    file = str(path)
    if not file:
        raise InputError(f"the {what} name is empty")
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError("cannot read: no such file" + missing_file_hint(path), file=file) from None
    except IsADirectoryError:
        raise InputError(f"is a directory, not a {what}", file=file) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror or err}", file=file) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"is {_kind(info.st_mode)}, not a {what}; give a regular file",
                             file=file)
        if limit is not None and info.st_size > limit:
            raise InputError(f"is {info.st_size} bytes, more than the {limit // MiB} MiB a "
                             f"{what} may have", file=file)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        note_read(file, fd)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path, what: str = "file", limit: int = TEXT_LIMIT) -> str:
    """The whole file as UTF-8 text, within `limit` bytes even if it grows while read."""
    with open_regular(path, what, limit) as handle:
        try:
            raw = handle.read(limit + 1)
        except OSError as err:
            raise InputError(f"cannot read: {err.strerror or err}", file=str(path)) from None
    if len(raw) > limit:
        raise InputError(f"is larger than the {limit // MiB} MiB a {what} may have",
                         file=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"is not UTF-8 text (byte {err.start})", file=str(path)) from None
