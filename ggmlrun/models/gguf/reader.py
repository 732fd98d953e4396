"""Sequential little-endian reads over a file that never trust a length: every read is
checked against the file's size before anything is allocated or looped over, so a hostile
count or length in a GGUF header is one clear error, never a huge allocation or a long loop.
The GGUF format itself (keys, tensors, offsets) is gguf_header's; this is the byte source it
reads through, in chunks (a header with a real vocabulary is megabytes of short strings). The
handle is a local file or a remote one (gguf/remote.py: its bytes come by HTTP range requests,
so it asks for small chunks and lets the remote side decide how far to read ahead).
"""

from __future__ import annotations

import struct

from ggmlrun.core.util.errors import InputError

MAX_STRING = 1 << 30              # GGUF_MAX_STRING_LENGTH
_CHUNK = 1 << 20
_U32, _I32, _U64, _I64 = (struct.Struct("<" + c) for c in "IiQq")


class BoundedReader:
    """Sequential little-endian reads over a file, in chunks; every read checked against the
    file's size first (the size fstat gave when the file was opened)."""

    def __init__(self, handle, size: int, path: str, chunk: int = _CHUNK):
        self.f, self.size, self.path, self.chunk = handle, size, path, chunk
        self.buf, self.base, self.pos = b"", 0, 0
        self._expect = getattr(handle, "expect", None)

    def expect(self, end: int) -> None:
        """Bytes up to `end` will (most likely) be read: a remote handle fetches them in one
        request rather than in growing ones (a round trip each); a local file ignores it."""
        if self._expect is not None:
            self._expect(min(end, self.size))

    def fail(self, message: str, culprit: str | None = None):
        return InputError(message, file=self.path, culprit=culprit)

    def truncated(self, end: int, what: str, culprit: str | None = None):
        return self.fail(f"{what} runs past the end of the file: truncated at byte {self.size} "
                         f"of {end}", culprit)

    def need(self, n: int, what: str, culprit: str | None = None) -> int:
        """The buffer offset of the next n bytes, which are then consumed."""
        end = self.pos + n
        if end > self.size:
            raise self.truncated(end, what, culprit)
        if end > self.base + len(self.buf):
            self._load(n, what, culprit)
        at = self.pos - self.base
        self.pos = end
        return at

    def _load(self, n: int, what: str, culprit: str | None) -> None:
        self.f.seek(self.pos)
        data = self.f.read(min(max(n, self.chunk), self.size - self.pos))
        if len(data) < n:           # the file shrank since it was opened
            raise self.fail(f"{what}: the file ended at byte {self.pos + len(data)} while it "
                            f"was read (truncated at byte {self.pos + len(data)} of "
                            f"{self.pos + n})", culprit)
        self.buf, self.base = data, self.pos

    def unpack(self, unpacker: struct.Struct, what: str, culprit: str | None = None):
        at = self.need(unpacker.size, what, culprit)      # (it may load a new buffer)
        return unpacker.unpack_from(self.buf, at)[0]

    def u32(self, what, culprit=None) -> int:
        return self.unpack(_U32, what, culprit)

    def i32(self, what, culprit=None) -> int:
        return self.unpack(_I32, what, culprit)

    def u64(self, what, culprit=None) -> int:
        return self.unpack(_U64, what, culprit)

    def i64(self, what, culprit=None) -> int:
        return self.unpack(_I64, what, culprit)

    def raw_string(self, what: str, culprit: str | None = None) -> bytes:
        n = self.u64(f"{what}'s length", culprit)
        if n > MAX_STRING:
            raise self.fail(f"{what} is {n} bytes long; gguf.cpp's limit is {MAX_STRING}", culprit)
        at = self.need(n, f"{what} ({n} bytes)", culprit)
        return self.buf[at:at + n]

    def skip(self, nbytes: int, what: str, culprit: str) -> None:
        if self.pos + nbytes > self.size:
            raise self.truncated(self.pos + nbytes, what, culprit)
        self.pos += nbytes

    def skip_strings(self, count: int, culprit: str) -> None:
        """A bounded walk over `count` length-prefixed strings, reading only the lengths. The
        loop only adds: a length over the limit or past the end moves `pos` out of the chunk
        (1 MiB, less than the limit), and the checks run where the chunk ends and after it."""
        pos, unpack = self.pos, _U64.unpack_from
        buf, base = self.buf, self.base
        top, n = base + len(buf), 0
        start = pos
        for i in range(count):
            if pos + 8 > top:
                self._string_checks(i - 1, n, pos, culprit)
                if pos + 8 > self.size:
                    raise self.truncated(pos + 8, f"string {i}'s length", culprit)
                if i:        # the strings left, as long as those walked so far on average
                    self.expect(pos + (count - i) * ((pos - start) // i))
                self.pos = pos
                self._load(8, f"string {i}'s length", culprit)
                buf, base = self.buf, self.base
                top = base + len(buf)
            n = unpack(buf, pos - base)[0]
            pos += 8 + n
        self._string_checks(count - 1, n, pos, culprit)
        self.pos = pos

    def _string_checks(self, i: int, n: int, end: int, culprit: str) -> None:
        """String i, `n` bytes long, ends at byte `end`: within gguf.cpp's limit and the file."""
        if n > MAX_STRING:
            raise self.fail(f"string {i} is {n} bytes long; gguf.cpp's limit is {MAX_STRING}",
                            culprit)
        if end > self.size:
            raise self.truncated(end, f"string {i} ({n} bytes)", culprit)
