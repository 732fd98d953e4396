"""llama.cpp's gemma3 graph (src/models/gemma3.cpp): the embeddings scaled by sqrt(n_embd)
("inp_scaled"), RMS norms over each Q and K head, Q scaled before attention (then a KQ scale of
1), a norm after attention and another after the FFN (post_attention_norm, post_ffw_norm: the
latter through build_norm with layer -1, so neither named "norm-<il>" nor pinned), a GEGLU FFN,
an optional final logit softcap (scale, tanh, scale) and a tied output.

With `attention.sliding_window` set, layers slide by `attention.sliding_window_pattern` (a
period n, default 6: layer il slides unless il % n == n - 1; or one bool per layer): their K/V
go to llama_kv_cache_iswa's SWA cache and they rope with rope.freq_base_swa (default 10000) and
a scale of 1; the others use the context's base and scale (Gemma-3-27B: 1e6, linear x8).
Without the key no layer slides and the cache is the plain one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import ROPE_TYPE_NEOX, Arch, decoder_tensors
from ggmlrun.models.hparams.record import HParams

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder


def swa_pattern(n_layer: int, n_pattern: int, dense_first: bool = False) -> tuple:
    """llama_hparams::set_swa_pattern: with a period n, layer il slides unless it is the last
    (first, `dense_first`) of its period; n = 0: every layer slides."""
    if dense_first:
        return tuple(n_pattern == 0 or il % n_pattern != 0 for il in range(n_layer))
    return tuple(n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer))


def read_swa(get, n_layer: int, default_pattern: int) -> dict:
    """llama_model_base::load_swa_pattern for a model whose window is set: the per-layer bool
    array when the key is one, else the period (default `default_pattern`)."""
    n_swa = get("attention.sliding_window", 0)
    if not n_swa:
        return {}
    pattern = get("attention.sliding_window_pattern", default_pattern)
    layers = tuple(pattern) if isinstance(pattern, tuple) else swa_pattern(n_layer, pattern)
    if not any(layers):
        raise InputError(f"attention.sliding_window is {n_swa} but no layer slides (pattern "
                         f"{pattern}); llama.cpp asserts is_swa_any()")
    return dict(n_swa=n_swa, swa_layers=layers,
                rope_freq_base_swa=float(get("rope.freq_base_swa", 10000.0)))


def read_hparams(get, common: dict) -> HParams:
    hp = dict(common, **read_swa(get, common["n_layer"], 6),
              f_final_logit_softcapping=float(get("final_logit_softcapping", 0.0)))
    # LLM_TYPE_27B (62 layers) scales Q by 1/sqrt(n_embd / n_head), the others by the head size
    if common["n_layer"] == 62:
        hp["f_attention_scale"] = 1.0 / math.sqrt(float(common["n_embd"] // common["n_head"]))
    else:
        hp["f_attention_scale"] = 1.0 / math.sqrt(float(common["n_embd_head_k"]))
    return HParams(**hp)


def tensors(hp):
    return decoder_tensors("gemma3", hp, q_k_norm=True, post_norms=True)


def build(d: Decoder):
    hp, b = d.hp, d.b
    inpL = b.cb(b.op("scale", [d.inpL], d.inpL.shape, s=math.sqrt(hp.n_embd)), "inp_scaled", -1)
    for il in range(hp.n_layer):
        d.add_kv_layer(il)
        rope = d.rope_for(il)
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        q, k, v = d.qkv(il, cur, hp.n_embd_head_k, hp.n_head, hp.n_head_kv)
        q = b.cb(d.norm(q, d.weight(T.ATTN_Q_NORM, il), il), "Qcur_normed", il)
        q = d.rope_ext(q, None, rope)
        k = b.cb(d.norm(k, d.weight(T.ATTN_K_NORM, il), il), "Kcur_normed", il)
        k = d.rope_ext(k, None, rope)
        b.cb(q, "Qcur", il)
        b.cb(k, "Kcur", il)
        b.cb(v, "Vcur", il)
        q = b.op("scale", [q], q.shape, s=hp.f_attention_scale)
        cur = d.attn(il, q, k, v, 1.0)
        cur, inpL = d.last_rows(il, cur, inpL)
        cur = b.cb(d.norm(cur, d.weight(T.ATTN_POST_NORM, il), il), "attn_post_norm", il)
        sa_out = b.cb(d.add(cur, inpL), "sa_out", il)
        cur = b.cb(d.norm(sa_out, d.weight(T.FFN_NORM, il), il), "ffn_norm", il)
        cur = b.cb(d.ffn_swiglu(il, cur, glu="geglu"), "ffn_out", il)
        cur = b.cb(d.norm(cur, d.weight(T.FFN_POST_NORM, il), -1), "ffn_post_norm", il)
        inpL = b.cb(d.add(cur, sa_out), "l_out", il)
    return inpL


ARCH = Arch(name="gemma3", rope_type=ROPE_TYPE_NEOX, tensors=tensors, build=build,
            read_hparams=read_hparams, card_tensors=frozenset(),
            card_hparams={"n_swa": ("attention.sliding_window", False, None),
                          "swa_pattern": ("attention.sliding_window_pattern", False, None),
                          "rope_freq_base_swa": ("rope.freq_base_swa", False, None),
                          "final_logit_softcapping": ("final_logit_softcapping", False, None)})
