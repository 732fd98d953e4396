"""A ggml rpc-server as a device: what it says of itself, asked over ggml's own RPC protocol.

ggml-rpc (ggml/src/ggml-rpc/ggml-rpc.cpp, protocol 7.x in ggml 0.25.3) speaks over TCP:

    request : | command (1 byte) | request size (8 bytes, little endian) | request |
    response: | response size (8 bytes) | response |

The first command on a connection must be HELLO (14): 24 bytes of transport capabilities
(all zero: plain TCP), answered by the server's protocol version (major, minor, patch, one byte
of padding) and its own 24 capability bytes. A client of another major version, or of a newer
minor one than the server, must not go on (ggml's `negotiate_hello`). Then, per device of the
server (DEVICE_COUNT, 15): GET_ALIGNMENT (1), GET_MAX_SIZE (2) and GET_DEVICE_MEMORY (11), each
taking the device index as a uint32 and answering uint64s. ggmlrun asks exactly those and
closes the connection: it never allocates on the server.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from ggmlrun.core.util.errors import InputError

PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH = 7, 0, 0     # ggml-rpc.h of ggml 0.25.3
CMD_GET_ALIGNMENT, CMD_GET_MAX_SIZE, CMD_GET_DEVICE_MEMORY = 1, 2, 11
CMD_HELLO, CMD_DEVICE_COUNT = 14, 15
CONN_CAPS_SIZE = 24


@dataclass(frozen=True)
class RpcDevice:
    alignment: int
    max_size: int
    free: int
    total: int


@dataclass(frozen=True)
class RpcServer:
    endpoint: str
    version: tuple[int, int, int]
    devices: list[RpcDevice]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` (an IPv6 host in brackets: `[::1]:50052`)."""
    host, sep, port = str(endpoint).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"endpoint {endpoint!r}: write host:port, e.g. 127.0.0.1:50052")
    return host, int(port)


class _Connection:
    def __init__(self, endpoint: str, timeout: float):
        self.endpoint = endpoint
        host, port = parse_endpoint(endpoint)
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as err:
            raise InputError(f"rpc-server {endpoint}: cannot connect ({err.strerror or err}); "
                             f"is `rpc-server -H {host} -p {port}` running?") from None

    def ask(self, cmd: int, request: bytes, answer_size: int, what: str) -> bytes:
        try:
            self.sock.sendall(struct.pack("<BQ", cmd, len(request)) + request)
            size = struct.unpack("<Q", self._recv(8))[0]
            if size != answer_size:
                raise InputError(f"rpc-server {self.endpoint}: {what} answered {size} bytes, "
                                 f"not the {answer_size} of ggml's RPC protocol "
                                 f"{PROTO_MAJOR}.{PROTO_MINOR}.{PROTO_PATCH}")
            return self._recv(size)
        except (OSError, EOFError) as err:
            raise InputError(f"rpc-server {self.endpoint}: the connection failed during {what} "
                             f"({err}); an rpc-server of another protocol version closes it "
                             f"there (ggmlrun speaks {PROTO_MAJOR}.{PROTO_MINOR}.{PROTO_PATCH}, "
                             f"ggml 0.25.3's)") from None

    def _recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError("closed by the server")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def query(endpoint: str, timeout: float = 10.0) -> RpcServer:
    """The server's protocol version and, per device, its alignment, largest buffer and
    memory (free, total), asked of the live server."""
    conn = _Connection(endpoint, timeout)
    try:
        hello = conn.ask(CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE, "HELLO")
        major, minor, patch = hello[0], hello[1], hello[2]
        if major != PROTO_MAJOR or minor > PROTO_MINOR:
            raise InputError(f"rpc-server {endpoint} speaks ggml's RPC protocol "
                             f"{major}.{minor}.{patch}; ggmlrun speaks {PROTO_MAJOR}.{PROTO_MINOR}."
                             f"{PROTO_PATCH} (ggml 0.25.3, llama-cpp-python 0.3.36): run an "
                             f"rpc-server of that ggml, as llama.cpp itself would refuse this one")
        count = struct.unpack("<I", conn.ask(CMD_DEVICE_COUNT, b"", 4, "DEVICE_COUNT"))[0]
        devices = []
        for d in range(count):
            dev = struct.pack("<I", d)
            alignment = struct.unpack("<Q", conn.ask(CMD_GET_ALIGNMENT, dev, 8, "GET_ALIGNMENT"))[0]
            max_size = struct.unpack("<Q", conn.ask(CMD_GET_MAX_SIZE, dev, 8, "GET_MAX_SIZE"))[0]
            free, total = struct.unpack("<QQ", conn.ask(CMD_GET_DEVICE_MEMORY, dev, 16,
                                                        "GET_DEVICE_MEMORY"))
            devices.append(RpcDevice(alignment, max_size, free, total))
        return RpcServer(endpoint, (major, minor, patch), devices)
    finally:
        conn.close()
