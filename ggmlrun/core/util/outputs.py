"""Checking every output path before any work, so a run never destroys what the user owns.

An output may not be: an input of the same run (the graph, a `file:` it reads, an `--input`,
the backends file, the model or card: every file this process has read, core/util/inputs.py),
a read-only file (even as root, who could write it: its mode says it is not to be replaced),
something other than a regular file (a device, a FIFO, a directory: the
atomic rename would replace the node itself), another output of the same run, an empty name, a
name longer than the file system takes, or a file in a folder we cannot write. Each refusal is
one line naming the option (exit 2).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.inputs import read_by_this_process

NAME_MAX = 255


def _identity(path: Path):
    """What makes two names the same file: the inode where it exists, else the real path."""
    try:
        info = os.stat(path)
        return ("inode", info.st_dev, info.st_ino)
    except OSError:
        return ("path", os.path.realpath(path))


def check_output(path, option: str, *, inputs=(), others=(), suffixes=()) -> Path:
    """Refuse an output path that would overwrite an input, a non-regular file, or nothing
    writable; `others` are (option, path) pairs of the same run's other outputs."""
    text = str(path) if path is not None else ""
    if text in ("", "."):      # click turns an empty argument into Path("."), the folder
        raise InputError(f"{option}: the file name is empty; give a path such as out"
                         f"{suffixes[0] if suffixes else '.txt'}")
    path = Path(text)
    if len(path.name.encode()) > NAME_MAX:
        raise InputError(f"{option}: the file name is longer than {NAME_MAX} bytes")
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as err:
        raise InputError(f"{option} {text}: {err.strerror or err}") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise InputError(f"{option} {text} is {kind}; it would be replaced, so name a new or "
                         "regular file")
    if info is not None and (not info.st_mode & 0o222 or not os.access(path, os.W_OK)):
        raise InputError(f"{option} {text} is read-only; it would be replaced: name another "
                         f"file, or make it writable first")
    if suffixes and path.suffix.lower() not in suffixes:
        raise InputError(f"{option} {text}: the name must end in {' or '.join(suffixes)}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{option} {text}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{option} {text}: the folder {folder} is not writable")
    mine = _identity(path)
    source = read_by_this_process(path)
    if source is not None:
        raise InputError(f"{option} {text} is an input of this run ({source}); writing it "
                         "would destroy the input")
    for source in inputs:
        if source is not None and str(source) and _identity(Path(source)) == mine:
            raise InputError(f"{option} {text} is an input of this run ({source}); "
                             "writing it would destroy the input")
    for other_option, other in others:
        if other is not None and str(other) and _identity(Path(other)) == mine:
            raise InputError(f"{option} {text} is also {other_option}; give each output its "
                             "own file")
    return path
