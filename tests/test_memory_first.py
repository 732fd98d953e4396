"""Memory is sized before the graph (models/memory/caches.py, as llama_model::create_memory):
the claims that make that true.

- The graph's cache leaves are exactly the memory's tensors (names, shapes, types), on every
  bundled model and card, over the options that change the caches (context, streams, SWA
  cells, flash attention's V layout, KV type, sequences).
- A measure that stops at the weights and memory ("none") builds no graph at all.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ggmlrun.core.backends.spec import BackendSpec, GiB
from ggmlrun.models import reserve
from ggmlrun.models.cards.reader import bundled_cards, read_card
from ggmlrun.models.memory.caches import model_memory
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.params import ModelOptions

ROOT = Path(__file__).resolve().parent.parent
TINY = sorted((ROOT / "examples" / "models").glob("tiny-*-f16.gguf"))
CARDS = [p for p in bundled_cards() if p.stem.startswith(("gemma-4-26b", "qwen3.5-35b"))]
# each option that changes a cache, off and on, in few combinations: the context (cells), V
# transposed or not (flash attention; gemma4's V widths), streams and sequences (-np with and
# without -kvu), the SWA cache's size, the cache's type
OPTIONS = [ModelOptions(ctx=ctx, flash_attn=fa, parallel=np_, kv_unified=kvu, swa_full=swa,
                        kv_type=kv)
           for ctx, fa, np_, kvu, swa, kv in (
               (256, False, 1, False, False, "f16"), (1300, True, 3, False, True, "q8_0"),
               (1300, False, 2, True, False, "f16"), (256, True, 3, False, False, "f16"),
               (1300, False, 1, False, True, "f16"), (256, True, 2, True, True, "q8_0"))]


def _model(path: Path):
    return read_gguf(path) if path.suffix == ".gguf" else read_card(path)


def _leaves(mg) -> set[tuple]:
    out = set()
    for cache in mg.caches:
        for leaves in (cache.k, cache.v):
            out |= {(t.name, t.shape, t.dtype) for t in leaves.values()}
    for leaves in (mg.cache.r, mg.cache.s):
        out |= {(t.name, t.shape, t.dtype) for t in leaves.values()}
    return out


@pytest.mark.parametrize("path", TINY + CARDS, ids=lambda p: p.stem)
def test_the_graph_views_exactly_the_memory_sized_before_it(path):
    model = _model(path)
    hp = model.hparams
    for opts in OPTIONS:
        if opts.type_k == "q8_0" and (hp.n_embd_head_k % 32 or hp.n_embd_head_v % 32
                                      or hp.is_mla):
            continue
        memory = model_memory(hp, opts)
        mg = reserve.model_graph(model, memory, 8, 8)
        want = {(t.name, t.shape, t.dtype) for t in memory.kv_tensors() + memory.state_tensors()}
        assert _leaves(mg) == want, (path.stem, opts)
        # every layer the graph runs has its memory: a cache or a state, never neither
        layers = {t.il for t in memory.kv_tensors() + memory.state_tensors()}
        assert layers <= set(range(hp.n_layer)), (path.stem, opts)


def test_a_measure_cut_short_at_the_memory_builds_no_graph(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a graph was built")

    monkeypatch.setattr(reserve, "graph_over", refuse)
    backends = [BackendSpec("GPU0", "sim", 1 * GiB, 32), BackendSpec("CPU", "cpu", 64 * GiB, 32)]
    for path in TINY[:3] + CARDS:
        model = _model(path)
        m = reserve.measure_model(model, backends, ModelOptions(ctx=512),
                                  enough=lambda figures, reserved: True)
        assert m.reserved == "none" and m.schedule is None
        assert sum(b.kv_bytes + b.state_bytes for b in m.backends) > 0
    with pytest.raises(AssertionError, match="a graph was built"):
        reserve.measure_model(_model(TINY[0]), backends, ModelOptions(ctx=512))


def test_memory_bytes_equal_the_measure_whatever_the_placement():
    """kv_bytes and state_bytes of a measure are the memory's, placed layer by layer."""
    model = _model(next(p for p in TINY if "qwen35-" in p.name))
    for ngl, nkvo in itertools.product((0, 2, None), (False, True)):
        opts = ModelOptions(ctx=512, ngl=ngl, no_kv_offload=nkvo)
        backends = [BackendSpec("GPU0", "sim", 8 * GiB, 32),
                    BackendSpec("CPU", "cpu", 64 * GiB, 32)]
        m = reserve.measure_model(model, backends, opts, enough=lambda f, r: True)
        memory = model_memory(model.hparams, opts)
        total = sum(t.nbytes for t in memory.kv_tensors() + memory.state_tensors())
        assert sum(b.kv_bytes + b.state_bytes for b in m.backends) == total
        if nkvo:
            assert m.backends[0].kv_bytes == m.backends[0].state_bytes == 0
