"""Byte-level surgery on GGUF files for the header tests and the fuzzer: find a key or a tensor's
info by its name, patch a field, insert a key, re-pack the header."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted((ROOT / "examples" / "models").glob("*.gguf"))
STRING, ARRAY = 8, 9
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def pstr(text) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_bytes(key, gtype: int, payload: bytes) -> bytes:
    return pstr(key) + struct.pack("<i", gtype) + payload


def u32_kv(key, value: int) -> bytes:
    return kv_bytes(key, 4, struct.pack("<I", value))


def info_bytes(name, ne, type_id: int, offset: int) -> bytes:
    return (pstr(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}q", *ne)
            + struct.pack("<iQ", type_id, offset))


@dataclass
class Layout:
    """Where things are in a well-formed little-endian GGUF file."""
    n_tensors: int
    n_kv: int
    keys: dict            # key -> (start of its entry, start of its value type field, end)
    infos: dict           # tensor name -> (start of its info, start of its offset field, end)
    kv_end: int
    info_end: int
    data_offset: int
    alignment: int


def layout(raw: bytes) -> Layout:
    n_tensors, n_kv = struct.unpack_from("<qq", raw, 8)
    pos, keys, alignment = 24, {}, 32
    for _ in range(n_kv):
        start = pos
        n = struct.unpack_from("<Q", raw, pos)[0]
        key = raw[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        at_type = pos
        gtype = struct.unpack_from("<i", raw, pos)[0]
        pos += 4
        pos = _skip_value(raw, pos, gtype)
        keys[key] = (start, at_type, pos)
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", raw, at_type + 4)[0]
    kv_end, infos = pos, {}
    for _ in range(n_tensors):
        start = pos
        n = struct.unpack_from("<Q", raw, pos)[0]
        name = raw[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        n_dims = struct.unpack_from("<I", raw, pos)[0]
        pos += 4 + 8 * n_dims + 4
        infos[name] = (start, pos, pos + 8)
        pos += 8
    data = -(-pos // alignment) * alignment
    return Layout(n_tensors, n_kv, keys, infos, kv_end, pos, data, alignment)


def _skip_value(raw: bytes, pos: int, gtype: int) -> int:
    if gtype == STRING:
        return pos + 8 + struct.unpack_from("<Q", raw, pos)[0]
    if gtype == ARRAY:
        etype, count = struct.unpack_from("<iQ", raw, pos)
        pos += 12
        for _ in range(count if etype in (STRING, ARRAY) else 0):
            pos = _skip_value(raw, pos, etype)
        return pos if etype in (STRING, ARRAY) else pos + count * SIZES[etype]
    return pos + SIZES[gtype]


def patch(raw: bytes, at: int, fmt: str, *values) -> bytes:
    out = bytearray(raw)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


def rebuild(raw: bytes, *, extra_kv: bytes = b"", extra_kv_count: int = 1,
            extra_info: bytes = b"", extra_data: bytes = b"", drop_key: str | None = None,
            version: int | None = None) -> bytes:
    """The same file with KV entries and tensor infos added or a key removed: the data section
    is re-aligned after the header, its bytes unchanged (offsets are relative to it)."""
    lay = layout(raw)
    kvs = raw[24:lay.kv_end]
    n_kv = lay.n_kv
    if drop_key is not None:
        start, _, end = lay.keys[drop_key]
        kvs = raw[24:start] + raw[end:lay.kv_end]
        n_kv -= 1
    if extra_kv:
        kvs += extra_kv
        n_kv += extra_kv_count
    n_tensors = lay.n_tensors + (1 if extra_info else 0)
    head = (b"GGUF" + struct.pack("<Iqq", version or struct.unpack_from("<I", raw, 4)[0],
                                  n_tensors, n_kv)
            + kvs + raw[lay.kv_end:lay.info_end] + extra_info)
    head += b"\0" * (-len(head) % lay.alignment)
    return head + raw[lay.data_offset:] + extra_data
