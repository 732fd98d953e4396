"""A few token texts from a GGUF file's vocabulary, read lazily.

The header reader skips `tokenizer.ggml.tokens` (a string array of n_vocab entries: reading it
all costs more than the rest of the header). `run MODEL` names only its top tokens, so this
walks the key/value section itself, from the file, bounded by the file's size at every step:
the tokens array is found by key, its strings are skipped by their length prefixes until the
wanted ids, and nothing else is decoded. A file that is not as the header said gives None for
the texts it cannot reach, never an exception: the texts are a courtesy of the report.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

# GGUF value types (gguf.h): fixed sizes of the scalar ones; 8 string, 9 array
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
TOKENS_KEY = b"tokenizer.ggml.tokens"
MAX_TEXT = 256            # a token text longer than this is cut (the report shows a few chars)


class _Truncated(Exception):
    pass


class _Reader:
    """The key/value section, read field by field through the handle, bounded by `size`."""

    def __init__(self, handle, size: int):
        self.f, self.size = handle, size

    def take(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise _Truncated
        data = self.f.read(n)
        if len(data) != n:
            raise _Truncated
        return data

    def skip(self, n: int) -> None:
        if n < 0 or self.f.tell() + n > self.size:
            raise _Truncated
        self.f.seek(n, os.SEEK_CUR)

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> bytes:
        return self.take(self.u64())

    def skip_string(self) -> None:
        self.skip(self.u64())

    def skip_value(self, vtype: int) -> None:
        if vtype in _SIZES:
            self.skip(_SIZES[vtype])
        elif vtype == STRING:
            self.skip_string()
        elif vtype == ARRAY:
            inner, count = self.u32(), self.u64()
            if inner in _SIZES:
                self.skip(_SIZES[inner] * count)
            elif inner == STRING:
                for _ in range(count):
                    self.skip_string()
            else:
                raise _Truncated          # nested arrays: not in any vocabulary we read
        else:
            raise _Truncated


def token_texts(path: Path | str, ids) -> dict[int, str | None]:
    """{id: text} for the given token ids (None where the file has no such token or cannot be
    read that far). Reads the header's key/value section up to the tokens array and the array
    up to the largest id asked for; never more than the file holds."""
    wanted = sorted({int(i) for i in ids})
    out: dict[int, str | None] = dict.fromkeys(wanted)
    if not wanted:
        return out
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            r = _Reader(handle, size)
            if r.take(4) != b"GGUF":
                return out
            version = r.u32()
            if version < 2:
                return out
            r.u64()                        # tensor count
            n_kv = r.u64()
            for _ in range(n_kv):
                key = r.string()
                vtype = r.u32()
                if key != TOKENS_KEY:
                    r.skip_value(vtype)
                    continue
                if vtype != ARRAY or r.u32() != STRING:
                    return out
                count = r.u64()
                _walk_strings(handle, size, min(count, wanted[-1] + 1), out)
                return out
    except (OSError, _Truncated, struct.error, OverflowError):
        pass
    return out


def _walk_strings(handle, size: int, count: int, out: dict) -> None:
    """The first `count` strings of an array (a u64 length, then the bytes), from the handle's
    position: read in chunks of 1 MiB, a long string skipped by a seek, never past `size`;
    the ids in `out` get their text."""
    unpack = struct.Struct("<Q").unpack_from
    chunk = 1 << 20
    pos, buf, p = handle.tell(), b"", 0        # buf holds the file from pos; p: the offset in it

    def need(n: int) -> bool:
        nonlocal pos, buf, p
        if p + n <= len(buf):
            return True
        at = pos + len(buf)                    # where the next read starts
        want = max(chunk, p + n - len(buf))
        if pos + p + n > size:
            return False
        handle.seek(at)
        more = handle.read(min(want, size - at))
        buf, pos, p = buf[p:] + more, pos + p, 0
        return p + n <= len(buf)

    def skip(n: int) -> bool:
        nonlocal pos, buf, p
        if p + n <= len(buf):
            p += n
            return True
        target = pos + p + n
        if target > size:
            return False
        pos, buf, p = target, b"", 0
        return True

    for i in range(count):
        if not need(8):
            return
        (length,) = unpack(buf, p)
        p += 8
        if pos + p + length > size:            # a length past the end: the file is cut
            return
        if i in out:
            shown = min(length, MAX_TEXT)
            if not need(shown):
                return
            out[i] = buf[p:p + shown].decode("utf-8", "replace")
        if not skip(length):
            return


def shown_text(text: str | None) -> str:
    """A token's text as a report shows it: SentencePiece's word mark as a space, byte tokens
    and control characters visible (`<0x0A>`, `\\n`), quoted so spaces are seen."""
    if text is None:
        return "?"
    text = text.replace("\u2581", " ").replace("\u0120", " ").replace("\u010a", "\n")
    return repr(text)


def all_token_texts(path: Path | str) -> list[bytes] | None:
    """Every token's text, whole and undecoded (the draft check compares them as llama.cpp's
    strcmp does); None when the file cannot be read that far or has no tokens array."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            r = _Reader(handle, size)
            if r.take(4) != b"GGUF" or r.u32() < 2:
                return None
            r.u64()                        # tensor count
            for _ in range(r.u64()):
                key, vtype = r.string(), r.u32()
                if key != TOKENS_KEY:
                    r.skip_value(vtype)
                    continue
                if vtype != ARRAY or r.u32() != STRING:
                    return None
                return _whole_strings(handle, size, r.u64())
    except (OSError, _Truncated, struct.error, OverflowError, MemoryError):
        pass
    return None


def _whole_strings(handle, size: int, count: int) -> list[bytes] | None:
    """`count` strings from the handle's position, read in 1 MiB chunks (never the rest of a
    file of weights)."""
    if count * 8 > size - handle.tell():
        return None
    unpack = struct.Struct("<Q").unpack_from
    texts: list[bytes] = []
    buf, p = b"", 0

    def need(n: int) -> bool:
        nonlocal buf, p
        if p + n > len(buf):
            more = handle.read(max(1 << 20, p + n - len(buf)))
            buf, p = buf[p:] + more, 0
        return p + n <= len(buf)

    for _ in range(count):
        if not need(8):
            return None
        (length,) = unpack(buf, p)
        if length > size or not need(8 + length):
            return None
        texts.append(buf[p + 8:p + 8 + length])
        p += 8 + length
    return texts
