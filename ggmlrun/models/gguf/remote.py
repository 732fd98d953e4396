"""A remote GGUF file's first bytes, fetched by HTTP range requests as the header reader asks.

Only the header travels: the reader (gguf/reader.py, the same bounded reader as for a local
file) asks for small chunks, and this handle fetches the next range when a read passes what it
holds: up to what the reader said it expects (an array's items or lengths, the fewest bytes the
keys and tensor infos take, a string array's rest at its average length so far: bytes it will
read, in one request), and past that a third more than it already has, at most AHEAD, 1 MiB (the
next keys and arrays come with it: each round trip saved is 50 ms to a faraway Hub; a fetch ends
at most 1 MiB past the header, against a data section of gigabytes). A 9 MB header of a
128k-token vocabulary with its merges is 5 requests and 1.07x its bytes. It never reads past
MAX_HEADER, so a hostile file costs at most that much memory and transfer. One kept-alive
connection per file (the stdlib's http.client: redirects followed, Authorization dropped when
the host changes, Accept-Encoding identity, a timeout on every read). A server that ignores
Range answers 200 with the whole file: the connection is closed at once, before its body, and
the answer is an input error, so the file is never downloaded. Every failure is one InputError
(exit 2) naming the URL.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from urllib.parse import urljoin, urlsplit

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.stats import Stats, human

MAX_HEADER = 128 << 20          # bytes of header at most (a 256k vocabulary is ~20 MiB)
FIRST = 32 << 10                # the first range: the fixed header and the first keys
CHUNK = 16 << 10                # what the header reader asks for at a time
AHEAD = 1 << 20                 # at most this far past what the reader expects
TIMEOUT = 20.0                  # seconds without an answer on any read
_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 10


class HttpFile:
    """seek/read over a remote file's first bytes (its header), fetched by range requests.

    `size` is the whole file's (from Content-Range, or Content-Length when the server ignores
    ranges); `validator` its ETag, else its Last-Modified (None: neither was sent)."""

    def __init__(self, url: str, *, name: str | None = None, headers: dict | None = None,
                 stats: Stats | None = None, timeout: float = TIMEOUT, limit: int = MAX_HEADER,
                 denied_hint: str = ""):
        self.url, self.name = url, name or url
        self.headers = {"Accept-Encoding": "identity", "User-Agent": "ggmlrun",
                        **(headers or {})}
        self.stats = stats or Stats()
        self.timeout, self.limit, self.denied_hint = timeout, limit, denied_hint
        self.prefix = bytearray()
        self.pos = 0
        self.size: int | None = None
        self.expected = 0           # bytes the header reader said it will read (expect)
        self.validator: str | None = None
        self._conn = None

    # --- what the header reader calls -----------------------------------------------------
    def seek(self, pos: int) -> None:
        self.pos = pos

    def read(self, n: int) -> bytes:
        if self.size is None:
            self.open()
        end = min(self.pos + n, self.size)
        if end > len(self.prefix):
            self._grow(end)
        data = bytes(self.prefix[self.pos:end])
        self.pos = end
        return data

    def expect(self, end: int) -> None:
        self.expected = max(self.expected, end)

    def open(self) -> "HttpFile":
        """The first range: the file's size and validator, and its first bytes."""
        if self.size is None:
            self._fetch(0, FIRST)
        return self

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def head(self) -> tuple[int | None, str | None]:
        """(size, validator) by a HEAD request, no body: what the header cache is keyed by.
        None for the size where the server does not say (or refuses HEAD)."""
        response = self.request("HEAD", {})
        response.read()
        if response.status != 200:
            return None, None
        length = response.getheader("Content-Length")
        return (int(length) if length and length.isdigit() else None), _validator(response)

    # --- fetching ---------------------------------------------------------------------------
    def _grow(self, end: int) -> None:
        have = len(self.prefix)
        if end > self.limit:
            raise self._fail(f"the header runs past {human(self.limit)} (it needs byte {end}); "
                             f"ggmlrun reads remote headers of at most {human(self.limit)}")
        want = max(end, self.expected) + min(have // 3, AHEAD)
        want = min(want, self.size, self.limit)
        self._fetch(have, want - have)

    def _fetch(self, start: int, count: int) -> None:
        response = self.request("GET", {"Range": f"bytes={start}-{start + count - 1}"})
        status = response.status
        if status == 206:
            first, total = _content_range(response.getheader("Content-Range"))
            if first != start or total is None:
                response.close()
                raise self._fail(f"the server answered bytes from {first} to a request for "
                                 f"bytes from {start} (Content-Range "
                                 f"{response.getheader('Content-Range')!r})")
            self._remember(response, total)
            self._take(response, count)
            response.read()                 # the rest of this range: the connection is reused
        elif status == 416 and start == 0:  # an empty file
            response.read()
            self._remember(response, 0)
        elif status == 200:                 # Range ignored: the whole file is on its way
            response.close()
            raise self._fail("the server ignores Range requests (it answered with the whole "
                             "file); ggmlrun reads a remote model's header by ranges and never "
                             "downloads the file: use a server that honours Range, or download "
                             "the file and name it locally")
        else:
            response.read()
            raise self.status_error(status)

    def _remember(self, response, total: int) -> None:
        if self.size is None:
            self.size, self.validator = total, _validator(response)
        elif total != self.size:
            raise self._fail(f"the file changed while its header was read ({self.size} -> "
                             f"{total} bytes)")

    def _take(self, response, count: int) -> None:
        try:
            data = response.read(count)
        except (OSError, http.client.HTTPException) as err:
            raise self._network_error(err) from None
        self.stats.add(nbytes=len(data))
        self.prefix += data
        if len(data) < count and len(self.prefix) < self.size:
            raise self._fail(f"the connection ended after {len(self.prefix)} of "
                             f"{self.size} bytes")

    def request(self, method: str, extra: dict):
        """One request on the kept-alive connection, redirects followed; a connection the
        server closed since the last request is reopened once."""
        url, headers = self.url, dict(self.headers, **extra)
        for _ in range(_MAX_REDIRECTS):
            response = self._send(method, url, headers)
            if response.status not in _REDIRECTS:
                self.url = url
                return response
            location = response.getheader("Location")
            response.read()
            if not location:
                raise self._fail(f"HTTP {response.status} without a Location")
            target = urljoin(url, location)
            if urlsplit(target).netloc != urlsplit(url).netloc:
                headers.pop("Authorization", None)   # a token never leaves its host
                self.close()
            url = target
        raise self._fail(f"more than {_MAX_REDIRECTS} redirects")

    def _send(self, method: str, url: str, headers: dict):
        parts = urlsplit(url)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        for attempt in (0, 1):
            fresh = self._conn is None
            try:
                if fresh:
                    self._conn = _connect(parts, self.timeout)
                self._conn.request(method, target, headers=headers)
                response = self._conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as err:
                self.close()
                if fresh or attempt:
                    raise self._network_error(err) from None
                continue                # a kept-alive connection the server had closed
            except (OSError, http.client.HTTPException) as err:
                self.close()
                raise self._network_error(err) from None
            self.stats.add(requests=1)
            return response
        raise AssertionError("unreachable")

    # --- errors -----------------------------------------------------------------------------
    def _fail(self, message: str) -> InputError:
        return InputError(message, file=self.name)

    def status_error(self, status: int) -> InputError:
        if status == 404:
            return self._fail("not found (HTTP 404)")
        if status in (401, 403):
            return self._fail(f"access denied (HTTP {status}){self.denied_hint}")
        return self._fail(f"the server answered HTTP {status}")

    def _network_error(self, err) -> InputError:
        host = urlsplit(self.url).netloc
        if isinstance(err, (socket.timeout, TimeoutError)):
            return self._fail(f"no answer from {host} within {self.timeout:g} s (timed out)")
        if isinstance(err, socket.gaierror):
            return self._fail(f"cannot resolve {host} (no network?)")
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        return self._fail(f"cannot reach {host}: {reason} (no network, or the server is down)")


def _connect(parts, timeout: float):
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                           context=ssl.create_default_context())
    if parts.scheme == "http":
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    raise InputError(f"a model URL is http:// or https://, not {parts.scheme}://",
                     file=parts.geturl())


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    """'bytes 0-99/1234' -> (0, 1234); (None, None) when unreadable, total None when '*'."""
    try:
        unit, _, rest = (value or "").partition(" ")
        span, _, total = rest.partition("/")
        first = int(span.split("-")[0]) if span != "*" else None
        return first, (None if total == "*" else int(total))
    except ValueError:
        return None, None


def _validator(response) -> str | None:
    etag = response.getheader("ETag")
    if etag and not etag.startswith("W/"):
        return "etag:" + etag.strip('"')
    modified = response.getheader("Last-Modified")
    return "modified:" + modified if modified else None
