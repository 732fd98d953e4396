"""The one table type every command prints, and the text rules its cells follow.

Why its own module: every renderer (graph and model reports, `visual.py`) draws through
`Table`, which never cuts a number or a name at any terminal width and cleans every string
(control characters, rich markup) before rich sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ggmlrun.core.util.fmt import human_bytes

if TYPE_CHECKING:     # rich loads when a table is drawn, not on every command
    from rich.console import Console
    from rich.table import Table as RichTable


CONTROL = dict.fromkeys(c for c in range(0x20)) | {0x7f: None} | dict.fromkeys(range(0x80, 0xa0))


def plain(text: str) -> str:
    """Text without control characters: an escape code in a name never reaches the terminal."""
    return str(text).translate(CONTROL)


def clean(text: str) -> str:
    """Text safe for a terminal and for rich: control characters (escape codes) removed, markup
    escaped, so names like `[/]` or `\x1b[2J` print as what they are and never act."""
    from rich.markup import escape

    return escape(plain(text))


@dataclass
class Column:
    header: str
    justify: str = "left"
    number: bool = False     # never wrapped nor cut
    drop: int = 0            # > 0: may be dropped on a narrow terminal, the highest first


class Bytes(int):
    """A byte count cell: exact (1,064,960) when the table fits, else in MiB/GiB (coarsened)."""


class Table:
    """A table that never cuts a number or a name, at any terminal width.

    It is laid out when printed, for the console's width: numbers never wrap; when the table is
    too wide, byte counts first go from exact to MiB/GiB, then optional columns go (the highest
    `drop` first), and names fold onto more lines rather than losing characters. Every string
    is cleaned (control characters, markup) before it reaches rich.
    """

    def __init__(self, title: str = ""):
        self.title = title
        self.columns: list[Column] = []
        self.rows: list[list] = []

    def add_column(self, header: str, justify: str = "left", number: bool = False, drop: int = 0):
        self.columns.append(Column(header, justify, number, drop))

    def add_row(self, *cells) -> None:
        self.rows.append(list(cells))

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def __rich_console__(self, console, options):
        yield self.layout(options.max_width)

    def layout(self, width: int) -> RichTable:
        from rich.table import Table as RichTable

        keep = list(range(len(self.columns)))
        exact = True
        if self._width(keep, exact) > width:
            exact = False
        for i in sorted((i for i in keep if self.columns[i].drop),
                        key=lambda i: -self.columns[i].drop):
            if self._width(keep, exact) <= width:
                break
            keep.remove(i)
        title = clean(self.title)
        table = RichTable(title=title or None, min_width=min(len(self.title), width))
        for i in keep:
            col = self.columns[i]
            table.add_column(clean(col.header), justify=col.justify, no_wrap=col.number,
                             overflow="fold")
        for row in self.rows:
            table.add_row(*(self._cell(row[i], exact) for i in keep))
        return table

    @staticmethod
    def _plain(value, exact: bool) -> str:
        if isinstance(value, Bytes):
            return f"{value:,}" if exact else human_bytes(value)
        return plain(value)

    def _cell(self, value, exact: bool) -> str:
        from rich.markup import escape

        return escape(self._plain(value, exact))

    def _width(self, keep: list[int], exact: bool) -> int:
        """Width with nothing wrapped: each column's widest cell, padding 2 and a rule 1."""
        total = 1
        for i in keep:
            cells = [len(self._plain(row[i], exact)) for row in self.rows]
            total += max([len(self.columns[i].header)] + cells) + 3
        return total


def pack_line(prefix: str, items: list[str], width: int = 80) -> list[str]:
    """`prefix item item ...` on as few lines as fit the width, breaking only between items
    (a number and its unit, a name, stay on one line); later lines indent under the first."""
    lines, line = [], prefix
    indent = " " * (len(prefix) + 1)
    for item in items:
        if len(line) + 1 + len(item) > width and line.strip() and line != prefix:
            lines.append(line)
            line = indent + item
        else:
            line = f"{line} {item}"
    lines.append(line)
    return lines


def seconds_text(s: float | None) -> str:
    """Seconds, in the unit that reads best."""
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def print_tables(console: Console, *tables) -> None:
    for table in tables:
        console.print(table)
