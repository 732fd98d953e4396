"""The end of every model's graph: llama.cpp's output head (result_norm, the lm_head and its
optional bias and softcap, result_output) and the ModelGraph that the finished graph is handed
on as: to placement, the reserves and `run`, which read only this, never the Decoder that
built it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.graph.attention import KVCache


@dataclass
class ModelGraph:
    graph: Graph
    weights: dict[str, Tensor]            # GGUF name -> leaf
    output_weight: Tensor                  # what result_output multiplies by (tied: a duplicate)
    cache: KVCache
    inputs: dict[str, Tensor]
    norm_pins: list[tuple[Tensor, int]]    # rms_norm nodes llama.cpp may pin, with their layer
    kqv_outs: list[Tensor]                 # pinned to the CPU when the KV cache stays there
    rope_freqs: dict[int, Tensor]          # per layer: its rope factors (or their duplicate)
    n_tokens: int
    n_outputs: int
    rope_freqs_name: str = "rope_freqs.weight"   # the GGUF tensor rope_freqs' leaves hold
    # inputs an architecture adds, each with how run fills it from the token positions
    extra_inputs: dict[Tensor, Callable] = field(default_factory=dict)
    fa_nodes: list[tuple[Tensor, int]] = field(default_factory=list)   # (node, layer)
    # llama_kv_cache_iswa: the sliding-window layers' cache and its own attention inputs
    # (k_idxs, v_idxs, kq_mask, named as the full cache's); None / {} without SWA layers
    swa_cache: KVCache | None = None
    swa_inputs: dict[str, Tensor] = field(default_factory=dict)
    swa_n_kv: int = 0                      # cells the SWA layers attend over
    n_swa: int = 0                         # the window (the SWA mask's rule)

    @property
    def caches(self) -> list[KVCache]:
        """Every attention cache: the full one, then the SWA one."""
        return [self.cache] + ([self.swa_cache] if self.swa_cache is not None else [])


def output_head(d, inpL: Tensor, softcap: float | None = None,
                rows_after_norm: bool = False, rows_before_norm: bool = False) -> ModelGraph:
    """result_norm, the lm_head (plus output.bias where the architecture has one; with
    `softcap`, the final logit softcapping scale, tanh, scale) as result_output, and the
    graph."""
    b = d.b
    outputs = []
    norm_w = d.weights[d.hp.output_norm]      # output_norm (lfm2: token_embd_norm)
    if rows_after_norm:    # gemma4: every row normed (h_nextn, an output), then out_ids'
        h = b.cb(d.norm(inpL, norm_w, -1), "h_nextn", -1)
        outputs.append(h)
        cur = b.cb(b.op("get_rows", [h, d.inputs["out_ids"]], (d.n_outputs, h.shape[-1])),
                   "result_norm", -1)
    elif rows_before_norm:    # gpt-oss: every row out of the last layer (t_h_nextn, an
        outputs.append(inpL)  # output), then out_ids' rows, then the norm
        cur = b.op("get_rows", [inpL, d.inputs["out_ids"]], (d.n_outputs, inpL.shape[-1]))
        cur = b.cb(d.norm(cur, norm_w, -1), "result_norm", -1)
    else:
        cur = b.cb(d.norm(inpL, norm_w, -1), "result_norm", -1)
    result_norm = cur
    cur = d.ctx.mul_mat(d.output_w, cur)
    bias = d.optional(T.OUTPUT, None, "bias")
    if bias is not None:
        cur = d.add_bias(cur, bias)
    if d.hp.f_logit_scale:       # granite: the logits divided by logit_scale
        from ggmlrun.models.hparams.rules import as_f32
        cur = b.op("scale", [cur], cur.shape, s=as_f32(1.0 / as_f32(d.hp.f_logit_scale)))
    if softcap is None:
        softcap = d.hp.f_final_logit_softcapping
    if softcap:
        from ggmlrun.models.hparams.rules import as_f32     # 1.0f / softcap, in float
        cur = b.op("scale", [cur], cur.shape, s=as_f32(1.0 / as_f32(softcap)))
        cur = b.op("tanh", [cur], cur.shape)
        cur = b.op("scale", [cur], cur.shape, s=softcap)
    cur = b.cb(cur, "result_output", -1)
    b.expand(cur)
    graph = b.graph(d.model.name, outputs=outputs + [result_norm, cur])
    graph.path = d.model.path
    return ModelGraph(graph=graph, weights=d.weights, output_weight=d.output_w,
                      cache=d.cache, inputs=d.inputs,
                      norm_pins=[(t, il) for t, _, il in b.pins],
                      kqv_outs=list(b.kqv_outs), fa_nodes=list(b.fa_nodes), rope_freqs=d.rope_freqs,
                      n_tokens=d.n_tokens, n_outputs=d.n_outputs,
                      rope_freqs_name=d.rope_freqs_name or "rope_freqs.weight",
                      extra_inputs=d.extra_inputs, swa_cache=d.swa_cache,
                      swa_inputs=d.swa_inputs, swa_n_kv=d.swa_n_kv,
                      n_swa=d.hp.n_swa)

