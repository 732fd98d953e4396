"""A GGUF file's header, read and checked as ggml's gguf.cpp (`gguf_init_from_reader`) and
llama.cpp's model loader check it, with plain `struct` reads through gguf_reader's
BoundedReader.

Every count and length is checked against the bytes left in the file before anything is
allocated or looped over; arrays are skipped by their size (string arrays by a walk of their
lengths) unless they are small and outside `tokenizer.` (the vocabulary's length is all a model
needs of it); nested arrays, duplicate keys and tensor names, names of 64 bytes or more,
unknown types, more than 4 dimensions, element counts past int64 and data offsets other than
gguf.cpp's running aligned sum are refused, as is a tensor whose data runs past the end of the
file (the loader's "not within the file bounds"). A big-endian file is named as such. Every
failure is an `InputError` (exit 2): one line naming the file and the key or tensor.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

from ggmlrun.core.ir.types import BY_ID
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.fmt import clip
from ggmlrun.models.gguf.reader import BoundedReader

MAGIC = b"GGUF"
VERSIONS = (2, 3)                 # gguf.cpp: v1 "no longer supported", above 3 unknown
MAX_ARRAY = 1 << 30               # GGUF_MAX_ARRAY_ELEMENTS
MAX_NAME = 64                     # GGML_MAX_NAME, the NUL included
MAX_DIMS = 4                      # GGML_MAX_DIMS
INT64_MAX = (1 << 63) - 1
SIZE_MAX = (1 << 64) - 1
DEFAULT_ALIGNMENT = 32            # GGUF_DEFAULT_ALIGNMENT
DECODED_ARRAY_MAX = 4096          # longer arrays, and tokenizer.* ones, keep their length only

STRING, ARRAY = 8, 9
# gguf_type -> (name, struct code); strings and arrays are read by hand
SCALARS = {0: ("u8", "B"), 1: ("i8", "b"), 2: ("u16", "H"), 3: ("i16", "h"), 4: ("u32", "I"),
           5: ("i32", "i"), 6: ("f32", "f"), 7: ("bool", "?"), 10: ("u64", "Q"),
           11: ("i64", "q"), 12: ("f64", "d")}
_ONE = {code: struct.Struct("<" + fmt) for code, (_, fmt) in SCALARS.items()}


@dataclass(frozen=True)
class UnreadArray:
    """An array the header reader skipped: its element type and length, not its items."""
    type: str
    count: int

    def __len__(self) -> int:
        return self.count


class Metadata(dict):
    """Key -> value, as stored; `types` gives each key's GGUF type ("u32", "str", "arr[i32]"),
    for checks as strict as llama.cpp's get_key (a u32 key stored as i32 is refused there)."""

    def __init__(self):
        super().__init__()
        self.types: dict[str, str] = {}


@dataclass(frozen=True)
class HeaderTensor:
    name: str
    ne: tuple[int, ...]           # ggml order, n_dims entries
    type_id: int
    offset: int                   # absolute byte offset of the data in the file
    nbytes: int


@dataclass(frozen=True)
class FileStamp:
    """What `run` compares before it maps the file and after it has read it."""
    size: int
    mtime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, st: os.stat_result) -> "FileStamp":
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


@dataclass
class GGUFHeader:
    path: str
    version: int
    stamp: FileStamp | None                       # None: a remote file's, or a cached header
    alignment: int
    data_offset: int                              # where the data section starts
    data_end: int                                 # the last tensor byte + 1 (data_offset if none)
    kv: Metadata = field(default_factory=Metadata)   # key -> int/float/bool/str/list/UnreadArray
    tensors: list[HeaderTensor] = field(default_factory=list)
    header_end: int = 0                           # the end of the tensor infos: all that is read
    size: int = 0                                 # the whole file's bytes

    @property
    def kv_types(self) -> dict[str, str]:                # key -> "u32", "str", "arr[f32]", ...
        return self.kv.types


def shown(name: str) -> str:
    """A key or tensor name as a message shows it: clipped, control characters escaped."""
    text = clip(name)
    return text if text.isprintable() else "".join(
        c if c.isprintable() else repr(c)[1:-1] for c in text)

def _text(raw: bytes, what: str, r: BoundedReader, culprit: str | None = None) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise r.fail(f"{what} is not UTF-8 text", culprit) from None


