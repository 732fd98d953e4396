"""Remote headers kept on disk, so a second question about the same file costs no download.

One file per header under the platform cache dir ($XDG_CACHE_HOME, else ~/.cache, then
ggmlrun/headers/), named by a hash of the file's identity (its URL, or the Hub's
endpoint/repo/revision/path) and its validator (the Hub's commit and ETag, a server's ETag or
Last-Modified): a file that changes upstream gets a new entry. Beside each entry a small
pointer, named by the identity alone, holds the latest validator: offline (HF_HUB_OFFLINE) that
is the entry used. Repository listings (`hf://OWNER/REPO:QUANT`) are kept the same way.

A header checked against its server within the last MAX_AGE seconds (GGMLRUN_HEADER_MAX_AGE,
default 600; 0: always ask) is used without asking again, as a browser uses a fresh response:
a question asked twice in a row costs no round trip at all. Older, the server is asked for the
file's validator (a HEAD: no body), and the entry is used if it still matches.

Writes go to a temporary file beside the target, then a rename: two processes writing the same
entry at once leave one whole entry, never a mix. The directory is bounded (MAX_BYTES, the
least recently used entries go first); an entry that vanishes between a listing and a read is a
miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from pathlib import Path

MAX_BYTES = 512 << 20
MAX_AGE = 600.0
_MAGIC = b"GGMLRUN-HEADER-1\n"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ggmlrun" / "headers"


def max_age() -> float:
    text = os.environ.get("GGMLRUN_HEADER_MAX_AGE", "")
    try:
        return max(0.0, float(text)) if text else MAX_AGE
    except ValueError:
        return MAX_AGE


def _name(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]


class HeaderCache:
    def __init__(self, root: Path | None = None, max_bytes: int = MAX_BYTES):
        self.root = Path(root) if root is not None else cache_dir()
        self.max_bytes = max_bytes

    # --- headers ----------------------------------------------------------------------------
    def get(self, identity: str, validator: str | None) -> tuple[bytes, int] | None:
        """(the header's bytes, the whole file's size), or None."""
        if validator is None:
            return None
        raw = self._read(self.root / (_name(identity, validator) + ".hdr"))
        if raw is None or not raw.startswith(_MAGIC) or len(raw) < len(_MAGIC) + 8:
            return None
        size = struct.unpack_from("<Q", raw, len(_MAGIC))[0]
        return raw[len(_MAGIC) + 8:], size

    def put(self, identity: str, validator: str | None, blob: bytes, size: int) -> None:
        if validator is None:
            return
        self._write(self.root / (_name(identity, validator) + ".hdr"),
                    _MAGIC + struct.pack("<Q", size) + blob)
        self.checked(identity, validator)
        self._trim()

    def checked(self, identity: str, validator: str) -> None:
        """The server has just said this file's validator: the entry is fresh again."""
        self.put_json("latest", identity, {"validator": validator, "checked": time.time()})

    def latest(self, identity: str, fresh: bool = False) -> str | None:
        """The validator last cached for this file (offline mode reads it whatever its age);
        `fresh`: only if checked within max_age()."""
        entry = self.get_json("latest", identity)
        if not isinstance(entry, dict):
            return None
        if fresh and not time.time() - entry.get("checked", 0) < max_age():
            return None
        return entry.get("validator")

    # --- small JSON records (latest validators, repository listings) -----------------------
    def get_fresh_json(self, kind: str, identity: str, fresh: bool = True):
        """A record put by put_fresh_json, if checked within max_age() (or `fresh` False)."""
        entry = self.get_json(kind, identity)
        if not isinstance(entry, dict) or "value" not in entry:
            return None
        if fresh and not time.time() - entry.get("checked", 0) < max_age():
            return None
        return entry["value"]

    def put_fresh_json(self, kind: str, identity: str, value) -> None:
        self.put_json(kind, identity, {"value": value, "checked": time.time()})

    def get_json(self, kind: str, identity: str):
        raw = self._read(self.root / f"{_name(kind, identity)}.json")
        try:
            return json.loads(raw) if raw is not None else None
        except ValueError:
            return None

    def put_json(self, kind: str, identity: str, value) -> None:
        self._write(self.root / f"{_name(kind, identity)}.json", json.dumps(value).encode())

    # --- files ------------------------------------------------------------------------------
    def _read(self, path: Path) -> bytes | None:
        try:
            data = path.read_bytes()
            os.utime(path)               # recently used: trimmed last
            return data
        except OSError:
            return None

    def _write(self, path: Path, data: bytes) -> None:
        """Atomically; a cache that cannot be written (read-only home, full disk) is no
        cache, not an error."""
        from ggmlrun.core.util.atomic import write_atomic
        from ggmlrun.core.util.errors import RunError

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, lambda handle: handle.write(data))
        except (OSError, RunError):
            pass

    def _trim(self) -> None:
        entries = []
        try:
            with os.scandir(self.root) as it:
                for entry in it:
                    if entry.name.endswith(".hdr"):
                        try:
                            st = entry.stat()
                        except OSError:
                            continue
                        entries.append((st.st_mtime_ns, st.st_size, entry.path))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
            except OSError:
                pass
            total -= size
