"""What a remote question fetched: requests, bytes, files; the progress line's figures. Apart
from gguf/remote.py so that a question the header cache answers imports no HTTP, TLS or
email code (0.1 s of start-up)."""

from __future__ import annotations

import threading


class Stats:
    """Requests made and body bytes received over every file of a question (shards are read
    in threads); `on_change(stats)` is the progress line's hook."""

    def __init__(self, on_change=None):
        self.requests = self.bytes = self.files = self.done = 0
        self.on_change = on_change
        self._lock = threading.Lock()

    def add(self, requests: int = 0, nbytes: int = 0, files: int = 0, done: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            self.files += files
            self.done += done
        if self.on_change is not None:
            self.on_change(self)


def human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