def _value(r: BoundedReader, key: str, gtype: int):
    """One key's value (type already read): (value, type name)."""
    culprit = f"key '{shown(key)}'"
    if gtype in SCALARS:
        return r.unpack(_ONE[gtype], "its value", culprit), SCALARS[gtype][0]
    if gtype == STRING:
        return r.raw_string("its string", culprit).decode("utf-8", "replace"), "str"
    if gtype != ARRAY:
        raise r.fail(f"invalid GGUF value type {gtype}", culprit)
    etype = r.i32("its array's element type", culprit)
    count = r.u64("its array's length", culprit)
    if etype == ARRAY:
        raise r.fail("an array of arrays; gguf.cpp refuses nested arrays", culprit)
    if etype != STRING and etype not in SCALARS:
        raise r.fail(f"array of invalid GGUF type {etype}", culprit)
    name = "str" if etype == STRING else SCALARS[etype][0]
    if count > MAX_ARRAY:
        raise r.fail(f"array of {count} items; gguf.cpp's limit is {MAX_ARRAY}", culprit)
    item = 8 if etype == STRING else _ONE[etype].size     # a string's least: its length
    if r.pos + count * item > r.size:
        raise r.truncated(r.pos + count * item, f"its array of {count} {name}", culprit)
    r.expect(r.pos + count * item)          # at least this much: the items, or their lengths
    if count > DECODED_ARRAY_MAX or key.startswith("tokenizer."):
        if etype == STRING:
            r.skip_strings(count, culprit)
        else:
            r.skip(count * item, f"its array of {count} {name}", culprit)
        return UnreadArray(name, count), f"arr[{name}]"
    if etype == STRING:
        items = [r.raw_string(f"string {i}", culprit).decode("utf-8", "replace")
                 for i in range(count)]
    else:
        at = r.need(count * item, f"its array of {count} {name}", culprit)
        items = list(struct.unpack_from(f"<{count}{SCALARS[etype][1]}", r.buf, at))
    return items, f"arr[{name}]"


def read_header(path) -> GGUFHeader:
    path = str(path)
    try:
        handle = open(path, "rb")
    except OSError as err:
        raise InputError(f"cannot open: {err.strerror or err}", file=path) from None
    with handle:
        st = os.fstat(handle.fileno())
        return read_header_from(handle, st.st_size, path, FileStamp.of(st))


def read_header_from(handle, size: int, name: str, stamp: FileStamp | None = None,
                     chunk: int | None = None) -> GGUFHeader:
    """The header through any seek/read handle of a file `size` bytes long: a local file, a
    remote one read by ranges, or a cached header (its bytes up to the tensor infos' end)."""
    r = BoundedReader(handle, size, name) if chunk is None else BoundedReader(handle, size, name,
                                                                               chunk)
    return _read(r, stamp)


