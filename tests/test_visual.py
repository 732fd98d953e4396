"""The arena occupancy grid (core), its picture under `measure`, `run --profile`, progress."""

import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from ggmlrun import visual
from ggmlrun.core import engine
from ggmlrun.core.frontend.loader import load_graph
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.observe.occupancy import live_bytes, occupancy, step_columns
from ggmlrun.core.sched.scheduler import Scheduler
from tests.randgraph import random_backends, random_graph
from tests.clikit import invoke

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = sorted((ROOT / "graphs").glob("*.yaml"))



def planned(graph, planner="ggml"):
    g = load_graph(graph)
    sched = engine.schedule(g, engine.resolve_backends(g, None))
    plan, _ = engine.plan_memory(sched, planner)
    return sched, plan


# --- the grid ----------------------------------------------------------------------------------
@pytest.mark.parametrize("planner", ["ggml", "best"])
@pytest.mark.parametrize("graph", GRAPHS, ids=lambda p: p.stem)
def test_grid_never_exceeds_the_arena_and_marks_the_lower_bound(graph, planner):
    sched, plan = planned(graph, planner)
    live = live_bytes(sched, plan)
    n_steps = len(sched.execution_steps())
    for pic in occupancy(sched, plan, width=64, height=10):
        b = pic.buffer
        assert pic.arena_bytes == plan.arena_bytes[b] > 0
        assert pic.cells.shape == (10, 64)
        assert (pic.cells >= 0).all() and (pic.cells <= 1 + 1e-9).all()
        assert (pic.live <= pic.arena_bytes).all()
        # the most bytes live at any step is the plan's lower bound, reached at the peak step
        assert pic.lower_bound == plan.lower_bound(b) == int(live[:, b].max()) == int(pic.live.max())
        assert int(live[pic.peak_step, b]) == pic.lower_bound
        assert pic.peak_tensor == sched.execution_steps()[pic.peak_step].tensor.name
        # the lower-bound row is the row holding the lower bound's last byte
        low, high = pic.row_range(pic.lower_bound_row)
        assert low < pic.lower_bound <= high + 1e-6
        assert pic.columns[0][0] == 0 and pic.columns[-1][1] == n_steps - 1


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda p: p.stem)
def test_grid_columns_of_single_steps_add_up_to_the_bytes_live(graph):
    sched, plan = planned(graph)
    live = live_bytes(sched, plan)
    n = len(sched.execution_steps())
    for pic in occupancy(sched, plan, width=n, height=7):
        row_bytes = pic.arena_bytes / 7
        assert pic.columns == [(i, i) for i in range(n)]
        np.testing.assert_allclose(pic.cells.sum(axis=0) * row_bytes, live[:, pic.buffer], rtol=1e-9)


def test_live_bytes_equal_the_lower_bound_on_random_graphs():
    for seed in range(60):
        rng = np.random.default_rng(seed)
        g = random_graph(rng, n_nodes=int(rng.integers(3, 16)), device_names=("SIM0", "SIM1"))
        backends = random_backends(rng, g)
        sched = Scheduler(backends).schedule(g)
        for planner in ("ggml", "best"):
            plan, _ = engine.plan_memory(sched, planner)
            live = live_bytes(sched, plan)
            for b in range(len(backends)):
                assert int(live[:, b].max(initial=0)) == plan.lower_bound(b), (seed, planner, b)
            for pic in occupancy(sched, plan, width=16, height=5):
                assert (pic.cells <= 1 + 1e-9).all(), (seed, planner)


def test_step_columns_cover_every_step_in_order():
    assert step_columns(0, 8) == []
    assert step_columns(3, 6) == [(0, 0), (0, 0), (1, 1), (1, 1), (2, 2), (2, 2)]
    cols = step_columns(100, 8)
    assert cols[0][0] == 0 and cols[-1][1] == 99
    assert all(b[0] == a[1] + 1 for a, b in zip(cols, cols[1:]))


