"""Chunked attention (llama4's LLAMA_SWA_TYPE_CHUNKED) as its own kind of sliding-window cache:
a token sees exactly the earlier positions of its own chunk, and the standard kind keeps its
window; the mask the runner gives a chunked cache follows the same rule."""

import numpy as np

from ggmlrun.models.graph.builder import GraphBuilder
from ggmlrun.models.memory.caches import create_memory, swa_visible
from ggmlrun.models.run import attn_input_values


def test_a_chunked_token_sees_its_own_chunk_only():
    for n in (1, 2, 3, 5, 8):
        p1, p0 = np.meshgrid(np.arange(40), np.arange(40), indexing="ij")
        same_chunk = p0 // n == p1 // n
        seen = swa_visible("chunked", n, p0, p1) & (p0 <= p1)
        assert (seen == (same_chunk & (p0 <= p1))).all(), n


def test_the_standard_window_is_unchanged():
    for n in (1, 2, 3, 5, 8):
        p1, p0 = np.meshgrid(np.arange(40), np.arange(40), indexing="ij")
        assert (swa_visible("standard", n, p0, p1) == (p1 - p0 < n)).all(), n


def test_a_chunked_cache_is_masked_by_chunks():
    b = GraphBuilder()
    for n_tok, p0, n in ((7, 0, 3), (5, 4, 4), (12, 0, 5), (3, 9, 2)):
        n_kv = 16
        inp = {"k_idxs": b.leaf("k", (n_tok,), "i64"), "v_idxs": b.leaf("v", (n_tok,), "i64"),
               "kq_mask": b.leaf("m", (1, 1, n_tok, n_kv), "f32")}
        mask = attn_input_values(inp, n_tok, n_kv, n_kv, 8, n_swa=n, p0=p0,
                                 swa_type="chunked")[inp["kq_mask"]].reshape(n_tok, n_kv)
        for t in range(n_tok):
            p1 = p0 + t
            want = [c <= p1 and c // n == p1 // n for c in range(n_kv)]
            assert list(mask[t] == 0) == want, (n_tok, p0, n, t)


def test_the_swa_cache_keeps_its_kind():
    class HP:      # the per-layer questions create_memory asks
        n_layer, has_swa, is_mla, swa_type = 4, True, False, "chunked"
        n_embd_v_gqa = 8
        is_recurrent = staticmethod(lambda il: False)
        has_kv = staticmethod(lambda il: True)
        is_swa = staticmethod(lambda il: il % 4 < 3)
        n_embd_k_gqa_l = n_embd_v_gqa_l = staticmethod(lambda il: 8)
    memory = create_memory(HP, cells=256, flash_attn=True, swa_cells=256)
    assert memory.swa.swa_type == "chunked" and memory.kv.swa_type == ""
    assert sorted(memory.swa.widths) == [0, 1, 2] and sorted(memory.kv.widths) == [3]