def _read(r: BoundedReader, stamp: FileStamp | None) -> GGUFHeader:
    at = r.need(4, "the magic")
    if r.buf[at:at + 4] != MAGIC:
        raise r.fail(f"not a GGUF file: it starts with {bytes(r.buf[at:at + 4])!r}, not b'GGUF'")
    version = r.u32("the version")
    if version and not version & 0xFFFF:
        raise r.fail(f"a big-endian GGUF file (its version reads {version:#010x}); ggmlrun, like "
                     f"llama.cpp on a little-endian machine, reads little-endian files only")
    if version not in VERSIONS:
        raise r.fail(f"GGUF version {version} is not supported (versions "
                     f"{', '.join(map(str, VERSIONS))}; gguf.cpp no longer reads version 1)")
    n_tensors = r.i64("the tensor count")
    n_kv = r.i64("the key count")
    for count, what in ((n_tensors, "tensors"), (n_kv, "keys")):
        if count < 0:
            raise r.fail(f"the header declares {count} {what}")
    least = r.pos + n_kv * 13 + n_tensors * 24     # the fewest bytes a key and a tensor take
    if least > r.size:
        raise r.truncated(least, f"{n_kv} keys and {n_tensors} tensors")
    r.expect(least)
    header = GGUFHeader(path=r.path, version=version, stamp=stamp, alignment=DEFAULT_ALIGNMENT,
                        data_offset=0, data_end=0, size=r.size)
    kv, kv_types = header.kv, header.kv.types
    for i in range(n_kv):
        key = _text(r.raw_string(f"key {i}"), f"key {i}", r)
        if not key:
            raise r.fail(f"key {i} is empty")
        if key in kv:
            raise r.fail(f"duplicate key '{shown(key)}' (key {i})")
        gtype = r.i32("its value type", f"key '{shown(key)}'")
        kv[key], kv_types[key] = _value(r, key, gtype)
    if "general.alignment" in kv:
        if kv_types["general.alignment"] != "u32":
            raise r.fail(f"must be of type u32 but is {kv_types['general.alignment']}",
                         "key 'general.alignment'")
        header.alignment = kv["general.alignment"]
        if header.alignment == 0 or header.alignment & (header.alignment - 1):
            raise r.fail(f"alignment {header.alignment} is not a power of 2",
                         "key 'general.alignment'")
    names, start = set(), r.pos
    for i in range(n_tensors):
        if i and not i % 64:        # the infos left, as long as those read so far on average
            r.expect(r.pos + (n_tensors - i) * ((r.pos - start) // i))
        header.tensors.append(_tensor_info(r, i, names))
    return _place_data(r, header)


def _tensor_info(r: BoundedReader, i: int, names: set) -> HeaderTensor:
    raw = r.raw_string(f"tensor {i}'s name")
    if len(raw) >= MAX_NAME:
        raise r.fail(f"tensor {i}'s name is {len(raw)} bytes long; ggml's limit is "
                     f"{MAX_NAME - 1} (GGML_MAX_NAME {MAX_NAME} with its NUL)",
                     f"tensor '{shown(raw.decode('utf-8', 'replace'))}'")
    name = _text(raw, f"tensor {i}'s name", r)
    culprit = f"tensor '{shown(name)}'"
    if name in names:
        raise r.fail(f"duplicate tensor name (tensor {i})", culprit)
    names.add(name)
    n_dims = r.u32("its dimension count", culprit)
    if n_dims > MAX_DIMS:
        raise r.fail(f"{n_dims} dimensions; ggml has at most {MAX_DIMS}", culprit)
    ne = tuple(r.i64(f"dimension {j}", culprit) for j in range(n_dims))
    if any(n < 0 for n in ne):
        raise r.fail(f"a negative dimension in {list(ne)}", culprit)
    count = 1
    for n in ne:
        count *= n
    if count > INT64_MAX:
        raise r.fail(f"shape {list(ne)} has more than INT64_MAX elements", culprit)
    type_id = r.i32("its type", culprit)
    gtype = BY_ID.get(type_id)
    if gtype is None:
        raise r.fail(f"invalid ggml type {type_id}", culprit)
    row = ne[0] if ne else 1
    if row % gtype.block_size:
        raise r.fail(f"type {gtype.name} has {row} elements per row, not a multiple of its "
                     f"block size {gtype.block_size}", culprit)
    nbytes = count // gtype.block_size * gtype.type_size
    if nbytes > SIZE_MAX:
        raise r.fail(f"shape {list(ne)} of {gtype.name} is more than SIZE_MAX bytes", culprit)
    offset = r.u64("its data offset", culprit)
    return HeaderTensor(name, ne, type_id, offset, nbytes)


def _place_data(r: BoundedReader, header: GGUFHeader) -> GGUFHeader:
    """gguf.cpp: the data section starts at the next aligned byte, and tensor i's offset is
    exactly the aligned sum of the sizes before it (so in order, aligned, never overlapping);
    the loader: each tensor's data lies within the file."""
    align = header.alignment
    header.header_end = r.pos
    start = r.pos if not header.tensors else -(-r.pos // align) * align
    if start > r.size:
        raise r.truncated(start, "the data section's start")
    header.data_offset = header.data_end = start
    expected = 0
    for i, t in enumerate(header.tensors):
        culprit = f"tensor '{shown(t.name)}'"
        if t.offset != expected:
            raise r.fail(f"data offset {t.offset}, expected {expected}: gguf.cpp requires each "
                         f"tensor at the aligned end of the one before (alignment {align}; no "
                         f"gap, overlap or other order)", culprit)
        padded = -(-t.nbytes // align) * align
        if expected + padded > SIZE_MAX:
            raise r.fail(f"the data section's size overflows at tensor {i}", culprit)
        end = start + expected + t.nbytes
        if end > r.size:
            raise r.truncated(end, f"its data ({t.nbytes} bytes from byte {start + expected})",
                              culprit)
        header.tensors[i] = HeaderTensor(t.name, t.ne, t.type_id, start + expected, t.nbytes)
        header.data_end = end
        expected += padded
    _check_padding(r, header, header.header_end, start, "before the data section")
    if header.stamp is not None:     # a local file: what follows the data is read too
        padded_end = -(-start // align) * align + expected    # gguf pads even after none
        _check_padding(r, header, max(padded_end, header.data_end), r.size, "after the data")
    return header


TRAILING_LIMIT = 64 << 20       # zero bytes after the data that are read to be sure of them


def _check_padding(r: BoundedReader, header: GGUFHeader, begin: int, end: int,
                   where: str) -> None:
    """The bytes from `begin` to `end` are padding: zeros, as gguf writes them. A tensor count
    one short leaves the last tensor's description where the padding should be and its data
    after the data section (every weight then read early, the last tensor taken for a tied
    output): both are other bytes. Zeros past the data (a tool padding the file) are
    accepted, up to TRAILING_LIMIT bytes read; more is refused as well."""
    if end <= begin:
        return
    bad = end - begin > TRAILING_LIMIT
    at = begin
    if not bad:
        r.f.seek(begin)
        while at < end and not bad:
            chunk = r.f.read(min(1 << 20, end - at))
            if not chunk:
                break
            bad = chunk.count(0) != len(chunk)
            at += len(chunk)
    if bad:
        raise r.fail(f"{end - begin} bytes {where} (bytes {begin} to {end} of {r.size}) are not "
                     f"gguf's zero padding: the header does not describe this file (a tensor "
                     f"count one short reads every tensor early)",
                     f"its {len(header.tensors)} tensors")
