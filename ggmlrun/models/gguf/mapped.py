"""A GGUF file's weights, memory-mapped once, from one descriptor, and watched while they are read.

The file is opened once; fstat on that descriptor must still show the file whose header was
read (same inode, size and modification time) and a size that holds every tensor, or the run
stops before mapping ("the model file changed since its header was read", exit 1). The mapping
is the one view of the weights (`np.frombuffer` over it: no second map, no copy). A file cut
short while it is mapped makes the next read of a lost page raise SIGBUS, which no Python code
can catch (the faulting instruction would run again): while the weights are read, a handler
installed through the C library prints "the model file changed while it was read" and ends
the process with exit 1, removing ggmlrun's temporary files first. After the compute, the same
descriptor is checked again, so a file rewritten in place fails the run too.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal

import numpy as np

from ggmlrun.core.util.errors import RunError
from ggmlrun.models.gguf.header import FileStamp


class MappedFile:
    def __init__(self, path, stamp: FileStamp, data_end: int):
        self.path = str(path)
        self.stamp = stamp
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as err:
            raise RunError(f"cannot open the model file: {err.strerror or err}",
                           file=self.path) from None
        try:
            size = os.fstat(self.fd).st_size
            if size < data_end:
                raise RunError(f"the model file changed since its header was read: its "
                               f"tensors need {data_end} bytes (truncated at byte {size} of "
                               f"{data_end})", file=self.path)
            self._check("since its header was read")
            try:
                self.map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError, OverflowError) as err:
                raise RunError(f"cannot map the model file ({size} bytes): "
                               f"{getattr(err, 'strerror', None) or err}", file=self.path) from None
        except BaseException:
            os.close(self.fd)
            raise
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)

    def _check(self, when: str) -> None:
        now = FileStamp.of(os.fstat(self.fd))
        if now != self.stamp:
            changed = [name for name in ("ino", "dev", "size", "mtime_ns")
                       if getattr(now, name) != getattr(self.stamp, name)]
            what = {"ino": "inode", "dev": "device", "size": "size",
                    "mtime_ns": "modification time"}
            sizes = f": {self.stamp.size} -> {now.size} bytes" if "size" in changed else ""
            raise RunError(f"the model file changed {when} ({', '.join(what[c] for c in changed)}"
                           f"{sizes}); run again on a file that stays put", file=self.path)

    def check_unchanged(self) -> None:
        """After the weights were read: a file rewritten meanwhile gives outputs of no file."""
        self._check("while it was read")

    def close(self) -> None:
        self.bytes = None
        try:
            self.map.close()
        except BufferError:      # a view of the weights is still held: the map goes with it
            pass
        os.close(self.fd)


@contextlib.contextmanager
def sigbus_guard(path):
    """While the mapped weights are read: SIGBUS (a page of a file cut short) prints one line
    and exits 1 instead of killing the process with no message (exit 135)."""
    handler = _install(str(path))
    try:
        yield
    finally:
        if handler is not None:
            _restore(*handler)


_live = []          # the C callable must outlive its installation


def _install(path: str):
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        kind = ctypes.CFUNCTYPE(None, ctypes.c_int)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    except (OSError, AttributeError, ImportError):
        return None
    message = (f"ggmlrun: error: {path}: the model file changed while it was read (a page of "
               f"the mapped file is gone: truncated or rewritten); run again on a file that "
               f"stays put\n").encode("utf-8", "replace")
    from ggmlrun.core.util.atomic import remove_temp_files

    def on_sigbus(signum):
        try:
            os.write(2, message)
            remove_temp_files()
        finally:
            os._exit(1)

    callback = kind(on_sigbus)
    _live.append(callback)
    previous = ctypes.create_string_buffer(512)        # the whole struct sigaction, opaque
    if libc.sigaction(signal.SIGBUS, None, previous) != 0:
        previous = None
    libc.signal(signal.SIGBUS, ctypes.cast(callback, ctypes.c_void_p).value)
    return libc, previous, callback


def _restore(libc, previous, callback) -> None:
    """The handler that was there before (faulthandler's, say), with its flags, exactly."""
    if previous is not None:
        libc.sigaction(signal.SIGBUS, previous, None)
    else:
        libc.signal(signal.SIGBUS, None)
    _live.remove(callback)
