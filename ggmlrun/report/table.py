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


class Items(tuple):
    """A cell of several items, each a string or a (name, tail) pair such as
    ("w", "(128.00 KiB from CPU)"): packed into lines of the column's width between items;
    an item too long for a line puts its tail on a line of its own (a number stays with its
    unit), and only a name longer than the column folds."""

    @staticmethod
    def text(item) -> str:
        return " ".join(plain(part) for part in item) if isinstance(item, tuple) else plain(item)

    def least(self) -> int:
        """The narrowest column this cell needs: its longest tail (or plain item), and its
        longest name up to MAX_TOKEN."""
        need = 1
        for item in self:
            if isinstance(item, tuple):
                head, tail = plain(item[0]), plain(item[1])
                need = max(need, len(tail) + 1, min(len(head), MAX_TOKEN))
            else:
                need = max(need, min(len(plain(item)) + 1, MAX_TOKEN))
        return need

    def lines(self, width: int) -> list[str]:
        lines: list[str] = []
        for k, item in enumerate(self):
            comma = "," if k < len(self) - 1 else ""
            text = self.text(item) + comma
            if lines and len(lines[-1]) + 1 + len(text) <= width:
                lines[-1] += " " + text
            elif len(text) <= width:
                lines.append(text)
            elif isinstance(item, tuple):
                head, tail = plain(item[0]), plain(item[1]) + comma
                lines += [head[j:j + width] for j in range(0, len(head), width)] or [""]
                lines.append(tail)
            else:
                lines += [text[j:j + width] for j in range(0, len(text), width)]
        return lines


MAX_TOKEN = 40           # a name longer than this may fold (onto more lines, never cut)


class Table:
    """A table that never cuts a number or a name, at any terminal width.

    It is laid out when printed, for the console's width: numbers never wrap; when the table is
    too wide, byte counts first go from exact to MiB/GiB, then optional columns go (the highest
    `drop` first, and a line under the table names them), and text columns wrap between words
    only (a word, a name, up to 40 characters, is never broken; an `Items` cell breaks between
    its items only). Every string is cleaned (control characters, markup) before it reaches
    rich.
    """

    def __init__(self, title: str = ""):
        self.title = title
        self.columns: list[Column] = []
        self.rows: list[list] = []
        self.dropped: list[str] = []      # the columns the last layout left out

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
        self.dropped = [self.columns[i].header for i in range(len(self.columns)) if i not in keep]
        widths = self._fitted_widths(keep, exact, width)
        title = clean(self.title)
        caption = (clean(f"left out at {width} columns: {', '.join(self.dropped)}")
                   if self.dropped else None)
        table = RichTable(title=title or None, caption=caption, caption_justify="left",
                          min_width=min(len(self.title), width))
        for i, w in zip(keep, widths):
            col = self.columns[i]
            table.add_column(clean(col.header), justify=col.justify, no_wrap=col.number,
                             overflow="fold", width=w)
        for row in self.rows:
            table.add_row(*(self._cell(row[i], exact, w) for i, w in zip(keep, widths)))
        return table

    def _fitted_widths(self, keep: list[int], exact: bool, width: int) -> list[int | None]:
        """None (rich's own widths) when the table fits; else each text column gets at least
        its longest word (or item) and the room left is shared out, so rich never has to cut."""
        if self._width(keep, exact) <= width:
            return [None] * len(keep)
        natural = [self._natural(i, exact) for i in keep]
        least = [n if self.columns[i].number else self._longest_word(i, exact)
                 for i, n in zip(keep, natural)]
        room = width - (1 + sum(w + 3 for w in least))
        widths = list(least)
        grow = [k for k, i in enumerate(keep) if not self.columns[i].number]
        while room > 0 and grow:
            grow = [k for k in grow if widths[k] < natural[k]]
            for k in grow:
                if room <= 0:
                    break
                widths[k] += 1
                room -= 1
        return widths

    @staticmethod
    def _plain(value, exact: bool, width: int | None = None) -> str:
        if isinstance(value, Bytes):
            return f"{value:,}" if exact else human_bytes(value)
        if isinstance(value, Items):
            if width is None:
                return ", ".join(Items.text(item) for item in value)
            return "\n".join(value.lines(width))
        return plain(value)

    def _cell(self, value, exact: bool, width: int | None = None) -> str:
        from rich.markup import escape

        return escape(self._plain(value, exact, width))

    def _natural(self, i: int, exact: bool) -> int:
        cells = [self._plain(row[i], exact) for row in self.rows]
        return max([len(self.columns[i].header)] + [len(c) for c in cells])

    def _longest_word(self, i: int, exact: bool) -> int:
        """The narrowest a text column may be: its longest word, an Items cell's longest item
        (at most MAX_TOKEN: longer names fold), and its header's longest word."""
        words = self.columns[i].header.split()
        least = 1
        for row in self.rows:
            value = row[i]
            if isinstance(value, Items):
                least = max(least, value.least())
            else:
                words += self._plain(value, exact).split()
        return max(least, min(MAX_TOKEN, max((len(w) for w in words), default=1)))

    def _width(self, keep: list[int], exact: bool) -> int:
        """Width with nothing wrapped: each column's widest cell, padding 2 and a rule 1."""
        return 1 + sum(self._natural(i, exact) + 3 for i in keep)

    def least_width(self, keep: list[int] | None = None, exact: bool = False) -> int:
        """The narrowest this table can be drawn without cutting a number or a word."""
        keep = list(range(len(self.columns))) if keep is None else keep
        return 1 + sum((self._natural(i, exact) if self.columns[i].number
                        else self._longest_word(i, exact)) + 3 for i in keep)


def seconds_text(s: float | None) -> str:
    """Seconds, in the unit that reads best."""
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


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


def print_tables(console: Console, *tables) -> None:
    for table in tables:
        console.print(table)
