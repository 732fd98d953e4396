"""fit's search: exact against brute force over every -ngl (and context), on measured figures.

The search guesses and confirms; these tests hold it to the brute-force answer on figures
shaped like llama.cpp's (weights and KV per layer, a compute buffer that jumps when the output
layer moves), including budgets where the guess is wrong, and on the real tiny GGUF models.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.models import fit as fitmod
from ggmlrun.models.arch import ARCHITECTURES
from ggmlrun.models.cards.reader import read_card
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.reserve import BackendFigures
from tests.hang import no_hang

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def tiny_card(tmp_path, n_layer=12, weights="q4_K_M") -> Path:
    path = tmp_path / "card.yaml"
    path.write_text(f"""architecture: llama
hparams: {{n_layer: {n_layer}, n_embd: 256, n_head: 8, n_head_kv: 2, n_ff: 768, n_vocab: 4096,
          n_ctx_train: 4096}}
weights: {weights}
""")
    return path


@dataclass
class Figures:
    backends: list
    reserved: str = "pp+tg"       # the whole reserve, always: `enough` is not taken up
    partial: bool = False


def fake_measure(model, layer_costs):
    """llama.cpp-shaped figures: the last ngl-1 layers and the output layer on the device, KV
    linear in the context, a compute buffer that grows with the context and jumps with the
    output layer (the logits) on the device."""
    n_layer = model.hparams.n_layer

    def measure(model_, backends, opts, enough=None):
        ngl = n_layer + 1 if opts.ngl is None else opts.ngl
        start = max(n_layer + 1 - ngl, 0)
        kv_layer = 2 * 64 * opts.ctx
        dev_w = sum(layer_costs.get(il, 0) for il in range(start, n_layer + 1))
        cpu_w = sum(layer_costs.get(il, 0) for il in range(0, start)) + 5 * MiB
        on_dev = n_layer - start
        dev_kv, cpu_kv = kv_layer * on_dev, kv_layer * (n_layer - on_dev)
        dev_c = (3 * MiB if ngl > n_layer else MiB) + 50 * opts.ctx if ngl else 0
        cpu_c = 2 * MiB + 20 * opts.ctx
        return Figures([BackendFigures("DEV", "sim", dev_w, dev_kv, dev_c, backends[0].memory),
                        BackendFigures("CPU", "cpu", cpu_w, cpu_kv, cpu_c, backends[1].memory)])
    return measure


def brute_ngl(measure, model, backends, opts, margins, ctx):
    best = None
    for ngl in range(model.hparams.n_layer + 2):
        rows = measure(model, backends, replace(opts, ngl=ngl, ctx=ctx)).backends
        if all(r.weights_bytes + r.kv_bytes + r.state_bytes + r.arena_bytes <= r.memory_bytes - m
               for r, m in zip(rows, margins)):
            best = ngl
    return best


def tiny_model_with_fake_measure(tmp_path, monkeypatch):
    """The tiny card, fit's measure replaced by the layer-cost model; and its total bytes."""
    model = read_card(tiny_card(tmp_path))
    costs = fitmod.layer_costs(model)
    measure = fake_measure(model, costs)
    monkeypatch.setattr(fitmod.core, "measure_model", measure)
    return model, measure, sum(costs.values())


def backends_with(dev_mem, cpu_mem):
    return [BackendSpec("DEV", "sim", dev_mem, 32), BackendSpec("CPU", "cpu", cpu_mem, 32)]


