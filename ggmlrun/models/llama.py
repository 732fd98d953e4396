"""llama.cpp's llama graph (src/models/llama.cpp, llama.cpp vendored by llama-cpp-python 0.3.36).

One ubatch of `n_tokens` tokens, `n_outputs` output rows and `n_kv` cache cells attended over.
Every call below is one of llama.cpp's, in its order, so the nodes, their order and their names
are llama.cpp's: a change here should be read against that file and llama-graph.cpp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.types import TYPES
from ggmlrun.models.graph_common import GraphBuilder, KVCache, LayerContext, build_attn_kv
from ggmlrun.models.hparams import LlamaHParams
from ggmlrun.models.modelfile import ModelFile, check_tensors

ROPE_TYPE_NORM = 0


@dataclass
class ModelGraph:
    graph: Graph
    weights: dict[str, Tensor]            # GGUF name -> leaf
    output_weight: Tensor                  # what result_output multiplies by (tied: a duplicate)
    cache: KVCache
    inputs: dict[str, Tensor]
    norm_pins: list[tuple[Tensor, int]]    # rms_norm nodes llama.cpp may pin, with their layer
    kqv_outs: list[Tensor]                 # pinned to the CPU when the KV cache stays there
    rope_freqs: dict[int, Tensor]          # per layer: rope_freqs.weight or its duplicate
    n_tokens: int
    n_outputs: int


def build_llama(model: ModelFile, n_tokens: int, n_outputs: int, n_kv: int, kv_size: int,
                flash_attn: bool, kv_type: str) -> ModelGraph:
    hp: LlamaHParams = model.hparams
    b = GraphBuilder()
    weights = {name: GraphBuilder.leaf(name, info.shape, info.dtype, role="weight")
               for name, info in model.tensors.items()}
    check_tensors(hp, model.tensors, str(model.path) if model.path else None)
    tied = "output.weight" not in weights
    output_w = weights.get("output.weight")
    if tied:     # TENSOR_DUPLICATED: the same bytes, possibly in another buffer
        src = weights["token_embd.weight"]
        output_w = GraphBuilder.leaf(src.name, src.shape, src.dtype, role="weight")
    ctx = LayerContext(b=b, n_tokens=n_tokens, n_outputs=n_outputs, n_kv=n_kv, kv_size=kv_size,
                       flash_attn=flash_attn, norm_rms_eps=hp.norm_rms_eps)
    cache = KVCache(kv_type=kv_type, kv_size=kv_size, v_trans=not flash_attn)
    T = n_tokens
    hd = hp.n_embd_head_k

    # build_inp_embd: tokens and the (unused, still allocated) embeddings input
    tokens = b.leaf("inp_tokens", (T,), "i32")
    inp_embd = b.leaf("inp_embd", (T, hp.n_embd), "f32")
    tok_embd = weights["token_embd.weight"]
    inpL = b.op("get_rows", [tok_embd, tokens], (T, hp.n_embd))
    b.expand(inpL)
    b.expand(inp_embd)           # ggml_build_forward_select adds both candidates
    b.cb(inpL, "embd", -1)
    inputs = {"tokens": tokens, "embd": inp_embd,
              "pos": b.leaf("inp_pos", (T,), "i32"),
              "k_idxs": b.leaf("attn_inp_k_idxs", (T,), "i64"),
              "v_idxs": b.leaf("attn_inp_v_idxs", (T * hp.n_embd_v_gqa,) if not flash_attn else (T,),
                               "i64"),
              "kq_mask": b.leaf("attn_inp_kq_mask", (1, 1, T, n_kv), "f16" if flash_attn else "f32"),
              "out_ids": b.leaf("out_ids", (n_outputs,), "i32")}
    inputs.update(rotation_inputs(b, hp, kv_type))
    kq_scale = 1.0 / math.sqrt(float(hd))
    # Llama 3's rope_freqs: one tensor made at layer 0 and TENSOR_DUPLICATED into any other
    # layer's buffer; a leaf per layer here, each placed where that layer's copy lives
    freqs = weights.get("rope_freqs.weight")
    rope_freqs = {}
    rope = dict(n_dims=hp.n_rot, mode=ROPE_TYPE_NORM, n_ctx_orig=hp.n_ctx_train,
                freq_base=hp.rope_freq_base, freq_scale=hp.rope_freq_scale, ext_factor=0.0,
                attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)

    for il in range(hp.n_layer):
        cache.add_layer(il, hp.n_embd_k_gqa, hp.n_embd_v_gqa)
        w = lambda key: weights[f"blk.{il}.{key}.weight"]  # noqa: E731
        inpSA = inpL
        cur = b.cb(ctx.build_norm(inpL, w("attn_norm"), il), "attn_norm", il)

        # build_qkv, separate Q/K/V
        q = b.cb(ctx.mul_mat(w("attn_q"), cur), "Qcur", il)
        k = b.cb(ctx.mul_mat(w("attn_k"), cur), "Kcur", il)
        v = b.cb(ctx.mul_mat(w("attn_v"), cur), "Vcur", il)
        q = b.cb(b.reshape(q, (T, hp.n_head, hd)), "Qcur", il)
        k = b.cb(b.reshape(k, (T, hp.n_head_kv, hd)), "Kcur", il)
        v = b.cb(b.reshape(v, (T, hp.n_head_kv, hp.n_embd_head_v)), "Vcur", il)
        srcs = [inputs["pos"]]
        if freqs is not None:
            rope_freqs[il] = freqs if il == 0 else GraphBuilder.leaf(
                freqs.name, freqs.shape, freqs.dtype, role="weight")
            srcs.append(rope_freqs[il])
        q = b.cb(b.op("rope", [q] + srcs, q.shape, **rope), "Qcur", il)
        k = b.cb(b.op("rope", [k] + srcs, k.shape, **rope), "Kcur", il)
        b.cb(v, "Vcur", il)

        cur = build_attn_kv(ctx, cache, inputs, w("attn_output"), q, k, v, kq_scale, il)
        b.cb(cur, "attn_out", il)
        if il == hp.n_layer - 1:
            cur = b.op("get_rows", [cur, inputs["out_ids"]], (n_outputs, hp.n_embd))
            inpSA = b.op("get_rows", [inpSA, inputs["out_ids"]], (n_outputs, hp.n_embd))
        ffn_inp = b.cb(b.op("add", [cur, inpSA], cur.shape), "ffn_inp", il)
        cur = b.cb(ctx.build_norm(ffn_inp, w("ffn_norm"), il), "ffn_norm", il)
        cur = b.cb(ctx.build_ffn_swiglu(cur, w("ffn_up"), w("ffn_gate"), w("ffn_down"), il),
                   "ffn_out", il)
        cur = b.cb(b.op("add", [cur, ffn_inp], cur.shape), "ffn_out", il)
        inpL = b.cb(cur, "l_out", il)

    cur = b.cb(ctx.build_norm(inpL, weights["output_norm.weight"], -1), "result_norm", -1)
    result_norm = cur
    cur = b.cb(ctx.mul_mat(output_w, cur), "result_output", -1)
    b.expand(cur)
    graph = b.graph(model.name, outputs=[result_norm, cur])
    graph.path = model.path
    return ModelGraph(graph=graph, weights=weights, output_weight=output_w, cache=cache,
                      inputs=inputs, norm_pins=[(t, il) for t, _, il in b.pins],
                      kqv_outs=list(b.kqv_outs), rope_freqs=rope_freqs, n_tokens=n_tokens, n_outputs=n_outputs)


def rotation_inputs(b: GraphBuilder, hp: LlamaHParams, kv_type: str) -> dict[str, Tensor]:
    """llama_kv_cache's Hadamard rotations for a quantized cache (attn_rot_k / attn_rot_v): K
    rotates by the largest power of two from 64 up dividing the head size, V by 64."""
    if not TYPES[kv_type].is_block:
        return {}
    out = {}
    if hp.n_embd_head_k % 64 == 0:
        nrot = 64
        while hp.n_embd_head_k % (nrot * 2) == 0:
            nrot *= 2
        out["k_rot"] = b.leaf("attn_inp_k_rot", (nrot, nrot), "f32")
    if hp.n_embd_head_v % 64 == 0:
        out["v_rot"] = b.leaf("attn_inp_v_rot", (64, 64), "f32")
    return out
