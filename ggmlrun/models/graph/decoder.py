"""llama.cpp's llm_graph_context for one ubatch of a decoder-only model: the inputs, the shared
layer pieces (build_norm, build_qkv, rope, build_attn, build_ffn). An architecture module
(models/arch/llama.py, models/arch/*.py) is then only its layer loop, as llama.cpp's
src/models/<arch>.cpp are. Three pieces live beside it: the attention and the KV cache's views
(models/graph/attention.py), the mixture-of-experts FFN (models/graph/moe_ffn.py, called as `moe_ffn`) and
the output head with the ModelGraph it returns (models/graph/output.py).

One ubatch of `n_tokens` tokens, `n_outputs` output rows and `n_kv` cache cells attended over.
Every call is one of llama.cpp's (src/llama-graph.cpp), in its order, so the nodes, their order
and their names are llama.cpp's. Weights are looked up by gguf's tensor names
(models/gguf/names.py `tn`), never by retyped strings.
"""

from __future__ import annotations

from typing import Callable

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.graph.attention import KVCache, attn_inputs, build_attn_kv
from ggmlrun.models.graph.builder import GraphBuilder, LayerContext
from ggmlrun.models.graph.moe_ffn import build_moe_ffn
from ggmlrun.models.memory.caches import Memory
from ggmlrun.models.hparams.rope import rope_freqs_layers, rope_params