def test_search_equals_brute_force_on_many_budgets(tmp_path, monkeypatch):
    model, measure, total = tiny_model_with_fake_measure(tmp_path, monkeypatch)
    rng = random.Random(7)
    for _ in range(150):
        dev = rng.randint(0, total + 6 * MiB)
        cpu = rng.choice([2**40, rng.randint(4 * MiB, total + 12 * MiB)])
        margin = rng.choice([0, MiB // 2])
        backends = backends_with(dev, cpu)
        opts = ModelOptions(ctx=1024)
        got = fitmod.fit_model(model, backends, opts, margin, 0, ctx_auto=False)
        want = brute_ngl(measure, model, backends, opts, [margin, 0], 1024)
        assert got.ngl == want, (dev, cpu, margin)
        if want is not None:
            assert all(b.fits for b in got.backends)
            assert len(got.probes) <= 8       # a guess and its confirmation, not every ngl
        else:
            assert got.advice.startswith("nothing fits: ")
            assert got.backends == fitmod.Prober(model, backends, opts, [margin, 0])(
                got.shown_ngl, 1024)


def test_ctx_auto_equals_brute_force(tmp_path, monkeypatch):
    model, measure, total = tiny_model_with_fake_measure(tmp_path, monkeypatch)
    rng = random.Random(11)
    for _ in range(60):
        backends = backends_with(rng.randint(total // 2, total + 16 * MiB), 2**40)
        opts = ModelOptions()
        got = fitmod.fit_model(model, backends, opts, 0, 0, ctx_auto=True, min_ctx=1024)
        ngl = brute_ngl(measure, model, backends, opts, [0, 0], 1024)
        assert got.ngl == ngl
        if ngl is None:
            continue
        ctxs = [c for c in range(1024, 4097, 256)
                if brute_ngl(measure, model, backends, opts, [0, 0], c) is not None
                and all(r.weights_bytes + r.kv_bytes + r.state_bytes + r.arena_bytes <= r.memory_bytes
                        for r in measure(model, backends,
                                         replace(opts, ngl=ngl, ctx=c)).backends)]
        assert got.ctx == max(ctxs)


# --- on llama.cpp's figures (measure_model), a small model --------------------------------------
SMALL = """architecture: llama
hparams: {n_layer: 6, n_embd: 128, n_head: 4, n_head_kv: 2, n_ff: 256, n_vocab: 512,
          n_ctx_train: 2048}
weights: q8_0
"""
# the same small model in each further architecture's own form (tests/test_models_arch.py and
# the recorded tiny models hold their graphs to llama.cpp's)
SMALLS = {
    "llama": SMALL,
    "qwen2": SMALL.replace("architecture: llama", "architecture: qwen2"),
    "qwen3": SMALL.replace("architecture: llama", "architecture: qwen3").replace(
        "n_head_kv: 2,", "n_head_kv: 2, n_embd_head_k: 64,"),
    "mistral3": SMALL.replace("architecture: llama", "architecture: mistral3").replace(
        "n_ctx_train: 2048}", "n_ctx_train: 2048, rope_scaling: yarn, rope_scaling_factor: 4.0,\n"
        "          n_ctx_orig: 512, attn_temp_scale: 0.1}"),
    "phi3": SMALL.replace("architecture: llama", "architecture: phi3").replace(
        "n_ctx_train: 2048}", "n_ctx_train: 2048, rope_scaling: longrope, n_ctx_orig: 1024}"),
    # hybrid: layers 2 and 5 attention (a KV cache growing with ctx), the others delta-net (a
    # recurrent state that does not)
    "qwen35": SMALL.replace("architecture: llama", "architecture: qwen35").replace(
        "n_ctx_train: 2048}", "n_ctx_train: 2048, n_rot: 16, rope_sections: [3, 3, 2, 0],\n"
        "          ssm_d_conv: 4, ssm_d_state: 32, ssm_n_group: 2, ssm_dt_rank: 4,\n"
        "          ssm_d_inner: 128, full_attention_interval: 3}"),
}
ARCHS = [a for a in SMALLS if a in ARCHITECTURES]


def real_rows(model, backends, opts, margins):
    from ggmlrun.models.reserve import measure_model

    m = measure_model(model, backends, opts)
    return [(f.weights_bytes + f.kv_bytes + f.state_bytes + f.arena_bytes + f.output_bytes,
             b.memory - margin)
            for f, b, margin in zip(m.backends, backends, margins)]


@pytest.mark.parametrize("arch", ARCHS)
def test_exact_against_every_ngl_on_measured_figures(tmp_path, arch):
    model = read_card(write_small(tmp_path, arch))
    big = backends_with(2**40, 2**40)
    opts = ModelOptions(ctx=512, ubatch=64)
    totals = {ngl: real_rows(model, big, replace(opts, ngl=ngl), [0, 0])
              for ngl in range(model.hparams.n_layer + 2)}
    device_totals = sorted({rows[0][0] for rows in totals.values()})
    # every budget between two measured totals, and just at and just under each
    budgets = sorted({t + d for t in device_totals for d in (-1, 0, 1)})
    for budget in budgets:
        backends = backends_with(budget, 2**40)
        want = max((n for n, rows in totals.items() if rows[0][0] <= budget), default=None)
        got = fitmod.fit_model(model, backends, opts, 0, 0, ctx_auto=False)
        assert got.ngl == want, budget
        if want is not None:
            assert got.backends[0].total_bytes == totals[want][0][0]


@pytest.mark.parametrize("arch", ARCHS)
def test_device_totals_grow_with_ngl_and_cpu_totals_shrink(tmp_path, arch):
    """The premise of the search, checked on llama.cpp's figures."""
    model = read_card(write_small(tmp_path, arch))
    big = backends_with(2**40, 2**40)
    opts = ModelOptions(ctx=512, ubatch=64)
    rows = [real_rows(model, big, replace(opts, ngl=n), [0, 0])
            for n in range(model.hparams.n_layer + 2)]
    dev = [r[0][0] for r in rows]
    cpu = [r[1][0] for r in rows]
    assert dev == sorted(dev) and cpu == sorted(cpu, reverse=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_compute_buffers_grow_with_the_context(tmp_path, arch):
    """On these small models; not on every card (llama-3-70b, -fa: 339 MiB at 6144 cells, 315
    at 7680), so fit's context search only guesses with it and measures the edge
    (tests/test_fit_ctx_search.py)."""
    from ggmlrun.models.reserve import measure_model

    model = read_card(write_small(tmp_path, arch))
    big = backends_with(2**40, 2**40)
    for ngl in (0, 3, 7):
        arenas = [[f.arena_bytes for f in measure_model(
            model, big, ModelOptions(ctx=c, ubatch=64, ngl=ngl, flash_attn=False,
                                     parallel=1)).backends]
            for c in range(256, 2049, 256)]
        for backend in zip(*arenas):
            assert list(backend) == sorted(backend)


def test_nothing_fits_exits_1_with_advice(tmp_path):
    from clikit import invoke

    card = write_small(tmp_path)
    be = tmp_path / "be.yaml"
    be.write_text("backends:\n  - {name: GPU, kind: sim, alignment: 32, memory: 1MiB}\n"
                  "  - {name: CPU, kind: cpu, alignment: 32, memory: 1MiB}\n")
    code, out, err = invoke("fit", card, "--backends", be, "--margin", "0")
    assert code == 1
    assert "nothing fits: even with -ngl 0, GPU needs" in err and "CPU needs" in err
    assert "llama-server: nothing fits" in out


def test_fit_json_keys_and_timing_printed(tmp_path):
    import json

    from clikit import invoke

    code, out, err = invoke("fit", write_small(tmp_path), "--json", "--ctx", "auto",
                            "--min-ctx", "256")
    assert code == 0, err
    data = json.loads(out)
    assert {"ngl", "ctx", "backends", "seconds", "probes"} <= set(data)
    assert data["ngl"] == 7 and data["ctx"] == 2048
    for b in data["backends"]:
        assert {"name", "weights_bytes", "kv_bytes", "arena_bytes", "total_bytes",
                "memory_bytes", "fits"} <= set(b)
        # the CPU's total has the output (logits) buffer too
        assert b["total_bytes"] == (b["weights_bytes"] + b["kv_bytes"] + b["arena_bytes"]
                                    + b.get("output_bytes", 0))
    print(f"fit on a 6-layer card: {data['seconds']:.3f} s, {len(data['probes'])} reserves")


def weight_bytes(model) -> int:
    import math

    from ggmlrun.core.ir.types import TYPES
    return sum(TYPES[t.dtype].row_bytes(math.prod(t.shape)) for t in model.tensors.values())


def write_small(tmp_path, arch: str = "llama") -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALLS[arch])
    return path


def test_nothing_fits_names_the_largest_context_that_would(tmp_path):
    model = read_card(write_small(tmp_path))
    opts = ModelOptions(ctx=2048, ubatch=64)

    def cpu_total(ctx):
        return real_rows(model, [BackendSpec("CPU", "cpu", 2**40, 32)], replace(opts, ctx=ctx),
                         [0])[0][0]
    budget = cpu_total(1024) + 1
    result = fitmod.fit_model(model, [BackendSpec("CPU", "cpu", budget, 32)], opts, 0, 0,
                              ctx_auto=False)
    assert result.ngl is None
    want = max(c for c in range(256, 2048, 256) if cpu_total(c) <= budget)
    assert want == 1024
    # (then what one more step would free: fit/steps.py)
    assert result.advice.split("; one more step")[0].endswith(
        f"the largest context that fits is --ctx {want}, with -ngl 7 (the most layers at that "
        f"context)")


@pytest.mark.parametrize("arch", ARCHS)
def test_two_devices_exact_against_every_ngl_and_split(tmp_path, arch):
    """Two devices and no -ts: the most layers any split holds (issue 30 item 4), against
    brute force over every -ngl and every split of its layers (layers per device); the split
    is written only where it beats llama.cpp's own (by memory), and then measures as shown.
    (qwen35: its layers differ, so with llama.cpp's split -ngl 5 can miss where 6 fits; over
    every split, more layers only get harder.)"""
    from ggmlrun.models.reserve import measure_model

    model = read_card(write_small(tmp_path, arch))
    opts = ModelOptions(ctx=512, ubatch=16, flash_attn=False, parallel=1)   # as sized
    n_max = model.hparams.n_layer + 1
    big = [BackendSpec("DEV0", "sim", 2**40, 32), BackendSpec("DEV1", "sim", 2**40, 32),
           BackendSpec("CPU", "cpu", 2**40, 32)]
    # a given split's figures do not depend on the memory: each measured once
    totals = {(n, a): [t for t, _ in real_rows(model, big, replace(
                  opts, ngl=n, tensor_split=(float(a), float(n - a)) if n else None), [0] * 3)]
              for n in range(n_max + 1) for a in range(n + 1)}
    # budgets sized for the llama model, scaled by this model's weight bytes
    KiB = 1024 * weight_bytes(model) / weight_bytes(read_card(write_small(tmp_path, "llama")))
    answers, beaten = [], 0
    for mem0, mem1 in ((1000 * KiB, 600 * KiB), (800 * KiB, 800 * KiB), (1200 * KiB, 300 * KiB),
                       (600 * KiB, 1000 * KiB), (400 * KiB, 400 * KiB), (50 * KiB, 50 * KiB)):
        mem0, mem1 = int(mem0), int(mem1)
        backends = [BackendSpec("DEV0", "sim", mem0, 32), BackendSpec("DEV1", "sim", mem1, 32),
                    BackendSpec("CPU", "cpu", 2**40, 32)]
        want = max((n for (n, a), t in totals.items() if t[0] <= mem0 and t[1] <= mem1),
                   default=None)
        by_memory = max((n for n in range(n_max + 1)
                         if all(total <= cap for total, cap in
                                real_rows(model, backends, replace(opts, ngl=n), [0] * 3))),
                        default=None)
        got = fitmod.fit_model(model, backends, opts, 0, 0, ctx_auto=False)
        assert got.ngl == want, (mem0, mem1)
        assert (got.tensor_split is not None) == (want != by_memory), (mem0, mem1)
        if got.tensor_split is not None:
            beaten += 1
            again = measure_model(model, backends, replace(opts, ngl=got.ngl,
                                                           tensor_split=got.tensor_split))
            assert [f.weights_bytes + f.arena_bytes for f in again.backends] == \
                [b.weights_bytes + b.arena_bytes for b in got.backends]
        answers.append(got.ngl)
    print(arch, "answers:", answers, "split searched:", beaten)
    assert len(set(answers)) >= 3          # the budgets reach different answers
    assert beaten >= 1                     # and some where llama.cpp's split holds fewer


# --- the KV bound is solved, not walked (issue 19) ----------------------------------------------
def _kv_bound_walk(rows, ctx, below):
    """The walk _kv_bound replaced: 256 cells at a time until a backend's KV growth is too much."""
    best = ctx
    for c in range(ctx + fitmod.CTX_STEP, below, fitmod.CTX_STEP):
        if any(r.total_bytes + r.kv_bytes * (c - ctx) // ctx > r.memory_bytes - r.margin_bytes
               for r in rows):
            break
        best = c
    return best


def test_kv_bound_is_the_walks_edge():
    rng = random.Random(19)
    for _ in range(3000):
        ctx = rng.choice([1, 7, 256, 512, 1024, 4096, rng.randint(1, 5000)])
        rows = []
        for name in ("DEV", "CPU"):
            kv = rng.choice([0, 1, 3, 64, rng.randint(0, 10**6)])
            w, a = rng.randint(0, 10**6), rng.randint(0, 10**5)
            memory = w + kv + a + rng.randint(-1000, 50 * max(kv, 1))
            rows.append(fitmod.FitBackend(name, "sim" if name == "DEV" else "cpu", w, kv, a,
                                          memory, margin_bytes=rng.choice([0, 0, 100])))
        below = ctx + rng.randint(0, 200) * fitmod.CTX_STEP + rng.randint(0, 300)
        assert fitmod.kv_bound(rows, ctx, below) == _kv_bound_walk(rows, ctx, below), \
            (rows, ctx, below)


def test_kv_bound_up_to_a_uint32_context_takes_no_walk():
    rows = [fitmod.FitBackend("CPU", "cpu", 1000, 4096, 100, 2**60)]
    with no_hang("kv_bound up to 2**32"):     # a walk of 2**24 steps takes minutes
        got = fitmod.kv_bound(rows, 4096, 2**32)
    assert got == 2**32 - fitmod.CTX_STEP


def test_ctx_auto_to_a_uint32_training_context_is_exact_and_quick(tmp_path):
    """A card trained on 2**32-1 tokens and memory for 400M of them: the answer is the exact
    edge (it fits, 256 more do not) after a handful of reserves."""
    from ggmlrun.core.backends.spec import GiB

    path = tmp_path / "long.yaml"
    path.write_text("architecture: llama\nhparams: {n_layer: 2, n_embd: 64, n_head: 4, "
                    "n_ff: 128, n_vocab: 320, n_ctx_train: 4294967295}\nweights: f16\n")
    model = read_card(path)
    backends = backends_with(4096 * GiB, 4096 * GiB)
    with no_hang("fit --ctx auto to 2**32"):
        got = fitmod.fit_model(model, backends, ModelOptions(), 0, 0, ctx_auto=True)
    assert len(got.probes) < 30
    assert got.fits and got.ngl == 3
    probe = fitmod.Prober(model, backends, ModelOptions(), [0, 0])
    assert fitmod.all_fit(probe(got.ngl, got.ctx))
    assert not fitmod.all_fit(probe(got.ngl, got.ctx + fitmod.CTX_STEP))
