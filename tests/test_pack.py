"""The offline offset planner: validity, bounds, exactness on small cases, CSV I/O."""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.memory.pack import Buffer, lower_bound, plan_offsets, verify
from ggmlrun.core.memory.pack_csv import read_csv, write_csv
from ggmlrun.core.memory.pack_greedy import plan_greedy
from tests.hang import no_hang

MINIMALLOC = Path("/work/shared/data/minimalloc")


def peak_of(buffers, offsets):
    """Bytes the arena needs: buffers never live (empty lifetime) need none."""
    return max((offsets[b.id] + b.size for b in buffers if b.upper > b.lower), default=0)


def brute_force_peak(buffers):
    """The optimum, by first fit over every placement order.

    First fit in the order of any optimal packing's offsets puts each buffer no higher than
    that packing does, so the best order reaches the optimum.
    """
    best = None
    for order in itertools.permutations(buffers):
        placed = []
        peak = 0
        for b in order:
            spans = sorted((o, o + p.size) for p, o in placed
                           if p.lower < b.upper and b.lower < p.upper and p.size)
            cursor = 0
            for start, stop in spans:
                if start - cursor >= b.size:
                    break
                cursor = max(cursor, stop)
            placed.append((b, cursor))
            peak = max(peak, cursor + b.size)
        best = peak if best is None else min(best, peak)
    return best or 0


def tiling(rng, n, span=12, capacity=12):
    """A perfect packing cut into n rectangles: the optimum is exactly `capacity`."""
    rects = [(0, span, 0, capacity)]
    while len(rects) < n:
        i = rng.randrange(len(rects))
        lo, hi, off, size = rects[i]
        if rng.random() < 0.5 and hi - lo >= 2:
            cut = rng.randrange(lo + 1, hi)
            rects[i:i + 1] = [(lo, cut, off, size), (cut, hi, off, size)]
        elif size >= 2:
            cut = rng.randrange(1, size)
            rects[i:i + 1] = [(lo, hi, off, cut), (lo, hi, off + cut, size - cut)]
    return [Buffer(f"t{k}", lo, hi, size) for k, (lo, hi, _, size) in enumerate(rects)]


buffer_lists = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 12), st.integers(0, 9)),
    min_size=0, max_size=14,
).map(lambda rows: [Buffer(f"b{i}", lo, lo + length, size)
                    for i, (lo, length, size) in enumerate(rows)])


# --------------------------------------------------------------------------- bounds


def test_lower_bound_counts_half_open_lifetimes():
    bufs = [Buffer("a", 0, 5, 10), Buffer("b", 5, 10, 7), Buffer("c", 4, 6, 1)]
    assert lower_bound(bufs) == 11  # a+c at t=4, b+c at t=5; a and b never meet


def test_lower_bound_ignores_empty_lifetimes_and_sizes():
    assert lower_bound([Buffer("a", 3, 3, 100), Buffer("b", 0, 9, 0)]) == 0
    assert lower_bound([]) == 0


def test_verify_reports_conflicts_and_negative_offsets():
    bufs = [Buffer("a", 0, 5, 10), Buffer("b", 4, 8, 10), Buffer("c", 5, 9, 10)]
    assert verify(bufs, {"a": 0, "b": 10, "c": 0}) == []
    problems = verify(bufs, {"a": 0, "b": 5, "c": -1})
    assert any("'a'" in p and "'b'" in p for p in problems)
    assert any("negative" in p for p in problems)
    assert verify(bufs, {"a": 0}) and "no offset" in verify(bufs, {"a": 0})[0]
    assert any("capacity" in p for p in verify(bufs, {"a": 0, "b": 10, "c": 0}, capacity=15))
    assert any("multiple" in p for p in verify(bufs, {"a": 0, "b": 10, "c": 3}, alignment=2))


# --------------------------------------------------------------------------- validity


@given(buffer_lists)
def test_greedy_placements_are_valid(bufs):
    result = plan_offsets(bufs, search=False)
    assert verify(bufs, result.offsets) == []
    assert result.peak == peak_of(bufs, result.offsets)
    assert result.peak >= result.lower_bound == lower_bound(bufs)


@given(buffer_lists)
def test_search_placements_are_valid_and_never_worse(bufs):
    greedy = plan_offsets(bufs, search=False)
    result = plan_offsets(bufs, time_limit=0.5)
    assert verify(bufs, result.offsets) == []
    assert result.peak == peak_of(bufs, result.offsets)
    assert result.lower_bound <= result.peak <= greedy.peak


@pytest.mark.parametrize("seed", range(25))
def test_search_reaches_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    bufs = [Buffer(f"b{i}", lo, lo + rng.randint(1, 6), rng.randint(1, 5))
            for i, lo in enumerate(rng.randint(0, 6) for _ in range(rng.randint(2, 6)))]
    result = plan_offsets(bufs, time_limit=2.0)
    assert verify(bufs, result.offsets) == []
    assert result.peak == brute_force_peak(bufs)


@pytest.mark.parametrize("seed", range(30))
def test_search_solves_perfect_packings(seed):
    rng = random.Random(1000 + seed)
    bufs = tiling(rng, rng.randint(5, 14))
    result = plan_offsets(bufs, time_limit=2.0)
    assert verify(bufs, result.offsets) == []
    assert result.peak == result.lower_bound == 12


def test_search_beats_every_greedy_ordering_on_a_hand_made_case():
    # A 12 x 12 square cut into seven pieces: every greedy ordering needs 13.
    rows = [(0, 3, 9), (3, 7, 9), (7, 11, 9), (0, 11, 1), (11, 12, 10), (0, 6, 2), (6, 12, 2)]
    bufs = [Buffer(f"p{i}", lo, hi, size) for i, (lo, hi, size) in enumerate(rows)]
    assert plan_greedy(bufs)[1] == 13
    result = plan_offsets(bufs, time_limit=2.0)
    assert result.peak == result.lower_bound == 12
    assert result.method.startswith("search")
    assert verify(bufs, result.offsets) == []


