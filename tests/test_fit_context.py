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
