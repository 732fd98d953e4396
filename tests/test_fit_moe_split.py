"""fit's --n-cpu-moe over several devices (issue 21): the layer split is searched with N, and
the answer is the edge against brute force over every N and every split on llama.cpp's
figures (measure_model) of a small qwen3moe: one expert layer fewer on the CPU fits with no
split at all."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.models import fit as fitmod
from ggmlrun.models.cards.reader import read_card
from ggmlrun.models.options.command_line import options_from_line
from ggmlrun.models.fit.moe_split import split_of
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.reserve import measure_model

SMALL_MOE = """architecture: qwen3moe
hparams: {{n_layer: {n_layer}, n_embd: 128, n_head: 4, n_head_kv: 2, n_embd_head_k: 32,
          n_ff: 256, n_expert: 8, n_expert_used: 2, n_ff_exp: 128, n_vocab: 512,
          n_ctx_train: 2048}}
weights: q8_0
"""
OPTS = ModelOptions(ctx=512, ubatch=64)
BIG = 2**40


def small_moe(tmp_path: Path, n_layer: int):
    path = tmp_path / "moe.yaml"
    path.write_text(SMALL_MOE.format(n_layer=n_layer))
    return read_card(path)


def devices(*memory: int) -> list[BackendSpec]:
    return ([BackendSpec(f"DEV{i}", "sim", m, 32) for i, m in enumerate(memory)]
            + [BackendSpec("CPU", "cpu", BIG, 32)])


class Remembered:
    """measure_model, each placement reserved once whatever the memory (the figures do not
    depend on it once the split is given), so brute force and the many budgets stay quick."""

    def __init__(self):
        self.seen = {}

    def __call__(self, model, backends, opts, enough=None):
        """Always the whole reserve (`enough` is not taken up: a whole reserve answers too)."""
        key = (opts, None if opts.tensor_split else tuple(b.memory for b in backends))
        if key not in self.seen:
            self.seen[key] = measure_model(model, devices(*[BIG] * (len(backends) - 1))
                                           if opts.tensor_split else backends, opts)
        m = self.seen[key]
        return replace(m, backends=[replace(f, memory_bytes=b.memory)
                                    for f, b in zip(m.backends, backends)])


def totals(measure, model, n_dev, n, ends):
    n_max = model.hparams.n_layer + 1
    m = measure(model, devices(*[BIG] * n_dev),
                replace(OPTS, ngl=n_max, n_cpu_moe=n, tensor_split=split_of(ends, n_max)))
    return [f.weights_bytes + f.kv_bytes + f.state_bytes + f.arena_bytes + f.output_bytes
            for f in m.backends[:n_dev]]


def brute(measure, model, memory):
    """The smallest N with a split (ends of the devices' runs but the last) that fits."""
    n_max, k = model.hparams.n_layer + 1, len(memory)
    for n in range(model.hparams.n_layer + 1):
        for ends in itertools.combinations_with_replacement(range(n_max + 1), k - 1):
            if all(t <= m for t, m in zip(totals(measure, model, k, n, ends), memory)):
                return n
    return None


def check(model, measure, memory):
    want = brute(measure, model, memory)
    got = fitmod.fit_model(model, devices(*memory), OPTS, 0, 0, ctx_auto=False)
    n_layer = model.hparams.n_layer
    if want is None:          # every expert on the CPU and fewer layers (llama.cpp's split)
        assert got.n_cpu_moe == n_layer and (got.ngl is None or got.ngl <= n_layer), memory
        return got
    assert (got.ngl, got.n_cpu_moe) == (n_layer + 1, want), memory
    assert all(b.fits for b in got.backends)
    # the line reproduces the answer: its -ts and --n-cpu-moe measure what fit showed
    back = options_from_line(got.command, OPTS)
    again = measure(model, devices(*memory), replace(back, ngl=n_layer + 1))
    assert [f.weights_bytes + f.arena_bytes for f in again.backends] == \
        [b.weights_bytes + b.arena_bytes for b in got.backends]
    return got


def test_two_devices_the_edge_against_every_split(tmp_path, monkeypatch):
    model = small_moe(tmp_path, 6)
    measure = Remembered()
    monkeypatch.setattr(fitmod.core, "measure_model", measure)
    # budgets at and around the totals the splits reach
    seen = sorted({t for n in (0, 2, 4, 6) for a in range(8)
                   for t in totals(measure, model, 2, n, (a,))})
    rng = random.Random(21)
    answers = set()
    for _ in range(40):
        memory = tuple(rng.choice(seen) + rng.choice((-1, 0, 1, 50_000)) for _ in range(2))
        got = check(model, measure, memory)
        answers.add((got.n_cpu_moe, got.ngl))
    assert len(answers) >= 4                  # budgets that reach different answers


def test_three_devices_the_edge_against_every_split(tmp_path, monkeypatch):
    model = small_moe(tmp_path, 4)
    measure = Remembered()
    monkeypatch.setattr(fitmod.core, "measure_model", measure)
    seen = sorted({t for n in (0, 2, 4) for ends in ((1, 3), (2, 2), (0, 5), (3, 4))
                   for t in totals(measure, model, 3, n, ends)})
    rng = random.Random(3)
    for _ in range(12):
        check(model, measure, tuple(rng.choice(seen) + rng.choice((0, 1, 40_000))
                                    for _ in range(3)))


def test_the_split_beats_llamacpps_default_on_the_235b_card():
    """48 GiB + 24 GiB: llama.cpp's split by memory gives the first device two thirds of the
    layers, whose experts --n-cpu-moe takes first; a split of its own needs far fewer expert
    layers on the CPU, and -ts says so."""
    from ggmlrun.models.cards.reader import CARDS_DIR

    model = read_card(Path(CARDS_DIR) / "qwen3-235b-a22b-q4_k_m.yaml")
    backends = [BackendSpec("GPU0", "sim", 48 << 30, 256),
                BackendSpec("GPU1", "sim", 24 << 30, 256), BackendSpec("CPU", "cpu", 256 << 30, 32)]
    opts = ModelOptions(ctx=8192)
    got = fitmod.fit_model(model, backends, opts, 1 << 30, 0, ctx_auto=False)
    default = fitmod.fit_model(model, backends, replace(opts, tensor_split=(2.0, 1.0)),
                               1 << 30, 0, ctx_auto=False)
    assert got.ngl == default.ngl == 95
    assert got.n_cpu_moe < default.n_cpu_moe - 20
    assert " -ts " in got.command and "-ts 2,1" not in got.command


@pytest.mark.parametrize("ends", [(0,), (3,), (7,)])
def test_split_of_is_layers_per_device(ends):
    assert sum(split_of(ends, 7)) == 7 and split_of(ends, 7)[0] == ends[0]


def test_a_given_split_the_edge_in_few_reserves(tmp_path, monkeypatch):
    """-ts given over two devices: N's experts leave the first device first, so a short second
    device waits for its own layers; the guess counts each layer on the device holding it
    (it took one reserve per N before: 32 on Qwen3-30B-A3B at 12 + 8 GiB with -ts 0.6,0.4).
    The answer is the smallest N that fits, against every N."""
    model = small_moe(tmp_path, 16)
    measure = Remembered()
    monkeypatch.setattr(fitmod.core, "measure_model", measure)
    n_layer, ts = model.hparams.n_layer, (0.5, 0.5)
    opts = replace(OPTS, tensor_split=ts)

    def totals_at(n):
        m = measure(model, devices(BIG, BIG), replace(opts, ngl=n_layer + 1, n_cpu_moe=n))
        return [f.weights_bytes + f.kv_bytes + f.state_bytes + f.arena_bytes + f.output_bytes
                for f in m.backends[:2]]

    every = {n: totals_at(n) for n in range(n_layer + 1)}
    second = sorted({t[1] for t in every.values()})
    checked = 0
    for memory_2 in second[:-1]:          # the second device decides: N must reach its layers
        memory = (max(t[0] for t in every.values()), memory_2)
        want = min(n for n, t in every.items() if all(x <= m for x, m in zip(t, memory)))
        if want <= n_layer // 2:              # the second device's own layers: past the half
            continue
        got = fitmod.fit_model(model, devices(*memory), opts, 0, 0, ctx_auto=False)
        assert (got.ngl, got.n_cpu_moe) == (n_layer + 1, want), memory
        # a walk from N = 0 would take want + 1 reserves (9 to 16 here)
        assert len(got.probes) <= 5, (memory, got.probes)
        checked += 1
    assert checked >= 2