def test_capacity_is_a_target_not_an_optimum():
    rows = [(0, 3, 9), (3, 7, 9), (7, 11, 9), (0, 11, 1), (11, 12, 10), (0, 6, 2), (6, 12, 2)]
    bufs = [Buffer(f"p{i}", lo, hi, size) for i, (lo, hi, size) in enumerate(rows)]
    assert plan_offsets(bufs, capacity=12, time_limit=2.0).peak == 12
    assert plan_offsets(bufs, capacity=13, time_limit=2.0).peak <= 13  # greedy already fits


def test_infeasible_capacity_keeps_the_best_found():
    bufs = [Buffer("a", 0, 2, 5), Buffer("b", 1, 3, 5)]
    result = plan_offsets(bufs, capacity=9, time_limit=1.0)
    assert result.peak == 10 and verify(bufs, result.offsets) == []


def test_alignment_keeps_offsets_on_the_grid():
    rng = random.Random(7)
    bufs = [Buffer(f"b{i}", lo, lo + rng.randint(1, 8), 64 * rng.randint(1, 6))
            for i, lo in enumerate(rng.randint(0, 20) for _ in range(40))]
    for search in (False, True):
        result = plan_offsets(bufs, search=search, alignment=64, time_limit=0.5)
        assert verify(bufs, result.offsets, alignment=64) == []


def test_degenerate_buffers_sit_at_zero():
    bufs = [Buffer("empty", 4, 4, 100), Buffer("zero", 0, 10, 0), Buffer("real", 0, 10, 8)]
    result = plan_offsets(bufs)
    assert result.offsets == {"empty": 0, "zero": 0, "real": 0}
    assert result.peak == 8


def test_duplicate_ids_are_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        plan_offsets([Buffer("a", 0, 1, 1), Buffer("a", 0, 1, 1)])


def test_greedy_only_path_is_fast_on_a_long_chain():
    rng = random.Random(3)
    bufs = [Buffer(str(i), i, i + rng.randint(1, 20), 256 * rng.randint(1, 16))
            for i in range(20_000)]
    with no_hang("greedy packing of 20,000 buffers"):
        result = plan_offsets(bufs, search=False)
    assert result.peak <= 1.25 * result.lower_bound


@pytest.mark.slow
def test_greedy_only_path_handles_a_hundred_thousand_buffers():
    rng = random.Random(4)
    bufs = [Buffer(str(i), i, i + rng.randint(1, 20), 256 * rng.randint(1, 16))
            for i in range(100_000)]
    with no_hang("greedy packing of 100,000 buffers"):
        result = plan_offsets(bufs, time_limit=0)
    assert verify(bufs, result.offsets) == []


# --------------------------------------------------------------------------- CSV


def test_csv_round_trip(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("id,lower,upper,size,note\n"
                    "x,0,4,16,first\n"
                    "y,2,6,8,second\n"
                    "\n"
                    "z,6,9,32,third\n")
    bufs = read_csv(path)
    assert bufs == [Buffer("x", 0, 4, 16), Buffer("y", 2, 6, 8), Buffer("z", 6, 9, 32)]
    result = plan_offsets(bufs)
    out = tmp_path / "out.csv"
    write_csv(out, bufs, result.offsets)
    lines = out.read_text().splitlines()
    assert lines[0] == "id,lower,upper,size,offset"
    assert read_csv(out) == bufs
    assert {ln.split(",")[0]: int(ln.split(",")[4]) for ln in lines[1:]} == result.offsets
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pack-")] == []


def test_csv_columns_may_come_in_any_order(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("size,upper,id,lower\n5,3,a,1\n")
    assert read_csv(path) == [Buffer("a", 1, 3, 5)]


@pytest.mark.parametrize("text, line, fragment", [
    ("", 1, "empty file"),
    ("id,lower,size\n", 1, "upper"),
    ("id,lower,upper,size\na,0,4,16\nb,0,x,16\n", 3, "'x' is not an integer"),
    ("id,lower,upper,size\na,0,4\n", 2, "at least 4 fields"),
    ("id,lower,upper,size\na,5,4,16\n", 2, "upper 4 < lower 5"),
    ("id,lower,upper,size\na,0,4,-1\n", 2, "negative"),
    ("id,lower,upper,size\na,0,4,1\n\na,1,2,3\n", 4, "repeats the one on line 2"),
    ("id,lower,upper,size\n,0,4,1\n", 2, "empty id"),
])
def test_malformed_csv_names_the_line(tmp_path, text, line, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        read_csv(path)
    assert info.value.line == line
    assert info.value.file == os.fspath(path)
    assert fragment in str(info.value)
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_missing_csv_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_csv(tmp_path / "nope.csv")


def test_failed_write_leaves_no_temp_file(tmp_path):
    bufs = [Buffer("a", 0, 1, 1)]
    with pytest.raises(KeyError):
        write_csv(tmp_path / "out.csv", bufs, {})
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- MiniMalloc


@pytest.mark.slow
@pytest.mark.skipif(not MINIMALLOC.is_dir(), reason="MiniMalloc instances not present")
@pytest.mark.parametrize("name", list("ABCDEFGHIJK"))
def test_minimalloc_instances_fit_their_capacity(name):
    bufs = read_csv(MINIMALLOC / f"{name}.1048576.csv")
    result = plan_offsets(bufs, capacity=1_048_576, time_limit=60.0)
    assert verify(bufs, result.offsets, capacity=1_048_576) == []
    assert result.peak <= 1_048_576
