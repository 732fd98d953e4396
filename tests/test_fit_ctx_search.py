"""`fit --ctx auto`'s context search: exact against brute force on the figures of a hybrid and
an SWA model (a recurrent state and a capped cache that do not grow with the context), the
answer's edge always measured (the KV bound is a guess, never a proof), and few reserves on the
bundled cards (issues 21/22: the work is held here, the seconds in benchmarks/bench_fit.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ggmlrun.core.backends.spec import BackendSpec, GiB
from ggmlrun.models import fit as fitmod
from ggmlrun.models.cards.reader import CARDS_DIR, read_card
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.reserve import measure_model

SMALL = {   # n_ctx_train 8192: room for the answer to land well inside [256, top]
    "qwen35": """architecture: qwen35
hparams: {n_layer: 6, n_embd: 128, n_head: 4, n_head_kv: 2, n_ff: 256, n_vocab: 512,
          n_ctx_train: 8192, n_rot: 16, rope_sections: [3, 3, 2, 0], ssm_d_conv: 4,
          ssm_d_state: 32, ssm_n_group: 2, ssm_dt_rank: 4, ssm_d_inner: 128,
          full_attention_interval: 3}
weights: q8_0
""",
    "gemma3": """architecture: gemma3
hparams: {n_layer: 6, n_embd: 128, n_head: 4, n_head_kv: 2, n_embd_head_k: 32, n_ff: 256,
          n_vocab: 512, n_ctx_train: 8192, n_swa: 256, swa_pattern: 3,
          rope_freq_base_swa: 10000.0}
weights: q8_0
""",
}


def backends(device: int) -> list[BackendSpec]:
    return [BackendSpec("GPU0", "sim", device, 32), BackendSpec("CPU", "cpu", 2**40, 32)]


def device_total(model, opts, ctx: int) -> int:
    f = measure_model(model, backends(2**40), replace(opts, ctx=ctx)).backends[0]
    return f.weights_bytes + f.kv_bytes + f.state_bytes + f.arena_bytes + f.output_bytes


@pytest.mark.parametrize("arch", sorted(SMALL))
@pytest.mark.parametrize("flash", [False, True])
def test_ctx_auto_equals_brute_force(tmp_path, arch, flash):
    """Every layer on the device; budgets at, and a byte under, the device's total at several
    contexts: the answer is the largest context whose total fits, found in a few reserves."""
    path = tmp_path / "small.yaml"
    path.write_text(SMALL[arch])
    model = read_card(path)
    opts = ModelOptions(ubatch=64, flash_attn=flash)
    ctxs = list(range(256, 8193, 256))
    totals = {c: device_total(model, opts, c) for c in ctxs}
    assert totals[8192] > totals[256]             # the context moves the device's total
    checked = 0
    for c in (768, 2304, 5120, 8192):
        for budget in (totals[c], totals[c] - 1):
            got = fitmod.fit_model(model, backends(budget), opts, 0, 0, ctx_auto=True,
                                   min_ctx=256)
            want = max((x for x in ctxs if totals[x] <= budget), default=None)
            if want is None or totals[256] > budget:
                continue                          # no context fits all the layers
            assert got.ngl == model.hparams.n_layer_all + 1 and got.ctx == want, (c, budget)
            ctx_phase = [p for p in got.probes if p[1] != 256]
            assert len(ctx_phase) <= 5, got.probes
            checked += 1
    assert checked == 8


def card_fit(card: str, gib: int, flash: bool):
    model = read_card(CARDS_DIR / card)
    b = [BackendSpec("GPU0", "sim", gib * GiB, 32), BackendSpec("CPU", "cpu", 512 * GiB, 32)]
    return model, b, fitmod.fit_model(model, b, ModelOptions(flash_attn=flash, parallel=1), GiB, 0,
                                      ctx_auto=True)


def test_a_compute_buffer_that_shrinks_with_the_context_is_measured_not_bounded():
    """llama-3-70b, -fa, 12 GiB, -ngl 20: the compute buffer is 339 MiB at 6144 cells and
    315 MiB at 7680, so the KV bound taken from 6144 ruled out 8192, which fits (the answer
    was 7936). The edge is measured: here it is the training context itself."""
    model, b, got = card_fit("llama-3-70b-q4_k_m.yaml", 12, True)
    assert (got.ngl, got.ctx) == (20, 8192)
    probe = fitmod.Prober(model, b, ModelOptions(flash_attn=True, parallel=1), [GiB, 0])
    assert fitmod.all_fit(probe(20, 8192))


@pytest.mark.parametrize("card, gib, flash, answer, reserves", [
    # the compute buffer flat to ~8000 cells, then growing with the attention scores: the
    # KV bound (11264) misses, the line down from it lands on 8960, 9216 misses
    ("qwen3.5-27b-q4_k_m.yaml", 8, False, (25, 8960), 6),
    ("qwen3.5-35b-a3b-q4_k_m.yaml", 8, False, (41, 4608), 5),
    ("gemma-3-27b-q4_k_m.yaml", 8, False, (22, 7424), 6),           # SWA
    # every expert on the CPU and still too much: -ngl guessed from the layers' bytes without
    # their experts (with them, one layer a reserve: 40 in all)
    ("deepseek-v3-q4_k_m.yaml", 8, False, (24, 5376), 7),
])
def test_ctx_auto_reserves_on_the_cards(card, gib, flash, answer, reserves):
    """The reserves of the whole fit (the -ngl phase at 4096 is three): was 10 on qwen3.5-27b
    at 8 GiB and 9 on gemma-3-27b before the context guess modelled the compute buffer."""
    model, b, got = card_fit(card, gib, flash)
    assert (got.ngl, got.ctx) == answer
    assert len(got.probes) <= reserves, got.probes
    probe = fitmod.Prober(model, b, ModelOptions(flash_attn=flash, parallel=1), [GiB, 0])
    assert not fitmod.all_fit(probe(got.ngl, got.ctx + fitmod.CTX_STEP))
