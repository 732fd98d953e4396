"""Every model command drawn at 80, 100 and 140 columns (COLUMNS, as a user's terminal sets
it): no line wider than the terminal, no number or unit cut or split, no word of a name cut,
and a line naming every column left out."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.report.table import MAX_TOKEN, Table

ROOT = Path(__file__).resolve().parent.parent
TINY = "examples/models/tiny-llama-q8_0.gguf"           # relative: the tests run in ROOT
CARD_70B = "ggmlrun/models/cards/llama-3-70b-q4_k_m.yaml"

COMMANDS = {
    "validate": ("validate", TINY),
    "plan": ("plan", TINY, "--ngl", "2", "--dump-splits"),
    "measure": ("measure", TINY, "--ngl", "2"),
    "measure-70b": ("measure", CARD_70B, "--gpu", "24GiB", "--ram", "32GiB", "--ngl", "42",
                    "--ctx", "8192"),
    "run": ("run", TINY, "--tokens", "1,72,101", "--ngl", "2", "--profile"),
    "fit-70b": ("fit", CARD_70B, "--gpu", "24GiB", "--ram", "64GiB", "--ctx", "8192",
                "--flash-attn", "on", "--kv-type", "q8_0"),
    "fit-70b-two": ("fit", CARD_70B, "--gpu", "24GiB,12GiB", "--ram", "64GiB", "--ctx", "8192",
                    "--flash-attn", "on", "--kv-type", "q8_0"),
    "fit-nothing": ("fit", CARD_70B, "--gpu", "8GiB", "--ram", "16GiB"),
}


def _cell_text(cell) -> str:
    from rich.text import Text

    return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)


@pytest.mark.parametrize("width", [80, 140])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_model_command_at_width(name, width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.chdir(ROOT)
    from ggmlrun.cli import common

    common.stdout.cache_clear()
    drawn: list[tuple[Table, int]] = []
    original = Table.__rich_console__

    def record(self, console, options):
        drawn.append((self, options.max_width))
        yield from original(self, console, options)

    monkeypatch.setattr(Table, "__rich_console__", record)
    try:
        code, out, err = invoke(*COMMANDS[name])
    finally:
        common.stdout.cache_clear()
    assert code in (0, 1), err
    lines = out.splitlines()
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, f"{name} at {width}: {too_wide[0]!r}"
    assert name == "validate" or drawn, "no table drawn"
    for table, max_width in drawn:
        rich_table = table.layout(max_width)
        for column in rich_table.columns:
            header = _cell_text(column.header)
            assert any(header in line for line in lines), f"header {header!r} cut"
            ours = next(c for c in table.columns if c.header == header)
            for cell in column._cells:
                for piece in _cell_text(cell).split("\n"):
                    if ours.number:          # a number and its unit, whole, on one line
                        assert any(piece in line for line in lines), \
                            f"{name} at {width}: {piece!r} cut or split"
                    else:                    # every word of a name, whole
                        for word in piece.split():
                            if len(word) <= MAX_TOKEN:
                                assert any(word in line for line in lines), \
                                    f"{name} at {width}: {word!r} cut"
        if table.dropped:
            said = f"left out at {max_width} columns: {', '.join(table.dropped)}"
            assert any(said in line for line in lines), said


def test_fit_bar_fits_and_says_what_it_shows(monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, _ = invoke("fit", CARD_70B, "--gpu", "24GiB,12GiB", "--ram", "64GiB")
    bars = [line for line in out.splitlines() if "▕" in line]
    assert [b.split()[0] for b in bars] == ["GPU0", "GPU1", "CPU"]
    assert any("█ weights" in line and "▓ KV" in line and "▒ compute" in line
               and "░ margin" in line and "· free" in line for line in out.splitlines())


def test_memory_bar_cells_add_up():
    from ggmlrun.visual import _bar_cells

    for segments, width in (({"a": 1, "b": 10**12, "c": 0}, 10), ({"a": 5, "b": 5}, 7),
                            ({"a": 1, "b": 1, "c": 1, "d": 1}, 2)):
        cells = _bar_cells(segments, sum(segments.values()), width)
        assert sum(n for _, n in cells) == width
        assert all(n == 0 for k, n in cells if segments[k] == 0)


def test_table_drops_and_says_so():
    from rich.console import Console

    table = Table(title="t")
    table.add_column("name")
    table.add_column("optional", "right", number=True, drop=1)
    table.add_column("bytes", "right", number=True)
    table.add_row("x" * 30, "1,234,567,890", "9,876,543,210")
    console = Console(width=50, file=io.StringIO(), record=True)
    console.print(table)
    text = console.export_text()
    assert "left out at 50 columns: optional" in text and "9,876,543,210" in text


def test_bar_marks_where_memory_ends_when_over(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "80")
    from ggmlrun.cli import common

    common.stdout.cache_clear()
    try:
        code, out, _ = invoke("measure", CARD_70B, "--gpu", "24GiB", "--ram", "16GiB",
                              "--ngl", "50", "--flash-attn", "off", "--parallel", "1")
    finally:
        common.stdout.cache_clear()
    assert code == 1
    gpu = next(line for line in out.splitlines() if line.startswith("GPU0"))
    assert "┃" in gpu and gpu.endswith("over by 1.49 GiB") and len(gpu) <= 80
    assert "┃ memory ends" in out


def _rows(name: str, memory: int, over: int):
    """A device row of `memory` bytes short by `over` (0: it fits), and a large host."""
    from types import SimpleNamespace

    def row(name, kind, memory, weights, kv, compute, margin):
        used = weights + kv + compute
        return SimpleNamespace(name=name, kind=kind, weights_bytes=weights, kv_bytes=kv,
                               state_bytes=0, arena_bytes=compute, memory_bytes=memory,
                               margin_bytes=margin, total_bytes=used,
                               free_bytes=memory - used - margin, fits=used + margin <= memory,
                               mapped_bytes=weights, repack_bytes=0, output_bytes=2**20)
    return [row(name, "sim", memory, memory // 2 + over, memory // 8, memory // 16, 2**30),
            row("CPU", "cpu", 512 * 2**30, 2**30, 0, 2**30, 0)]


@pytest.mark.parametrize("width", [80, 120])
def test_memory_picture_fits_80_and_120_columns(width):
    """Issue 30: fit's and measure's memory picture (the table, each backend's bar, the legend,
    the host's line) drawn on a console of that width, whatever the names and sizes: no line
    wider, every name, size and legend item whole."""
    from types import SimpleNamespace

    from rich.console import Console

    from ggmlrun import visual
    from ggmlrun.report import model as report

    GiB = 2**30
    for name in ("GPU0", "RPC1", "NVIDIA_GeForce_RTX_4090_0", "D" * 40):
        for memory in (GiB, 24 * GiB, 1000 * GiB, 3 * 2**40):
            for over in (0, 5 * GiB, 900 * GiB):
                rows = _rows(name, memory, over)
                result = SimpleNamespace(ngl=81, n_layer=80, fits=not over, shown_ngl=81,
                                         n_cpu_moe=None, tensor_split=(80, 15), backends=rows,
                                         ctx=8192, probes=[(81, 8192)], probe_reserved=None,
                                         seconds=0.5, measure=None)
                console = Console(width=width, file=io.StringIO(), record=True)
                console.print(report.fit_table(SimpleNamespace(name="Llama-3-70B Q4_K_M"),
                                               result))
                bars = report.memory_bars(rows)
                visual.print_memory_bars(console, bars)
                for line in report.host_lines(rows, False, width):
                    console.print(line, soft_wrap=True, highlight=False)
                lines = console.export_text().splitlines()
                case = (name, memory, over)
                assert all(len(line) <= width for line in lines), (case, max(lines, key=len))
                for b in bars:
                    shown = f"{b['name']} {human_bytes(b['memory_bytes'])}"
                    assert any(" ".join(line.split()).startswith(shown) for line in lines), case
                legend = " ".join(lines)
                for key in ("█ weights", "▓ KV", "▒ compute", "░ margin", "· free"):
                    assert key in legend, (case, key)
                assert ("┃ memory ends" in legend) == any(b["over"] for b in bars)
