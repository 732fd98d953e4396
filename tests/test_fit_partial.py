"""fit's reserves cut short: a placement whose pp graph alone (or, for the first --n-cpu-moe
probe on one device, whose weights alone) already leaves a device short is a miss without the
rest of the reserve. What makes that exact: the cut-short figures are lower bounds of the
whole reserve's, buffer by buffer, so the whole reserve misses too; and what fit shows is
always a whole reserve."""

from __future__ import annotations

import json

import pytest

from ggmlrun.core.backends.spec import BackendSpec, GiB
from ggmlrun.models import fit as fitmod
from ggmlrun.models.cards.reader import CARDS_DIR, read_card
from ggmlrun.models.options.params import ModelOptions
from tests.clikit import invoke

FIELDS = ("weights_bytes", "kv_bytes", "state_bytes", "arena_bytes", "output_bytes")


@pytest.mark.parametrize("card, gibs, ctx", [
    ("qwen3-235b-a22b-q4_k_m.yaml", (24,), None),     # the card: static, pp and whole
    ("qwen3-235b-a22b-q4_k_m.yaml", (48, 24), 8192),  # the split searched: one device at a time
    ("gpt-oss-20b-mxfp4.yaml", (8,), 8192),
    ("llama-3-70b-q4_k_m.yaml", (24,), None),         # dense: no static probe
])
def test_every_cut_short_probe_is_a_lower_bound_of_a_miss(card, gibs, ctx):
    model = read_card(CARDS_DIR / card)
    backends = [BackendSpec(f"GPU{i}", "sim", g * GiB, 32) for i, g in enumerate(gibs)]
    backends.append(BackendSpec("CPU", "cpu", 512 * GiB, 32))
    got = fitmod.fit_model(model, backends, ModelOptions(ctx=ctx), GiB, 0, ctx_auto=ctx is None)
    assert len(got.probe_reserved) == len(got.probes)
    assert "pp" in got.probe_reserved                     # some miss was cut short
    assert got.measure.reserved == "pp+tg"                # the answer shown: a whole reserve
    probe = fitmod.Prober(model, backends, ModelOptions(ctx=ctx), [GiB] * len(gibs) + [0])
    for (ngl, c), ncm, split, reserved in zip(got.probes, got.probe_moe, got.probe_splits,
                                              got.probe_reserved):
        if reserved == "pp+tg":
            continue
        short = probe.full(ngl, c, ncm, split, weights_decide=True)[0]
        whole = probe.full(ngl, c, ncm, split, complete=True)[0]
        assert not all(r.fits for r in short if r.kind != "cpu")
        for s, w in zip(short, whole):       # a device short on the lower bound is short
            assert s.fits or not w.fits
        assert not all(r.fits for r in whole if r.kind != "cpu"), (ngl, c, ncm)
        for s, w in zip(short, whole):
            assert all(getattr(s, f) <= getattr(w, f) for f in FIELDS), (ngl, c, ncm, s, w)
            assert (s.weights_bytes, s.kv_bytes) == (w.weights_bytes, w.kv_bytes)


def test_the_qwen3_235b_context_search_takes_two_reserves():
    """The attention scores' floor (fit/ctx.py, attention_scores) puts the first context guess
    next to the edge: 8960 misses, 8704 fits (it was 11264, 8704, 8960); the -ngl phase is a
    weights-only probe at N = 0, a pp-only miss and the answer."""
    model = read_card(CARDS_DIR / "qwen3-235b-a22b-q4_k_m.yaml")
    backends = [BackendSpec("GPU0", "sim", 24 * GiB, 32), BackendSpec("CPU", "cpu", 512 * GiB, 32)]
    opts = ModelOptions(flash_attn=False, parallel=1)     # the scores are made without FA
    got = fitmod.fit_model(model, backends, opts, GiB, 0, ctx_auto=True)
    assert (got.ngl, got.ctx, got.n_cpu_moe) == (95, 8704, 83)
    assert list(zip(got.probes, got.probe_moe, got.probe_reserved)) == [
        ((95, 4096), 0, "none"), ((95, 4096), 82, "pp"), ((95, 4096), 83, "pp+tg"),
        ((95, 8960), 83, "pp"), ((95, 8704), 83, "pp+tg")]


def test_the_json_says_how_far_each_probe_went():
    code, out, err = invoke("fit", CARDS_DIR / "qwen3-30b-a3b-q4_k_m.yaml", "--gpu", "12GiB",
                            "--ram", "64GiB", "--ctx", "8192", "--json")
    assert code == 0, err
    probes = json.loads(out)["probes"]
    assert {p["reserved"] for p in probes} <= {"pp+tg", "pp", "none"}
    assert probes and all(set(p) == {"ngl", "ctx", "n_cpu_moe", "reserved"} for p in probes)
