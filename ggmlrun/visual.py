"""Terminal pictures with rich: the profile tables, each arena's occupancy, progress bars.

Rendering only: every number shown was computed in the core (core/profile.py,
core/occupancy.py); here it is formatted and coloured.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Callable, Iterator

from ggmlrun.core.util.fmt import human_bytes, is_terminal  # noqa: F401  (callers ask visual)
from ggmlrun.report.table import Bytes, Table, plain, seconds_text

if TYPE_CHECKING:     # rich loads when something is drawn, not on every command
    from rich.console import Console, Group

    from ggmlrun.core.observe.occupancy import ArenaPicture
    from ggmlrun.core.observe.profile import Profile


# --- numbers -----------------------------------------------------------------------------------
seconds = seconds_text


def rate(value: float | None, unit: str) -> str:
    """1.23 GFLOP/s, 4.56 GB/s: decimal prefixes, as rates are usually quoted."""
    if value is None:
        return "-"
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


# --- run --profile -----------------------------------------------------------------------------
def profile_tables(prof: Profile, by: str = "op") -> list[Table]:
    runs = f"{prof.repeat} run{'s' if prof.repeat > 1 else ''}"
    ops = Table(title=f"profile: compute by {by} ({runs}, {seconds(prof.compute_s)} measured)")
    ops.add_column({"op": "op", "node": "node", "shape": "op and shape"}[by])
    if by == "node":
        ops.add_column("op", drop=2)
    ops.add_column("backend")
    for col, drop in (("nodes", 3), ("calls", 4), ("total", 0), ("mean", 0), ("% compute", 0),
                      ("FLOP/s", 1)):
        ops.add_column(col, "right", number=True, drop=drop)
    for r in prof.ops:
        ops.add_row(r.name or r.op, *([r.op] if by == "node" else []), r.backend, str(r.nodes),
                    str(r.calls), seconds(r.total_s), seconds(r.mean_s), f"{100 * r.share:.1f}%",
                    rate(r.flops_per_s, "FLOP/s"))
    tables = [ops]
    if prof.copies:
        copies = Table(title=f"profile: copies by route ({runs}, {seconds(prof.copy_s)} measured)")
        copies.add_column("from")
        copies.add_column("to")
        for col in ("copies", "bytes", "total", "mean", "bandwidth"):
            copies.add_column(col, "right", number=True)
        for r in prof.copies:
            mean = r.total_s / r.count if r.total_s is not None and r.count else None
            copies.add_row(r.src, r.dst, str(r.count), Bytes(r.bytes), seconds(r.total_s),
                           seconds(mean), rate(r.bytes_per_s, "B/s"))
        tables.append(copies)
    return tables


# --- measure: arena occupancy ------------------------------------------------------------------
SHADES = " ░▒▓█"
SPARK = " ▁▂▃▄▅▆▇█"


def _shade(fraction: float) -> str:
    if fraction <= 0:
        return SHADES[0]
    return SHADES[min(len(SHADES) - 1, 1 + int(fraction * (len(SHADES) - 1) - 1e-9))]


def _spark(value: int, top: int) -> str:
    if value <= 0 or top <= 0:
        return SPARK[0]
    return SPARK[max(1, min(len(SPARK) - 1, round(value / top * (len(SPARK) - 1))))]


def arena_picture(pic: ArenaPicture) -> Group:
    """Address (up) by step (right): shaded where live slots sit; the arena's top is the peak the
    plan reserves, the marked row is where the lower bound falls; below, bytes live per column."""
    from rich.console import Group
    from rich.text import Text

    from ggmlrun.core.observe.dot import backend_colour

    colour = backend_colour(pic.buffer)
    share = pic.lower_bound / pic.arena_bytes if pic.arena_bytes else 1.0
    title = Text.assemble(
        (plain(pic.name), f"bold {colour}"),
        f" arena {human_bytes(pic.arena_bytes)} ({pic.arena_bytes:,} B)  ·  lower bound "
        f"{human_bytes(pic.lower_bound)} ({100 * share:.0f}% of the arena)  ·  "
        f"{pic.n_steps} steps")
    if pic.peak_step >= 0:
        title.append(f"  ·  most live at step {pic.peak_step} ({plain(pic.peak_tensor)})")
    labels = {pic.rows - 1: human_bytes(pic.arena_bytes), 0: "0"}
    if pic.lower_bound_row >= 0:
        labels[pic.lower_bound_row] = human_bytes(pic.lower_bound)
    pad = max(len(s) for s in labels.values()) + 1
    lines = [title]
    for row in range(pic.rows - 1, -1, -1):
        line = Text(labels.get(row, "").rjust(pad) + " ┤", style="dim")
        line.append("".join(_shade(f) for f in pic.cells[row]), style=colour)
        marks = []
        if row == pic.rows - 1:
            marks.append("arena (peak)")
        if row == pic.lower_bound_row:
            marks.append("lower bound")
        if marks:
            line.append(" ◀ " + ", ".join(marks), style="bold")
        lines.append(line)
    width = len(pic.columns)
    lines.append(Text(" " * pad + " └" + "─" * width, style="dim"))
    if pic.n_steps:
        first, last = "step 0", f"step {pic.n_steps - 1}"
        lines.append(Text(" " * (pad + 2) + first + last.rjust(max(width - len(first), 0)),
                          style="dim"))
    spark = "".join(_spark(v, pic.arena_bytes) for v in pic.live)
    live = Text("live".rjust(pad) + "  ", style="dim")
    live.append(spark, style=colour)
    live.append(" ◀ bytes live per step (top = arena)", style="dim")
    lines.append(live)
    return Group(*lines, Text(""))


def print_occupancy(console: Console, pictures: list[ArenaPicture], planner: str | None = None
                    ) -> None:
    from rich.text import Text

    if not pictures:
        return
    which = f" of the {planner} plan" if planner else ""
    console.print(Text(f"arena occupancy over the schedule{which} (shade = share of a cell's "
                       "bytes in use: ░ ▒ ▓ █)", style="italic"))
    for pic in pictures:
        console.print(arena_picture(pic))


# --- fit, measure MODEL: each device's memory as a stacked bar ---------------------------------
BAR_MARKS = {"weights": ("█", "cyan"), "KV": ("▓", "magenta"), "compute": ("▒", "yellow"),
             "margin": ("░", "dim"), "free": ("·", "green")}


def _bar_cells(segments: dict[str, int], scale: int, width: int) -> list[tuple[str, int]]:
    """Cells per segment out of `width`, by largest remainders, so the bar is exactly as wide
    as the bytes say (a segment with bytes gets at least one cell while cells remain)."""
    exact = {k: v * width / scale if scale else 0 for k, v in segments.items()}
    cells = {k: int(x) for k, x in exact.items()}
    for k in segments:
        if segments[k] > 0 and cells[k] == 0 and sum(cells.values()) < width:
            cells[k] = 1
    left = width - sum(cells.values())
    for k in sorted(exact, key=lambda k: exact[k] - int(exact[k]), reverse=True):
        if left <= 0:
            break
        if segments[k] > 0:
            cells[k] += 1
            left -= 1
    while sum(cells.values()) > width:         # the minimum cells overshot: take from the largest
        big = max(cells, key=cells.get)
        cells[big] -= 1
    return [(k, cells[k]) for k in segments]


def memory_bar_lines(bars: list[dict], width: int) -> list:
    """One line per backend (`GPU0 24.00 GiB ▕████▓▒░···▏`) and a legend, none wider than
    `width`: a label too long to leave a bar of 8 cells beside it goes on a line of its own
    above its bar, and the legend folds between its items."""
    from rich.text import Text

    if not bars:
        return []
    name_w = max(len(plain(b["name"])) for b in bars)
    size_w = max(len(human_bytes(b["memory_bytes"])) for b in bars)
    notes = [f" over by {human_bytes(b['over'])}" if b["over"] else "" for b in bars]
    note_w = max(len(n) for n in notes)
    label_w = name_w + size_w + 2                 # `NAME SIZE `
    apart = width - label_w - note_w - 2 < 8      # the label above its bar
    bar_w = max(8, width - note_w - 2 - (0 if apart else label_w))
    lines = []
    for b, note in zip(bars, notes):
        label = f"{plain(b['name']).ljust(name_w)} {human_bytes(b['memory_bytes']).rjust(size_w)} "
        if apart:
            lines.append(Text(label.rstrip()))
        line = Text("" if apart else label)
        scale = b["memory_bytes"] + b["over"]
        cells = [(BAR_MARKS[key], n) for key, n in _bar_cells(b["segments"], scale, bar_w)]
        marks = [(mark, style) for (mark, style), n in cells for _ in range(n)]
        if b["over"] and scale:          # where the memory ends: what lies past it does not fit
            edge = min(len(marks) - 1, round(b["memory_bytes"] / scale * bar_w))
            marks[edge] = ("┃", "bold red")
        line.append("▕")
        for mark, style in marks:
            line.append(mark, style=style)
        line.append("▏")
        if note:
            line.append(note, style="bold red")
        lines.append(line)
    keys = [(*BAR_MARKS[key], key) for key in BAR_MARKS]
    if any(b["over"] for b in bars):
        keys.append(("┃", "bold red", "memory ends"))
    return lines + _legend(keys, 0 if apart else label_w, width)


def _legend(keys: list[tuple[str, str, str]], indent: int, width: int) -> list:
    """`█ weights  ▓ KV  ...` under the bars (from `indent`, or from the left edge when the
    whole legend would not fit there), folded between items to the width."""
    from rich.text import Text

    items = [(mark, style, f" {key}") for mark, style, key in keys]
    total = sum(1 + len(key) for _, _, key in items) + 2 * (len(items) - 1)
    indent = indent if indent + total <= width else 0
    lines, line = [], Text(" " * indent)
    for mark, style, key in items:
        wide = len(line.plain) + (2 if line.plain.strip() else 0) + 1 + len(key)
        if line.plain.strip() and wide > width:
            lines.append(line)
            line = Text(" " * indent)
        if line.plain.strip():
            line.append("  ")
        line.append(mark, style=style)
        line.append(key)
    lines.append(line)
    return lines


def print_memory_bars(console: Console, bars: list[dict]) -> None:
    for line in memory_bar_lines(bars, console.width):
        console.print(line, highlight=False, soft_wrap=True)


# --- progress ----------------------------------------------------------------------------------
@contextlib.contextmanager
def run_progress(console: Console, total: int, what: str = "computing"
                 ) -> Iterator[Callable[[int], None] | None]:
    """A progress bar over `total` runs on stderr, only when stderr is a terminal and there is
    more than one run; yields the `progress(done)` callback the executor calls, or None."""
    if total <= 1 or not is_terminal(sys.stderr):
        yield None
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True)
    with bar:
        task = bar.add_task(what, total=total)
        yield lambda done: bar.update(task, completed=done)


@contextlib.contextmanager
def busy(console: Console, message: str) -> Iterator[None]:
    """A spinner on stderr while planning, only when stderr is a terminal."""
    if not is_terminal(sys.stderr):
        yield
        return
    with console.status(message):
        yield


# --- phases ------------------------------------------------------------------------------------
class Phases:
    """Wall time per phase (load, schedule, plan, data, compute): a spinner naming the phase
    while it runs and a line of times at the end, on stderr, when stderr is a terminal or
    --progress asks; `seconds` always, for --json's `phases`."""

    SHOW_AFTER_S = 1.0   # a line of times only for work a user waited for

    def __init__(self, console: Console, forced: bool = False):
        self.console = console
        self.show = forced or is_terminal(sys.stderr)
        self.forced = forced
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        import time

        start = time.perf_counter()
        status = self.console.status(f"ggmlrun: {name}") if self.show and is_terminal(sys.stderr) else None
        try:
            if status is None:
                yield
            else:
                with status:
                    yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def as_dict(self) -> dict:
        return {f"{name}_s": s for name, s in self.seconds.items()}

    def report(self) -> None:
        total = sum(self.seconds.values())
        if self.show and (self.forced or total >= self.SHOW_AFTER_S):
            from rich.text import Text

            self.console.print(Text("phases: " + ", ".join(
                f"{name} {seconds(s)}" for name, s in self.seconds.items())
                + f" (total {seconds(total)})", style="dim"), highlight=False)