# --- measure's picture -------------------------------------------------------------------------
def test_measure_draws_each_arena_below_the_table():
    code, out, err = invoke("measure", ROOT / "graphs/llama_block.yaml", "--planner", "ggml")
    assert code == 0, err
    table_at = out.index("memory of llama_block")
    assert out.index("arena occupancy") > table_at
    for name in ("SIM0 arena", "CPU arena"):
        assert name in out
    assert "◀ arena (peak)" in out and "◀ lower bound" in out and "step 0" in out
    # ggml's plan leaves room above the lower bound here: the marks sit on different rows
    sim = out[out.index("SIM0 arena"):out.index("CPU arena")]
    rows = [line for line in sim.splitlines() if "┤" in line]
    assert len(rows) == 10
    assert "arena (peak)" in rows[0] and "lower bound" not in rows[0]
    assert any("lower bound" in r for r in rows[1:])


def test_measure_json_has_no_picture():
    code, out, _ = invoke("measure", ROOT / "graphs/mlp.yaml", "--json")
    assert code == 0 and "backends" in json.loads(out)


def test_picture_renders_for_every_graph():
    console = Console(file=io.StringIO(), width=120)
    for graph in GRAPHS:
        sched, plan = planned(graph)
        visual.print_occupancy(console, occupancy(sched, plan))
    assert console.file.getvalue().count("◀ arena (peak)") >= len(GRAPHS)


# --- run --profile -----------------------------------------------------------------------------
def test_profile_json_adds_up():
    code, out, err = invoke("run", ROOT / "graphs/llama_block.yaml", "--profile", "--repeat", "2",
                            "--json")
    assert code == 0, err
    data = json.loads(out)
    prof = data["profile"]
    assert prof["repeat"] == 2
    ops = prof["ops"]
    computed = sum(1 for n in data["nodes"] if not get_op(n["op"]).view_op)
    assert sum(r["calls"] for r in ops) == 2 * computed == 2 * sum(r["nodes"] for r in ops)
    assert sum(r["share"] for r in ops) == pytest.approx(1.0)
    assert sum(r["total_s"] for r in ops) == pytest.approx(prof["compute_s"])
    assert [r["total_s"] for r in ops] == sorted((r["total_s"] for r in ops), reverse=True)
    mm = [r for r in ops if r["op"] == "mul_mat"]
    assert mm and all(r["flops"] > 0 and r["flops_per_s"] > 0 for r in mm)
    copies = prof["copies"]
    assert sum(r["count"] for r in copies) == 2 * data["copy_count"]
    assert sum(r["bytes"] for r in copies) == 2 * data["copy_bytes"]
    assert all(r["src"] != r["dst"] and r["total_s"] >= 0 for r in copies)


def test_profile_tables_print_after_the_others():
    code, out, err = invoke("run", ROOT / "graphs/mlp.yaml", "--profile")
    assert code == 0, err
    assert out.index("outputs") < out.index("profile: compute by op") < out.index(
        "profile: copies by route")
    assert "mul_mat" in out and "FLOP/s" in out and "B/s" in out
    code, out, _ = invoke("run", ROOT / "graphs/mlp.yaml")
    assert "profile" not in out


def test_rates_and_seconds_format():
    assert visual.rate(2.5e9, "FLOP/s") == "2.50 GFLOP/s"
    assert visual.rate(None, "B/s") == "-"
    assert visual.rate(12, "B/s") == "12 B/s"
    assert visual.seconds(0.0015) == "1.500 ms"


# --- progress ----------------------------------------------------------------------------------
def test_no_progress_when_stderr_is_not_a_terminal():
    code, _, err = invoke("run", ROOT / "graphs/mlp.yaml", "--repeat", "5")
    assert code == 0 and err == ""
    with visual.run_progress(Console(file=io.StringIO()), 5) as progress:
        assert progress is None


def test_progress_bar_on_a_terminal(monkeypatch):
    monkeypatch.setattr(visual, "is_terminal", lambda stream: True)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=80)
    with visual.run_progress(console, 3) as progress:
        assert callable(progress)
        for done in (1, 2, 3):
            progress(done)
    with visual.run_progress(console, 1) as progress:   # one run: nothing to show
        assert progress is None
    code, _, err = invoke("run", ROOT / "graphs/mlp.yaml", "--repeat", "3")
    assert code == 0, err
