"""MiniMalloc's CSV format for `ggmlrun pack`: buffers (id, lower, upper, size) in, the same
rows with an `offset` column out. Every error names the file and the line; the planner itself
(pack) reads no files.
"""

from __future__ import annotations

import csv
import io
import os

from ggmlrun.core.memory.pack import Buffer
from ggmlrun.core.util.atomic import write_atomic
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.fmt import clip
from ggmlrun.core.util.inputs import read_text
from ggmlrun.core.util.numbers import MAX_BYTES, checked_int

MAX_TOTAL_BYTES = 1 << 62        # the sizes' sum: every offset and peak stays exact in int64


_COLUMNS = ("id", "lower", "upper", "size")


def read_csv(path) -> list[Buffer]:
    """Buffers from MiniMalloc's CSV format; errors name the file and the line."""
    path = os.fspath(path)
    text = read_text(path, "CSV file")
    if text.startswith("\ufeff"):      # a UTF-8 byte order mark (Excel, Windows editors)
        text = text[1:]
    try:
        return _read_rows(io.StringIO(text, newline=""), path)
    except csv.Error as err:     # a field past csv's limit, a NUL byte, a broken quote
        raise InputError(f"malformed CSV: {clip(err)}", file=path) from None


def _read_rows(handle, path) -> list[Buffer]:
    reader = csv.reader(handle)
    header = next(reader, None)
    if header is None:
        raise InputError("empty file; expected a header 'id,lower,upper,size'", file=path,
                         line=1)
    header = [h.strip() for h in header]
    missing = [c for c in _COLUMNS if c not in header]
    if missing:
        raise InputError(f"header lacks column(s) {', '.join(missing)}; "
                         f"expected 'id,lower,upper,size'", file=path, line=1)
    cols = [header.index(c) for c in _COLUMNS]
    buffers, seen, total = [], {}, 0
    for row in reader:
        line = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        buf = _parse_row(row, cols, path, line)
        if buf.id in seen:
            raise InputError(f"buffer id {buf.id!r} repeats the one on line {seen[buf.id]}",
                             file=path, line=line)
        seen[buf.id] = line
        buffers.append(buf)
        total += buf.size
    if total > MAX_TOTAL_BYTES:     # keeps every offset and peak exact in int64 arithmetic
        raise InputError(f"the sizes add up to {total} bytes, more than 2**62; no memory is "
                         "that large", file=path)
    return buffers


def _parse_row(row, cols, path, line):
    if len(row) <= max(cols):
        raise InputError(f"expected at least {max(cols) + 1} fields, got {len(row)}",
                         file=path, line=line)
    ident = row[cols[0]].strip()
    if not ident:
        raise InputError("empty id", file=path, line=line)
    values = []
    shown = clip(ident)
    for name, c in zip(_COLUMNS[1:], cols[1:]):
        try:
            values.append(checked_int(row[c], f"buffer '{shown}': {name}", 0, MAX_BYTES))
        except ValueError as err:
            raise InputError(str(err), file=path, line=line) from None
    try:
        return Buffer(ident, *values)
    except ValueError as e:
        raise InputError(str(e), file=path, line=line) from None


def write_csv(path, buffers, offsets) -> None:
    """The rows back with an `offset` column; atomic, so a crash never leaves half a file."""
    rows = io.StringIO(newline="")
    writer = csv.writer(rows)
    writer.writerow([*_COLUMNS, "offset"])
    for b in buffers:
        writer.writerow([b.id, b.lower, b.upper, b.size, offsets[b.id]])
    write_atomic(path, lambda handle: handle.write(rows.getvalue().encode()))