class Decoder:
    """The graph being built for one model and ubatch shape (llm_graph_context)."""

    def __init__(self, model, arch, memory: Memory, n_tokens: int, n_outputs: int, n_kv: int,
                 *, table: dict | None = None, swa_n_kv: int = 0, shared: tuple = (),
                 rs_zero: int = 0, n_seqs: int = 1):
        """`memory`: the caches, sized before the graph (llama_model::create_memory); the
        graph takes views of them, and their layout (cells, streams, type, V transposed without
        flash attention) is the graph's."""
        hp = self.hp = model.hparams
        kv = memory.kv
        kv_size, n_stream, flash_attn = kv.cells, kv.n_stream, memory.graph_fa
        self.model, self.arch = model, arch
        self.table = table if table is not None else arch.tensors(hp)   # what llama.cpp loads
        b = self.b = GraphBuilder()
        self.weights = {name: GraphBuilder.leaf(name, info.shape, info.dtype, role="weight")
                        for name, info in model.tensors.items()}
        self.n_tokens, self.n_outputs = n_tokens, n_outputs
        self.ctx = LayerContext(b=b, n_tokens=n_tokens, n_outputs=n_outputs, n_kv=n_kv,
                                kv_size=kv_size, flash_attn=flash_attn,
                                norm_rms_eps=hp.norm_rms_eps)
        self.memory = memory
        self.cache = KVCache(memory.kv, memory.recurrent)
        out_name = self.name(T.OUTPUT)
        self.output_w = self.weights.get(out_name)
        if self.output_w is None:     # TENSOR_DUPLICATED: the same bytes, possibly elsewhere
            src = self.weight(T.TOKEN_EMBD)
            self.output_w = GraphBuilder.leaf(src.name, src.shape, src.dtype, role="weight")
        self.rope_freqs: dict[int, Tensor] = {}
        self.shared: dict[str, tuple[int, ...]] = dict(shared)
        self.extra_inputs: dict[Tensor, Callable] = {}
        if hp.rope_scaling == "longrope" and not arch.longrope:
            raise InputError(f"rope scaling 'longrope' is not supported for {arch.name} yet "
                             f"(its rope_factors_long/short tensors)")
        self.rope_freqs_name = self._rope_factors_name(kv_size)
        # build_inp_embd: tokens and the (unused, still allocated) embeddings input, n_embd_inp
        # wide; a deepstack model's token rows are padded to that width and the layers read
        # an n_embd view of them (deepstack reads the further slices)
        tokens = b.leaf("inp_tokens", (n_tokens,), "i32")
        width = hp.n_embd_inp
        inp_embd = b.leaf("inp_embd", (n_tokens, width), "f32")
        rows = b.op("get_rows", [self.weight(T.TOKEN_EMBD), tokens], (n_tokens, hp.n_embd))
        if width != hp.n_embd:
            rows = b.op("pad", [rows], (n_tokens, width), pad=[0, width - hp.n_embd])
        b.expand(rows)
        b.expand(inp_embd)           # ggml_build_forward_select adds both candidates
        self.inpL = rows if width == hp.n_embd else b.view(
            rows, (n_tokens, hp.n_embd), (rows.strides[-2], rows.strides[-1]))
        self.t_inp_embd = self.inpL      # llm_graph_result's t_inp_embd
        if hp.f_embedding_scale:         # granite: the embeddings scaled (a cont first if
            if width != hp.n_embd:       # they are a view)
                self.inpL = b.cont(self.inpL)
            self.inpL = b.op("scale", [self.inpL], self.inpL.shape, s=hp.f_embedding_scale)
        b.expand(self.inpL)
        b.cb(self.inpL, "embd", -1)
        self.inputs = {
            "tokens": tokens, "embd": inp_embd,
            "pos": b.leaf("inp_pos", (n_tokens * arch.n_pos_per_embd,), "i32"),
            "out_ids": b.leaf("out_ids", (n_outputs,), "i32")}
        self.inputs.update(attn_inputs(b, hp, n_tokens, n_kv, n_stream, flash_attn, kv))
        self.rope = dict(n_dims=hp.n_rot, mode=arch.rope_type, **rope_params(hp))
        if arch.n_pos_per_embd == 4:       # ggml_rope_multi: the sections pick each pair's position
            self.rope["sections"] = list(hp.rope_sections)
        # a hybrid memory's recurrent half (models/arch/delta_net.py): the states the graph
        # sees (n_rs: the whole memory in a reserve) and the one it clears first (rs_z; -1:
        # none, as after a sequence's first ubatch)
        self.n_rs = self.n_seqs = n_seqs
        self.rs_zero = rs_zero
        # llama_kv_cache_iswa (build_attn_inp_kv_iswa): a second cache for the sliding-window
        # layers, of swa_size cells (default: the full cache's), with its own idxs and mask
        self.swa_cache, self.swa_inputs, self.swa_n_kv = None, {}, 0
        if self.memory.swa is not None:
            self.swa_n_kv = swa_n_kv or n_kv
            self.swa_cache = KVCache(self.memory.swa)
            self.swa_inputs = attn_inputs(b, hp, n_tokens, self.swa_n_kv, n_stream, flash_attn,
                                          self.memory.swa)

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

    def layer_qkv(self, il: int, inpL: Tensor):
        """How llama.cpp's llama-like builders open a layer (llama, qwen2, qwen3, glm4moe):
        the layer's KV cache rows, attn_norm over the layer's input, then build_qkv over the
        model's heads."""
        self.add_kv_layer(il)
        cur = self.b.cb(self.norm(inpL, self.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        return self.qkv(il, cur, self.hp.n_embd_head_k, self.hp.n_head, self.hp.n_head_kv)

    def qkv(self, il: int, cur: Tensor, n_embd_head: int, n_head: int, n_head_kv: int,
            reshape: bool = True):
        """build_qkv: a fused attn_qkv as three strided views of one product, or separate Q, K,
        V products, each plus its optional bias; named Qcur/Kcur/Vcur as llama.cpp names them.
        Without `reshape`: [n_tokens, width] each, unnamed (contiguous copies of a fused
        product's views), for a builder that norms the whole width first (minimax-m2)."""
        b, cb, n_tokens = self.b, self.b.cb, self.n_tokens
        wqkv = self.optional(T.ATTN_QKV, il)
        if not reshape:
            return self._qkv_flat(il, cur, wqkv, n_embd_head, n_head, n_head_kv)
        if wqkv is not None:
            qkv = cb(self.ctx.mul_mat(wqkv, cur), "wqkv", il)
            bias = self.optional(T.ATTN_QKV, il, "bias")
            if bias is not None:
                qkv = cb(self.add_bias(qkv, bias), "wqkv_b", il)
            n_q, n_k = n_embd_head * n_head, n_embd_head * n_head_kv
            item = TYPES[qkv.dtype].type_size
            views = []
            for heads, offset in ((n_head, 0), (n_head_kv, n_q), (n_head_kv, n_q + n_k)):
                views.append(b.view(qkv, (n_tokens, heads, n_embd_head),
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
            q, k, v = (b.reshape(x, (n_tokens, heads, n_embd_head))
                       for x, heads in zip(out, (n_head, n_head_kv, n_head_kv)))
        return cb(q, "Qcur", il), cb(k, "Kcur", il), cb(v, "Vcur", il)

    def _qkv_flat(self, il: int, cur: Tensor, wqkv: Tensor | None, n_embd_head: int,
                  n_head: int, n_head_kv: int):
        """build_qkv with reshape false (no clamp, no names)."""
        b = self.b
        widths = (n_embd_head * n_head, n_embd_head * n_head_kv, n_embd_head * n_head_kv)
        if wqkv is None:
            return tuple(self.add_bias(self.ctx.mul_mat(self.weight(t, il), cur),
                                       self.optional(t, il, "bias"))
                         for t in (T.ATTN_Q, T.ATTN_K, T.ATTN_V))
        qkv = b.cb(self.ctx.mul_mat(wqkv, cur), "wqkv", il)
        bias = self.optional(T.ATTN_QKV, il, "bias")
        if bias is not None:
            qkv = b.cb(self.add_bias(qkv, bias), "wqkv_b", il)
        item, offset, out = TYPES[qkv.dtype].type_size, 0, []
        for width in widths:
            out.append(b.view(qkv, (self.n_tokens, width), (qkv.strides[-2], item),
                              offset * item))
            offset += width
        return tuple(b.cont(x) for x in out)

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
        self.kv_cache(il).add_layer(il)

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

    def moe_ffn(self, il: int, cur: Tensor, **options) -> Tensor:
        """build_moe_ffn (models/graph/moe_ffn.py, which lists the options)."""
        return build_moe_ffn(self, il, cur, **options)

    @staticmethod
    def n_tokens_of(cur: Tensor) -> int:
        return cur.shape[-2]

    def ffn_block(self, il: int, cur: Tensor, residual: Tensor, ffn=None,
                  norm=(T.FFN_NORM, "ffn_norm")) -> Tensor:
        """The post-attention tail llama, qwen2, qwen3(moe) and mistral3 share: the last
        layer's output rows, the residual (`ffn_inp`), `ffn_norm` (`norm`: the norm's tensor
        and name where they differ, seed_oss's attn_post_norm), the FFN (`ffn(il, cur)`,
        default the dense SwiGLU) and the second residual, named `l_out`."""
        b = self.b
        cur, residual = self.last_rows(il, cur, residual)
        ffn_inp = b.cb(self.add(cur, residual), "ffn_inp", il)
        cur = b.cb(self.norm(ffn_inp, self.weight(norm[0], il), il), norm[1], il)
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

    def deepstack(self, il: int, cur: Tensor) -> Tensor:
        """qwen3vl(moe): after each of the first n_deepstack_layers layers, the (il + 1)-th
        n_embd slice of the input embeddings added to the layer's output (`deepstack_out`);
        for token input those slices are the pad's zeros, still added."""
        if il >= self.hp.n_deepstack_layers:
            return cur
        src, n = self.t_inp_embd, self.hp.n_embd
        item = TYPES[src.dtype].type_size
        ds = self.b.view(src, (self.n_tokens, n), (src.strides[-2], item), (il + 1) * n * item)
        return self.b.cb(self.add(cur, ds), "deepstack_out", il)

    def add(self, a: Tensor, c: Tensor) -> Tensor:
        return self.b.op("add", [a, c], a.shape)
