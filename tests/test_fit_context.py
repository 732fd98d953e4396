"""Context sense: a context past the model's training length warns as llama.cpp does, and when
nothing fits, the advice is the largest context that fits, with the most layers there
(checked against every (-ngl, context) pair measured)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.models.fit import fit_model
from ggmlrun.models.load import load_model
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.reserve import measure_model

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples/models/tiny-llama-f16.gguf"
CARD_8B = ROOT / "ggmlrun/models/cards/llama-3-8b-q4_k_m.yaml"
KiB = 2**10


def _backends(gpu: int, cpu: int):
    return [dataclasses.replace(BackendSpec.of_kind("GPU0", "sim"), memory=gpu),
            dataclasses.replace(BackendSpec.of_kind("CPU", "cpu"), memory=cpu)]


def _fits(model, backends, ngl, ctx, ubatch):
    m = measure_model(model, backends, ModelOptions(ngl=ngl, ctx=ctx, ubatch=ubatch))
    return all(b.weights_bytes + b.kv_bytes + b.state_bytes + b.arena_bytes <= b.memory_bytes
               for b in m.backends)


@pytest.mark.parametrize("gpu, cpu", [(900, 600), (700, 500), (1200, 420), (500, 900),
                                      (1000, 300), (1500, 700)])
def test_advice_is_the_largest_context_that_fits(gpu, cpu):
    model = load_model(TINY)
    backends = _backends(gpu * KiB, cpu * KiB)
    result = fit_model(model, backends, ModelOptions(ctx=2048, ubatch=32), 0, 0, False)
    n_max = model.hparams.n_layer + 1
    best = None
    for ctx in range(256, 2048, 256):
        fitting = [n for n in range(n_max + 1) if _fits(model, backends, n, ctx, 32)]
        if fitting:
            best = (ctx, max(fitting))
    if result.fits:
        pytest.skip("everything fits at 2048 with these sizes")
    found = re.search(r"--ctx (\d+), with -ngl (\d+)", result.advice)
    if best is None:
        assert found is None and "more on" in result.advice
    else:
        assert found and (int(found[1]), int(found[2])) == best, result.advice


def test_some_case_has_advice():
    """At least one of the sizes above leads to a context advice (the test is not vacuous)."""
    model = load_model(TINY)
    result = fit_model(model, _backends(900 * KiB, 600 * KiB), ModelOptions(ctx=2048, ubatch=32),
                       0, 0, False)
    assert not result.fits and "the largest context that fits is --ctx" in result.advice


@pytest.mark.parametrize("command, extra", [("measure", ()), ("plan", ()), ("fit", ()),
                                            ("run", ("--tokens", "1,2"))])
def test_past_training_context_warns(command, extra):
    code, out, err = invoke(command, TINY, "--ctx", "4096", *extra)
    assert code == 0, err
    assert ("ggmlrun: warning: --ctx 4096 is past the model's training context (2048 tokens); "
            "llama.cpp warns 'n_ctx_per_seq (4096) > n_ctx_train (2048) -- possible training "
            "context overflow'") in err
    code, out, err = invoke(command, TINY, "--ctx", "2048", *extra)
    assert "warning" not in err


def test_card_past_training_context_warns_once():
    code, out, err = invoke("fit", CARD_8B, "--ctx", "32768", "--gpu", "24GiB", "--ram", "32GiB")
    assert code == 0 and err.count("warning: --ctx 32768 is past") == 1


# --- one more step (issue 30 item 4) -------------------------------------------------------
TINY_HEAD_32 = ROOT / "examples/models/tiny-qwen3-f16.gguf"   # heads a q8_0 block divides


def _device_total(m, names):
    return sum(b.weights_bytes + b.kv_bytes + b.state_bytes + b.arena_bytes + b.output_bytes
               for b in m.backends if b.name in names)


@pytest.mark.parametrize("opts", [
    ModelOptions(ctx=2048, flash_attn=False, parallel=1),
    ModelOptions(ctx=2048, flash_attn=True, parallel=1),
    ModelOptions(ctx=2048, flash_attn=True, kv_type="q8_0", parallel=1),
    ModelOptions(ctx=2048, flash_attn=False, parallel=4, kv_unified=False),
    ModelOptions(ctx=2048, flash_attn=False, parallel=4, kv_unified=True),
])
def test_each_step_frees_what_measure_says(opts):
    """Where layers stay on the CPU, each step offered frees exactly what measuring the answer
    with that one change says (and something); a step that cannot apply (flash attention
    already on, a q8_0 cache already) is never offered."""
    model = load_model(TINY_HEAD_32)
    full = measure_model(model, _backends(2**40, 2**40), opts)
    dev = full.backends[0]
    gpu = (dev.weights_bytes + dev.kv_bytes) * 2 // 3 + dev.arena_bytes + 2**30
    backends = _backends(gpu, 2**40)
    got = fit_model(model, backends, opts, 2**30, 0, ctx_auto=False)
    assert got.fits and got.ngl < model.hparams.n_layer + 1
    offered = {s.option for s in got.steps}
    assert ("-fa on" in offered) <= (not opts.flash_attn)
    assert not any("-ctk" in o for o in offered) or opts.type_k == "f16"
    assert ("-np 1" in offered) <= (opts.parallel > 1)
    at = dataclasses.replace(opts, ngl=got.ngl)
    before = _device_total(measure_model(model, backends, at), {"GPU0"})
    for step in got.steps:
        change = {"-fa": {"flash_attn": True}, "-ctk": {"kv_type": "q8_0", "flash_attn": True},
                  "-np": {"parallel": 1}}[step.option.split()[0]]
        after = _device_total(measure_model(model, backends,
                                            dataclasses.replace(at, **change)), {"GPU0"})
        assert step.saves_bytes == before - after > 0 and step.where == ("GPU0",)


def test_no_step_when_everything_fits_and_no_margin_advice_without_a_margin():
    model = load_model(TINY_HEAD_32)
    assert fit_model(model, _backends(2**40, 2**40), ModelOptions(ctx=1024), 0, 0,
                     ctx_auto=False).steps == []
    full = measure_model(model, _backends(2**40, 2**40), ModelOptions(ctx=1024, ngl=0))
    cpu = full.backends[-1]
    short = cpu.weights_bytes + cpu.kv_bytes + cpu.arena_bytes // 2
    for margin in (0, 1):
        got = fit_model(model, _backends(0, short + margin), ModelOptions(ctx=1024), 0, margin,
                        ctx_auto=False)
        assert not got.fits and ("smaller --margin" in got.advice) == (margin > 0)


def test_the_text_says_one_more_step_under_the_line():
    code, out, err = invoke("fit", CARD_8B, "--gpu", "3GiB", "--ram", "64GiB", "--ctx", "4096",
                            "--flash-attn", "off", "--parallel", "1")
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("llama.cpp: -ngl "))
    step = lines[at + 1]
    assert code == 0 and step.startswith("one more step: -fa on frees ")
    assert "-ctk q8_0 -ctv q8_0" in step
