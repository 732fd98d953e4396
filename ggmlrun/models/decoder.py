"""llama.cpp's llm_graph_context for one ubatch of a decoder-only model: the inputs, the shared
layer pieces (build_norm, build_qkv, rope, build_attn, build_ffn) and the output head. An
architecture module (models/llama.py, models/arch/*.py) is then only its layer loop, as
llama.cpp's src/models/<arch>.cpp are.

One ubatch of `n_tokens` tokens, `n_outputs` output rows and `n_kv` cache cells attended over.
Every call is one of llama.cpp's (src/llama-graph.cpp), in its order, so the nodes, their order
and their names are llama.cpp's. Weights are looked up by gguf's tensor names
(models/arch/base.py `tn`), never by retyped strings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from ggmlrun.core.util.lazynumpy import np     # only YaRN needs it: model headers load no NumPy

from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.base import MODEL_TENSOR as T
# check_tensors and default_kq_scale lived here; arch modules import them from base
from ggmlrun.models.arch.base import check_tensors, default_kq_scale, tn  # noqa: F401
from ggmlrun.models.graph_common import GraphBuilder, KVCache, LayerContext, build_attn_kv


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


class Decoder:
    """The graph being built for one model and ubatch shape (llm_graph_context)."""

    def __init__(self, model, arch, n_tokens: int, n_outputs: int, n_kv: int, kv_size: int,
                 flash_attn: bool, kv_type: str, table: dict | None = None, n_stream: int = 1,
                 swa_size: int = 0, swa_n_kv: int = 0):
        hp = self.hp = model.hparams
        self.model, self.arch = model, arch
        self.table = table if table is not None else arch.tensors(hp)   # what llama.cpp loads
        b = self.b = GraphBuilder()
        self.weights = {name: GraphBuilder.leaf(name, info.shape, info.dtype, role="weight")
                        for name, info in model.tensors.items()}
        self.T, self.n_outputs = n_tokens, n_outputs
        self.ctx = LayerContext(b=b, n_tokens=n_tokens, n_outputs=n_outputs, n_kv=n_kv,
                                kv_size=kv_size, flash_attn=flash_attn,
                                norm_rms_eps=hp.norm_rms_eps)
        self.cache = KVCache(kv_type=kv_type, kv_size=kv_size, v_trans=not flash_attn,
                             n_stream=n_stream)
        self.n_ctx = kv_size
        out_name = self.name(T.OUTPUT)
        self.output_w = self.weights.get(out_name)
        if self.output_w is None:     # TENSOR_DUPLICATED: the same bytes, possibly elsewhere
            src = self.weight(T.TOKEN_EMBD)
            self.output_w = GraphBuilder.leaf(src.name, src.shape, src.dtype, role="weight")
        self.rope_freqs: dict[int, Tensor] = {}
        self.shared: dict[str, tuple[int, ...]] = {}
        self.extra_inputs: dict[Tensor, Callable] = {}
        if hp.rope_scaling == "longrope" and not arch.longrope:
            raise InputError(f"rope scaling 'longrope' is not supported for {arch.name} yet "
                             f"(its rope_factors_long/short tensors)")
        self.rope_freqs_name = self._rope_factors_name(kv_size)
        T_ = n_tokens
        # build_inp_embd: tokens and the (unused, still allocated) embeddings input
        tokens = b.leaf("inp_tokens", (T_,), "i32")
        inp_embd = b.leaf("inp_embd", (T_, hp.n_embd), "f32")
        self.inpL = b.op("get_rows", [self.weight(T.TOKEN_EMBD), tokens], (T_, hp.n_embd))
        b.expand(self.inpL)
        b.expand(inp_embd)           # ggml_build_forward_select adds both candidates
        b.cb(self.inpL, "embd", -1)
        self.inputs = {
            "tokens": tokens, "embd": inp_embd,
            "pos": b.leaf("inp_pos", (T_ * arch.n_pos_per_embd,), "i32"),
            "k_idxs": b.leaf("attn_inp_k_idxs", (T_,), "i64"),
            "v_idxs": b.leaf("attn_inp_v_idxs",
                             (T_ * hp.n_embd_v_gqa,) if not flash_attn else (T_,), "i64"),
            "kq_mask": b.leaf("attn_inp_kq_mask", (n_stream, 1, T_ // n_stream, n_kv),
                              "f16" if flash_attn else "f32"),
            "out_ids": b.leaf("out_ids", (n_outputs,), "i32")}
        self.inputs.update(rotation_inputs(b, hp, kv_type))
        self.rope = dict(n_dims=hp.n_rot, mode=arch.rope_type, **rope_params(hp))
        if arch.n_pos_per_embd == 4:       # ggml_rope_multi: the sections pick each pair's position
            self.rope["sections"] = list(hp.rope_sections)
        # a hybrid memory's recurrent half (models/arch/delta_net.py): the states the graph
        # sees (n_rs: the whole memory in a reserve) and the one it clears first (rs_z; -1:
        # none, as after a sequence's first ubatch)
        self.n_rs, self.rs_zero, self.n_seqs = 1, 0, 1
        # llama_kv_cache_iswa (build_attn_inp_kv_iswa): a second cache for the sliding-window
        # layers, of swa_size cells (default: the full cache's), with its own idxs and mask
        self.swa_cache, self.swa_inputs, self.swa_n_kv = None, {}, 0
        if hp.has_swa:
            self.swa_n_kv = swa_n_kv or n_kv
            swa_size = swa_size or kv_size
            self.swa_cache = KVCache(kv_type=kv_type, kv_size=swa_size, v_trans=not flash_attn,
                                     n_stream=n_stream)
            self.swa_inputs = {
                "k_idxs": b.leaf("attn_inp_k_idxs", (T_,), "i64"),
                "v_idxs": b.leaf("attn_inp_v_idxs",
                                 (T_ * hp.n_embd_v_gqa,) if not flash_attn else (T_,), "i64"),
                "kq_mask": b.leaf("attn_inp_kq_mask", (n_stream, 1, T_ // n_stream,
                                                       self.swa_n_kv),
                                  "f16" if flash_attn else "f32")}
            self.swa_inputs.update(rotation_inputs(b, hp, kv_type))

    # --- weights by gguf's names --------------------------------------------------------------
    def _lists(self, t) -> bool:
        try:
            tn(self.arch.name, t)
        except KeyError:
            return False
        return True

    def name(self, t, il: int | None = None, suffix: str = "weight") -> str:
        return tn(self.arch.name, t, suffix, il)

    def weight(self, t, il: int | None = None, suffix: str = "weight") -> Tensor:
        name = self.name(t, il, suffix)
        leaf = self.weights.get(name)
        if leaf is None:
            raise InputError(f"model lacks tensor '{name}', which a {self.arch.name} model needs")
        return leaf

    def optional(self, t, il: int | None = None, suffix: str = "weight") -> Tensor | None:
        """A tensor llama.cpp creates with TENSOR_NOT_REQUIRED for this architecture: the leaf
        when the file has it; None when absent or when the architecture does not load it."""
        if not self._lists(t):
            return None
        name = self.name(t, il, suffix)
        return self.weights.get(name) if name in self.table else None

    # --- llm_graph_context's pieces -------------------------------------------------------------
    def norm(self, cur: Tensor, weight: Tensor, il: int) -> Tensor:
        """build_norm, LLM_NORM_RMS with a weight: rms_norm named "norm-<il>" (pinned), mul."""
        return self.ctx.build_norm(cur, weight, il)

    def add_bias(self, cur: Tensor, bias: Tensor | None) -> Tensor:
        return cur if bias is None else self.b.op("add", [cur, bias], cur.shape)

    def qkv(self, il: int, cur: Tensor, n_embd_head: int, n_head: int, n_head_kv: int):
        """build_qkv: a fused attn_qkv as three strided views of one product, or separate Q, K,
        V products, each plus its optional bias; named Qcur/Kcur/Vcur as llama.cpp names them."""
        b, cb, T_ = self.b, self.b.cb, self.T
        wqkv = self.optional(T.ATTN_QKV, il)
        if wqkv is not None:
            qkv = cb(self.ctx.mul_mat(wqkv, cur), "wqkv", il)
            bias = self.optional(T.ATTN_QKV, il, "bias")
            if bias is not None:
                qkv = cb(self.add_bias(qkv, bias), "wqkv_b", il)
            n_q, n_k = n_embd_head * n_head, n_embd_head * n_head_kv
            item = TYPES[qkv.dtype].type_size
            views = []
            for heads, offset in ((n_head, 0), (n_head_kv, n_q), (n_head_kv, n_q + n_k)):
                views.append(b.view(qkv, (T_, heads, n_embd_head),
                                    (qkv.strides[-2], n_embd_head * item, item), offset * item))
            q, k, v = views
        else:
            out = []
            for t, heads, label in ((T.ATTN_Q, n_head, "Qcur"), (T.ATTN_K, n_head_kv, "Kcur"),
                                    (T.ATTN_V, n_head_kv, "Vcur")):
                x = cb(self.ctx.mul_mat(self.weight(t, il), cur), label, il)
                bias = self.optional(t, il, "bias")
                if bias is not None:
                    x = cb(self.add_bias(x, bias), label, il)
                out.append(x)
            q, k, v = (b.reshape(x, (T_, heads, n_embd_head))
                       for x, heads in zip(out, (n_head, n_head_kv, n_head_kv)))
        return cb(q, "Qcur", il), cb(k, "Kcur", il), cb(v, "Vcur", il)

    def _rope_factors_name(self, n_ctx_seq: int) -> str:
        """llama_model::get_rope_factors: rope_freqs when the model has it, else LongRoPE's
        long factors when the context (n_ctx_seq: the padded context, one sequence) exceeds
        the original one, the short ones otherwise; "" when the model has none."""
        candidates = [T.ROPE_FREQS]
        if self.arch.longrope:
            candidates.append(T.ROPE_FACTORS_LONG if n_ctx_seq > self.hp.n_ctx_orig_yarn
                              else T.ROPE_FACTORS_SHORT)
        for t in candidates:
            if self._lists(t):
                name = self.name(t)
                if name in self.table and name in self.weights:
                    return name
        return ""

    def rope_factors(self, il: int) -> Tensor | None:
        """llama_model::get_rope_factors: rope_freqs (made at layer 0, TENSOR_DUPLICATED into
        the other layers' buffers: a leaf per layer, each placed where that layer's copy is)."""
        if not self.rope_freqs_name:
            return None
        first = self.weights.get(self.rope_freqs_name)
        if first is None:
            return None
        rep = self.shared.get(first.name, range(il + 1))[il]    # the layer whose tensor it reads
        leaf = self.rope_freqs.get(rep) if rep != il else None
        origin = rope_freqs_layers(self.hp)[0]     # the layer that creates it (gemma4: the
        if leaf is None:                           # first full one), duplicated in the others
            leaf = first if il == origin else GraphBuilder.leaf(first.name, first.shape,
                                                                first.dtype, role="weight")
        self.rope_freqs[il] = leaf
        return leaf

    def rope_ext(self, x: Tensor, factors: Tensor | None, rope: dict | None = None) -> Tensor:
        """ggml_rope_ext with the context's parameters, or `rope` (a layer's own, e.g. an SWA
        layer's frequency base: rope_for)."""
        srcs = [x, self.inputs["pos"]] + ([factors] if factors is not None else [])
        return self.b.op("rope", srcs, x.shape, **(rope or self.rope))

    def rope_for(self, il: int) -> dict:
        """llama_model::get_rope_freq_base / _scale: an SWA layer's own base and scale
        (rope.freq_base_swa, default 10000, and a scale of 1), the context's otherwise."""
        if not self.hp.is_swa(il):
            return self.rope
        return dict(self.rope, freq_base=self.hp.rope_freq_base_swa,
                    freq_scale=self.hp.rope_freq_scale_swa)

    def kv_cache(self, il: int) -> KVCache:
        """The cache layer il stores to: the SWA cache for a sliding-window layer."""
        return self.swa_cache if self.hp.is_swa(il) else self.cache

    def add_kv_layer(self, il: int) -> None:
        self.kv_cache(il).add_layer(il, self.hp.n_embd_k_gqa, self.hp.n_embd_v_gqa)

    def attn(self, il: int, q: Tensor, k: Tensor | None, v: Tensor | None, kq_scale: float,
             kv_layer: int | None = None, sinks: Tensor | None = None) -> Tensor:
        """build_attn over the KV cache (an SWA layer's over the SWA cache, with its own
        inputs), then wo and its optional bias. Without k and v, over layer `kv_layer`'s cache
        (a KV-shared layer). `sinks`: the layer's attention sinks (gpt-oss)."""
        if self.swa_cache is not None and self.hp.is_swa(il):
            cache, inputs, n_kv = self.swa_cache, self.swa_inputs, self.swa_n_kv
        else:
            cache, inputs, n_kv = self.cache, self.inputs, self.ctx.n_kv
        cur = build_attn_kv(self.ctx, cache, inputs, self.weight(T.ATTN_OUT, il),
                            q, k, v, kq_scale, il, n_kv=n_kv, iswa=self.swa_cache is not None,
                            kv_layer=kv_layer, sinks=sinks)
        bias = self.optional(T.ATTN_OUT, il, "bias")
        return self.add_bias(cur, bias)

    def ffn_swiglu(self, il: int, cur: Tensor, glu: str = "swiglu", up=T.FFN_UP,
                   gate=T.FFN_GATE, down=T.FFN_DOWN) -> Tensor:
        """build_ffn(up, gate, down, LLM_FFN_SILU (or GELU: glu "geglu"), LLM_FFN_PAR), each
        with its optional bias (a shared expert: the *_shexp tensors, named as build_ffn names
        any)."""
        b, cb, ctx = self.b, self.b.cb, self.ctx
        w_up, w_gate, w_down = up, gate, down
        tmp = cb(ctx.mul_mat(self.weight(w_up, il), cur), "ffn_up", il)
        bias = self.optional(w_up, il, "bias")
        if bias is not None:
            tmp = cb(self.add_bias(tmp, bias), "ffn_up_b", il)
        gate = cb(ctx.mul_mat(self.weight(w_gate, il), cur), "ffn_gate", il)
        bias = self.optional(w_gate, il, "bias")
        if bias is not None:
            gate = cb(self.add_bias(gate, bias), "ffn_gate_b", il)
        act = cb(b.op("glu", [gate, tmp], gate.shape, op=glu, swapped=False), f"ffn_{glu}", il)
        cur = ctx.mul_mat(self.weight(w_down, il), act)
        bias = self.optional(w_down, il, "bias")
        if bias is not None:
            cur = self.add_bias(cb(cur, "ffn_down", il), bias)
        return cur

    def moe_ffn(self, il: int, cur: Tensor, *, n_expert: int, n_expert_used: int,
                norm_w: bool, w_scale: float = 0.0, gating: str = "softmax",
                exp_probs_b: Tensor | None = None, logits: Tensor | None = None,
                biases: bool = False, glu: str | dict = "swiglu") -> Tensor:
        """build_moe_ffn (LLM_FFN_SILU unless `glu` says otherwise): the router
        (ffn_gate_inp), its soft_max (or sigmoid) probabilities, the top n_expert_used by
        argsort (a view of its first columns), their weights (get_rows; with `norm_w` divided
        by their sum, clamped at f16's smallest normal), the experts' products (mul_mat_id),
        each weighted, then the experts' outputs added up in order (views of one tensor).
        `logits`: the router's output made by the architecture (llama.cpp's probs_in, gemma4);
        `glu`: the experts' gate ("geglu": LLM_FFN_GELU; gpt-oss's LLM_FFN_SWIGLU_OAI_MOE: the
        glu op's params, op swiglu_oai with its alpha and limit); experts_ffn says the rest.
        gpt-oss's variant: `biases` (the router's bias added to its logits, each expert's
        bias row added to its products by add_id), gating "softmax_weight" (the top experts
        by raw logit, their weights a soft_max over the chosen ones)."""
        b, cb = self.b, self.b.cb
        T_, n_embd = self.n_tokens_of(cur), cur.shape[-1]
        if logits is None:
            logits = cb(self.ctx.mul_mat(self.weight(T.FFN_GATE_INP, il), cur),
                        "ffn_moe_logits", il)
        if biases:
            logits = cb(self.add(logits, self.weight(T.FFN_GATE_INP, il, "bias")),
                        "ffn_moe_logits_biased", il)
        if gating == "softmax_weight":
            probs = logits
        elif gating == "softmax":
            probs = b.op("soft_max", [logits], logits.shape)
        elif gating == "sigmoid":
            probs = b.op("sigmoid", [logits], logits.shape)
        else:
            raise InputError(f"expert gating '{gating}' is not built")
        probs = cb(probs, "ffn_moe_probs", il)
        selection = probs
        if exp_probs_b is not None:
            selection = cb(self.add(probs, exp_probs_b), "ffn_moe_probs_biased", il)
        order = b.op("argsort", [selection], selection.shape, "i32", order="desc")
        selected = b.view(order, (T_, n_expert_used), (order.strides[-2], order.strides[-1]))
        cb(order, "ffn_moe_argsort", il)
        cb(selected, "ffn_moe_topk", il)
        probs3 = b.reshape(probs, (T_, n_expert, 1))
        weights = cb(b.op("get_rows", [probs3, selected], (T_, n_expert_used, 1)),
                     "ffn_moe_weights", il)
        if gating == "softmax_weight":
            weights = b.reshape(weights, (T_, n_expert_used))
            weights = b.op("soft_max", [weights], weights.shape)
            weights = cb(b.reshape(weights, (T_, n_expert_used, 1)), "ffn_moe_weights_softmax",
                         il)
        if norm_w:
            weights = b.reshape(weights, (T_, n_expert_used))
            total = cb(b.op("sum_rows", [weights], (T_, 1)), "ffn_moe_weights_sum", il)
            total = cb(b.op("clamp", [total], total.shape, min=6.103515625e-5, max=math.inf),
                       "ffn_moe_weights_sum_clamped", il)
            weights = cb(b.op("div", [weights, total], weights.shape), "ffn_moe_weights_norm", il)
            weights = b.reshape(weights, (T_, n_expert_used, 1))
        if w_scale not in (0.0, 1.0):
            weights = cb(b.op("scale", [weights], weights.shape, s=w_scale),
                         "ffn_moe_weights_scaled", il)
        b.expand(weights)
        cur = b.reshape(cur, (T_, 1, n_embd))
        experts = self.experts_ffn(il, cur, selected, glu, biases)
        experts = cb(b.op("mul", [experts, weights], experts.shape), "ffn_moe_weighted", il)
        b.expand(experts)
        views = []
        for i in range(n_expert_used):
            v = b.view(experts, (T_, n_embd), (experts.strides[-3], experts.strides[-1]),
                       i * experts.strides[-2])
            b.expand(v)
            views.append(v)
        out = views[0]
        for v in views[1:]:
            out = b.op("add", [out, v], out.shape)
            b.expand(out)
        if n_expert_used == 1:
            out = b.cont(out)
        return cb(out, "ffn_moe_out", il)

    def experts_ffn(self, il: int, cur: Tensor, selected: Tensor, glu: str | dict,
                    biases: bool = False) -> Tensor:
        """The selected experts' FFN: up and gate products (or, with a fused ffn_gate_up_exps,
        one product and its two halves as views), the GLU, the down product; each product
        times its per-expert scale where the file has one (build_lora_mm_id's w_s: the scale
        repeated over the tokens, its selected rows by get_rows)."""
        b, cb = self.b, self.b.cb
        gate_up = self.optional(T.FFN_GATE_UP_EXP, il)
        if gate_up is not None:
            gate_up = cb(self.mul_mat_id(gate_up, cur, selected), "ffn_moe_gate_up", il)
            T_, used, n_ff2 = gate_up.shape
            n_ff, item = n_ff2 // 2, TYPES[gate_up.dtype].type_size
            strides = (gate_up.strides[-3], gate_up.strides[-2], item)
            gate = cb(b.view(gate_up, (T_, used, n_ff), strides), "ffn_moe_gate", il)
            up = cb(b.view(gate_up, (T_, used, n_ff), strides, n_ff * item), "ffn_moe_up", il)
        else:
            up = self.biased_id(self.scaled_id(T.FFN_UP_EXP, il, cur, selected, "ffn_moe_up"),
                                T.FFN_UP_EXP, il, selected, "ffn_moe_up", biases)
            gate = self.biased_id(self.scaled_id(T.FFN_GATE_EXP, il, cur, selected, "ffn_moe_gate"),
                                  T.FFN_GATE_EXP, il, selected, "ffn_moe_gate", biases)
        params = dict(glu) if isinstance(glu, dict) else {"op": glu}
        act = cb(b.op("glu", [gate, up], gate.shape, swapped=False, **params),
                 f"ffn_moe_{params['op']}", il)
        down = self.scaled_id(T.FFN_DOWN_EXP, il, act, selected, "ffn_moe_down")
        return self.biased_id(down, T.FFN_DOWN_EXP, il, selected, "ffn_moe_down", biases)

    def biased_id(self, x: Tensor, t, il: int, ids: Tensor, label: str, biases: bool) -> Tensor:
        """gpt-oss: each selected expert's bias row added to its product (add_id)."""
        if not biases:
            return x
        row = self.weight(t, il, "bias")
        return self.b.cb(self.b.op("add_id", [x, row, ids], x.shape), f"{label}_biased", il)

    def scaled_id(self, t, il: int, cur: Tensor, ids: Tensor, name: str) -> Tensor:
        """The product named `name`; scaled, `name`_scaled (llama.cpp names it twice)."""
        b = self.b
        res = self.mul_mat_id(self.weight(t, il), cur, ids)
        scale = self.optional(t, il, "scale")
        if scale is None:
            return b.cb(res, name, il)
        (T_, used, _), n_expert = res.shape, scale.shape[-1]
        s = b.reshape(scale, (1, n_expert, 1))
        s = b.op("repeat", [s], (T_, n_expert, 1), shape=[T_, n_expert, 1])
        s = b.op("get_rows", [s, ids], (T_, used, 1))
        return b.cb(b.op("mul", [res, s], res.shape), f"{name}_scaled", il)

    def mul_mat_id(self, w: Tensor, cur: Tensor, ids: Tensor) -> Tensor:
        """ggml_mul_mat_id(w, cur, ids): w [E, M, K], cur [T, B, K], ids [T, U] -> [T, U, M]."""
        return self.b.op("mul_mat_id", [w, cur, ids], (cur.shape[-3], ids.shape[-1], w.shape[-2]))

    @staticmethod
    def n_tokens_of(cur: Tensor) -> int:
        return cur.shape[-2]

    def ffn_block(self, il: int, cur: Tensor, residual: Tensor, ffn=None) -> Tensor:
        """The post-attention tail llama, qwen2, qwen3(moe) and mistral3 share: the last
        layer's output rows, the residual (`ffn_inp`), `ffn_norm`, the FFN (`ffn(il, cur)`,
        default the dense SwiGLU) and the second residual, named `l_out`."""
        b = self.b
        cur, residual = self.last_rows(il, cur, residual)
        ffn_inp = b.cb(self.add(cur, residual), "ffn_inp", il)
        cur = b.cb(self.norm(ffn_inp, self.weight(T.FFN_NORM, il), il), "ffn_norm", il)
        cur = ffn(il, cur) if ffn else b.cb(self.ffn_swiglu(il, cur), "ffn_out", il)
        return b.cb(self.add(cur, ffn_inp), "l_out", il)

    def last_rows(self, il: int, cur: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """In the last layer only the output rows go on (get_rows by out_ids)."""
        if il != self.hp.n_layer - 1:
            return cur, residual
        ids = self.inputs["out_ids"]
        n = self.hp.n_embd
        return (self.b.op("get_rows", [cur, ids], (self.n_outputs, n)),
                self.b.op("get_rows", [residual, ids], (self.n_outputs, n)))

    def add(self, a: Tensor, c: Tensor) -> Tensor:
        return self.b.op("add", [a, c], a.shape)

    # --- the output head -----------------------------------------------------------------------
    def finish(self, inpL: Tensor, softcap: float | None = None,
               rows_after_norm: bool = False, rows_before_norm: bool = False) -> ModelGraph:
        """result_norm, the lm_head (plus output.bias where the architecture has one; with
        `softcap`, the final logit softcapping scale, tanh, scale) as result_output, and the
        graph."""
        b = self.b
        outputs = []
        if rows_after_norm:    # gemma4: every row normed (h_nextn, an output), then out_ids'
            h = b.cb(self.norm(inpL, self.weight(T.OUTPUT_NORM), -1), "h_nextn", -1)
            outputs.append(h)
            cur = b.cb(b.op("get_rows", [h, self.inputs["out_ids"]], (self.n_outputs, h.shape[-1])),
                       "result_norm", -1)
        elif rows_before_norm:    # gpt-oss: every row out of the last layer (t_h_nextn, an
            outputs.append(inpL)  # output), then out_ids' rows, then the norm
            cur = b.op("get_rows", [inpL, self.inputs["out_ids"]], (self.n_outputs, inpL.shape[-1]))
            cur = b.cb(self.norm(cur, self.weight(T.OUTPUT_NORM), -1), "result_norm", -1)
        else:
            cur = b.cb(self.norm(inpL, self.weight(T.OUTPUT_NORM), -1), "result_norm", -1)
        result_norm = cur
        cur = self.ctx.mul_mat(self.output_w, cur)
        bias = self.optional(T.OUTPUT, None, "bias")
        if bias is not None:
            cur = self.add_bias(cur, bias)
        if softcap is None:
            softcap = getattr(self.hp, "f_final_logit_softcapping", 0.0)
        if softcap:
            from ggmlrun.models.hparam_rules import as_f32     # 1.0f / softcap, in float
            cur = b.op("scale", [cur], cur.shape, s=as_f32(1.0 / as_f32(softcap)))
            cur = b.op("tanh", [cur], cur.shape)
            cur = b.op("scale", [cur], cur.shape, s=softcap)
        cur = b.cb(cur, "result_output", -1)
        b.expand(cur)
        graph = b.graph(self.model.name, outputs=outputs + [result_norm, cur])
        graph.path = self.model.path
        return ModelGraph(graph=graph, weights=self.weights, output_weight=self.output_w,
                          cache=self.cache, inputs=self.inputs,
                          norm_pins=[(t, il) for t, _, il in b.pins],
                          kqv_outs=list(b.kqv_outs), rope_freqs=self.rope_freqs,
                          n_tokens=self.T, n_outputs=self.n_outputs,
                          rope_freqs_name=self.rope_freqs_name or "rope_freqs.weight",
                          extra_inputs=self.extra_inputs, swa_cache=self.swa_cache,
                          swa_inputs=self.swa_inputs, swa_n_kv=self.swa_n_kv,
                          n_swa=self.hp.n_swa)


def build_graph(model, n_tokens: int, n_outputs: int, n_kv: int, kv_size: int,
                flash_attn: bool, kv_type: str, shared: tuple = (),
                n_stream: int = 1, swa_size: int = 0, swa_n_kv: int = 0,
                rs_zero: int = 0, n_seqs: int = 1) -> ModelGraph:
    """The graph llama.cpp builds for `model` (any registered architecture) and one ubatch.
    `shared`: (name, each layer's representative layer) for the per-layer duplicated tensors
    (Placement.shared_copies); without it every layer gets its own copy. `n_stream`: KV
    streams (-np N without -kvu: one per sequence, kv_size cells each). `swa_size`,
    `swa_n_kv`: the SWA cache's cells per stream and those attended over (models with SWA
    layers; options.swa_kv_size; default the full cache's). `n_seqs`: the ubatch's sequences
    (a reserve's n_seq_max), equal splits of n_tokens; a hybrid model's recurrent state then
    has that many rows, all of them seen by the graph (the whole memory, as in a reserve)."""
    from ggmlrun.models.arch import get_arch

    where = str(model.path) if model.path else None
    arch = get_arch(model.arch, where)
    table = check_tensors(arch, model.hparams, model.tensors, where)
    d = Decoder(model, arch, n_tokens, n_outputs, n_kv, kv_size, flash_attn, kv_type, table,
                n_stream, swa_size=swa_size, swa_n_kv=swa_n_kv)
    d.shared = dict(shared)
    d.rs_zero = rs_zero
    d.n_seqs = d.n_rs = n_seqs
    return d.finish(arch.build(d), rows_after_norm=arch.rows_after_norm,
                    rows_before_norm=arch.rows_before_norm)


def rotation_inputs(b: GraphBuilder, hp, kv_type: str) -> dict[str, Tensor]:
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


def rope_params(hp) -> dict:
    """ggml_rope_ext's parameters as llama_context's constructor derives them from the
    hyperparameters (llama.cpp's defaults for every context option): type none never scales;
    YaRN gets ext_factor 1 and an attention factor of get_mscale(factor), cancelled by
    1/(1 + 0.1 ln factor) as ggml-cpu applies it again; rope.scaling.attn_factor on top."""
    f32 = lambda x: float(np.float32(x))       # noqa: E731   (llama.cpp computes in float)
    freq_scale = 1.0 if hp.rope_scaling == "none" else hp.rope_freq_scale
    ext_factor = 1.0 if hp.rope_scaling == "yarn" else 0.0
    attn_factor = 1.0
    if ext_factor:
        factor = f32(1.0 / np.float32(freq_scale))

        def mscale(scale: float, m: float) -> float:
            return 1.0 if scale <= 1.0 else f32(0.1 * m * np.log(np.float32(scale)) + 1.0)

        if hp.rope_yarn_log_mul:
            # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: deepseek2's mscale is mscale_all_dims too
            m = hp.rope_yarn_log_mul if getattr(hp, "yarn_mscale_all_dims", False) else 1.0
            attn_factor = f32(mscale(factor, m) / mscale(factor, hp.rope_yarn_log_mul))
        else:
            attn_factor = mscale(factor, 1.0)
        attn_factor = f32(attn_factor * f32(1.0 / (1.0 + 0.1 * np.log(np.float32(factor)))))
    attn_factor = f32(attn_factor * hp.rope_attn_factor)
    return dict(n_ctx_orig=hp.n_ctx_orig_yarn, freq_base=hp.rope_freq_base,
                freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor,
                beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow)


def rope_freqs_layers(hp) -> tuple[int, ...]:
    """The layers that read rope_freqs: the first creates it, the others hold a duplicate
    (every layer, or gemma4's full-attention ones: hp.rope_freqs_layers)."""
    layers = getattr(hp, "rope_freqs_layers", None)
    return tuple(layers) if layers is not None else tuple(range(hp.n_layer))
