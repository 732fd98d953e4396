"""Split GGUF sets made from whole files, and HTTP servers on loopback: one that serves files
with or without Range, and a stand-in for the Hugging Face Hub (resolve with a redirect to a
"CDN" host, the tree API, gated repositories). Nothing here reaches past 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ggufkit import kv_bytes, layout, pstr

from ggmlrun.models.gguf.header import read_header


def split_gguf(path: Path, n: int, *, alignment_others: int = 32) -> list[bytes]:
    """The file as llama-gguf-split --split writes it in n shards: the metadata in the first,
    the tensors in order, dealt out as evenly as they go; every shard with split.no and
    split.count (u16), and split.tensors.count (i32)."""
    raw = Path(path).read_bytes()
    lay, header = layout(raw), read_header(path)
    tensors = header.tensors
    per = -(-len(tensors) // n)
    groups = [tensors[i * per:(i + 1) * per] for i in range(n)]
    assert all(groups), "fewer tensors than shards"
    shards = []
    for i, group in enumerate(groups):
        keys = (kv_bytes("split.no", 2, struct.pack("<H", i))
                + kv_bytes("split.count", 2, struct.pack("<H", n))
                + kv_bytes("split.tensors.count", 5, struct.pack("<i", len(tensors))))
        kvs, n_kv = (raw[24:lay.kv_end] + keys, lay.n_kv + 3) if i == 0 else (keys, 3)
        align = lay.alignment if i == 0 else alignment_others
        infos, data, offset = b"", b"", 0
        for t in group:
            infos += pstr(t.name) + struct.pack("<I", len(t.ne)) + struct.pack(
                f"<{len(t.ne)}q", *t.ne) + struct.pack("<iQ", t.type_id, offset)
            data += raw[t.offset:t.offset + t.nbytes]
            data += b"\0" * (-len(data) % align)
            offset = len(data)
        head = b"GGUF" + struct.pack("<Iqq", 3, len(group), n_kv) + kvs + infos
        head += b"\0" * (-len(head) % align)
        shards.append(head + data)
    return shards


def write_split(path: Path, folder: Path, n: int, prefix: str | None = None) -> list[Path]:
    prefix = prefix or Path(path).stem
    out = []
    for i, blob in enumerate(split_gguf(path, n), start=1):
        target = folder / f"{prefix}-{i:05d}-of-{n:05d}.gguf"
        target.write_bytes(blob)
        out.append(target)
    return out


class Counts:
    def __init__(self):
        self.requests = 0
        self.bytes = 0
        self.paths: list[str] = []
        self.lock = threading.Lock()

    def ask(self, path: str) -> None:
        """Counted as the request arrives, before it is answered: a client that has its
        answer sees its request counted."""
        with self.lock:
            self.requests += 1
            self.paths.append(path)

    def sent(self, nbytes: int) -> None:
        with self.lock:
            self.bytes += nbytes

    def reset(self) -> None:
        with self.lock:
            self.requests = self.bytes = 0
            self.paths = []


class Server:
    """A threaded HTTP server on 127.0.0.1. `files`: URL path -> bytes, served at
    /files/PATH; `repos`: OWNER/REPO -> {path in repo: bytes}, served as the Hub serves
    them. `ranges=False` answers every GET with the whole file (200), as a server that
    ignores Range; `delay` sleeps before each answer (a round trip); `gated`: repos that
    need `Authorization: Bearer TOKEN`."""

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, files=None, repos=None, *, ranges: bool = True, delay: float = 0.0,
                 gated=(), token: str = "hf_test_token"):
        self.files = dict(files or {})
        self.repos = {repo: dict(tree) for repo, tree in (repos or {}).items()}
        self.ranges, self.delay, self.gated, self.token = ranges, delay, set(gated), token
        self.counts = Counts()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True     # headers, then body: no 40 ms delayed-ACK stall

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                server._answer(self, head=True)

            def do_GET(self):
                server._answer(self, head=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        # shutdown() waits for the loop's next poll: 0.5 s a server by default
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.endpoint}/files/{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    # --- answers ----------------------------------------------------------------------------
    def _answer(self, h, head: bool) -> None:
        self.counts.ask(h.path)
        if self.delay:
            time.sleep(self.delay)
        path = h.path.split("?")[0]
        if path.startswith("/files/"):
            blob = self.files.get(path[len("/files/"):])
            return self._file(h, blob, head) if blob is not None else self._status(h, 404, head)
        if path.startswith("/cdn/"):
            repo_path = path[len("/cdn/"):]
            owner, repo, rest = repo_path.split("/", 2)
            blob = self.repos.get(f"{owner}/{repo}", {}).get(rest)
            return self._file(h, blob, head) if blob is not None else self._status(h, 404, head)
        match = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)$", path)
        if match:
            return self._tree(h, match[1], head)
        match = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if match:
            return self._resolve(h, match[1], match[3], head)
        self._status(h, 404, head)

    def _denied(self, h, repo: str) -> bool:
        if repo in self.gated and h.headers.get("Authorization") != f"Bearer {self.token}":
            self._status(h, 403, False, {"X-Error-Code": "GatedRepo"})
            return True
        return False

    def _tree(self, h, repo: str, head: bool) -> None:
        if repo not in self.repos:
            return self._status(h, 401, head, {"X-Error-Code": "RepoNotFound"})
        if self._denied(h, repo):
            return
        body = json.dumps([{"type": "file", "path": p, "size": len(b), "oid": _etag(b)}
                           for p, b in sorted(self.repos[repo].items())]).encode()
        self._send(h, 200, {"Content-Type": "application/json"}, body, head)

    def _resolve(self, h, repo: str, path: str, head: bool) -> None:
        if repo not in self.repos:
            return self._status(h, 401, head, {"X-Error-Code": "RepoNotFound"})
        if self._denied(h, repo):
            return
        blob = self.repos[repo].get(path)
        if blob is None:
            return self._status(h, 404, head, {"X-Error-Code": "EntryNotFound"})
        # the Hub's answer: a redirect to another host, the file's metadata on it
        location = f"http://localhost:{self.port}/cdn/{repo}/{path}"
        self._send(h, 302, {"Location": location, "X-Repo-Commit": self.COMMIT,
                            "X-Linked-Etag": f'"{_etag(blob)}"', "X-Linked-Size": str(len(blob)),
                            "ETag": '"pointer"'}, b"", head)

    def _file(self, h, blob: bytes, head: bool) -> None:
        headers = {"ETag": f'"{_etag(blob)}"', "Accept-Ranges": "bytes" if self.ranges else "none"}
        rng = h.headers.get("Range")
        if head or not (rng and self.ranges):
            return self._send(h, 200, headers, blob, head)
        start, _, end = rng.removeprefix("bytes=").partition("-")
        start, end = int(start), min(int(end or len(blob) - 1), len(blob) - 1)
        if start >= len(blob):
            return self._send(h, 416, {"Content-Range": f"bytes */{len(blob)}"}, b"", head)
        headers["Content-Range"] = f"bytes {start}-{end}/{len(blob)}"
        self._send(h, 206, headers, blob[start:end + 1], head)

    def _status(self, h, status: int, head: bool, extra=None) -> None:
        self._send(h, status, dict(extra or {}), b"", head)

    def _send(self, h, status: int, headers: dict, body: bytes, head: bool) -> None:
        try:
            h.send_response(status)
            for key, value in headers.items():
                h.send_header(key, value)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            if not head:
                view = memoryview(body)
                for at in range(0, len(body), 1 << 16):      # a client may stop reading
                    h.wfile.write(view[at:at + (1 << 16)])
                    self.counts.sent(len(view[at:at + (1 << 16)]))
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True


def _etag(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:32]
