"""The pieces of llama.cpp's llm_graph_context that a decoder-only graph is made of.

`GraphBuilder` mirrors ggml's graph construction: tensors are created as ggml's calls create
them (with ggml's derived names: "x (view)", "x (reshaped)", ...), `cb` renames them as
llama.cpp's callback does ("Qcur-0", "result_output"), and `expand` adds them to the graph with
ggml_visit_parents' depth-first walk, so the node order, the leaf order and the "node_%d" names
of unnamed nodes are ggml's own. Nodes are built directly from the shapes ggml computes (no
per-node shape inference: an 80-layer graph has thousands of nodes and `fit` builds several);
tests re-infer every node through the op registry to keep the two in step.

`LayerContext` holds what build_norm / build_attn need; models/decoder.py builds the rest of
llm_graph_context on it, so an architecture is a short file of calls, as in llama.cpp's
src/models/.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ggmlrun.core.ir.graph import Graph, Tensor, contiguous_strides
from ggmlrun.core.ir.types import TYPES


def ggml_set_rows_order(src: list[Tensor]) -> list[Tensor]:
    """ggml_set_rows' src[] is (rows, indices, destination), "due to legacy reasons"."""
    return [src[1], src[2], src[0]]


def row_size(dtype: str, n: int) -> int:
    return TYPES[dtype].row_bytes(n)


@functools.cache
def _op_registry() -> dict:
    """The op registry (every op module), imported when the first node is built: the
    architecture modules import this one, and reading a model's header must not pay for it."""
    from ggmlrun.core.ir.ops import OPS

    return OPS


def _params(op: str, params: dict) -> dict:
    """Params as the op registry declares them (defaults filled in); unknown ops keep theirs."""
    spec = _op_registry().get(op)
    if spec is None:
        return params
    out = {k: v for k, v in spec.params.items()}
    out.update((k, v) for k, v in params.items() if k in spec.params)
    return out


@dataclass
class GraphBuilder:
    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    pins: list[tuple[Tensor, str, int]] = field(default_factory=list)   # (node, cb name, il)
    kqv_outs: list[Tensor] = field(default_factory=list)   # attention outputs (no flash attn)
    _visited: set = field(default_factory=set)

    # --- creating tensors --------------------------------------------------------------------
    @staticmethod
    def leaf(name: str, shape, dtype: str = "f32", role: str = "input") -> Tensor:
        return Tensor(name=name, shape=tuple(shape), dtype=dtype, role=role)

    @staticmethod
    def op(kind: str, srcs: list[Tensor], dims, out_dtype: str = "f32", out_name: str = "",
           **params) -> Tensor:
        """A compute node: op `kind` with NumPy-order output dims and the op's params."""
        return Tensor(name=out_name, shape=tuple(dims), dtype=out_dtype, op=kind, src=list(srcs),
                      params=_params(kind, params))

    @staticmethod
    def _view_of(op: str, a: Tensor, layout: tuple, byte_offset: int, suffix: str,
                 **params) -> Tensor:
        """A view op on a: `layout` is (NumPy shape, byte strides)."""
        dims, steps = layout
        t = Tensor(name=f"{a.name} ({suffix})", shape=tuple(dims), dtype=a.dtype,
                   strides=tuple(steps), op=op, src=[a], params=_params(op, params))
        t.view_src = a.view_src or a
        t.view_offset = a.view_offset + byte_offset
        return t

    def view(self, a: Tensor, shape, strides, offset: int = 0) -> Tensor:
        """ggml_view_Nd: NumPy-order shape and byte strides, byte offset into a."""
        return self._view_of("view", a, (shape, strides), offset, "view",
                             shape=list(shape), offset=offset, strides=list(strides))

    def reshape(self, a: Tensor, shape) -> Tensor:
        g = TYPES[a.dtype]
        steps = contiguous_strides(tuple(shape), g.type_size, g.block_size)
        return self._view_of("reshape", a, (shape, steps), 0, "reshaped", shape=list(shape))

    def permute(self, a: Tensor, axes) -> Tensor:
        """`axes` in NumPy's transpose form (ggml_permute(0, 2, 1, 3) is [0, 2, 1, 3])."""
        layout = ([a.shape[i] for i in axes], [a.strides[i] for i in axes])
        return self._view_of("permute", a, layout, 0, "permuted", axes=list(axes))

    def transpose(self, a: Tensor) -> Tensor:
        """ggml_transpose: the last two dims swapped, named "a (transposed)"."""
        layout = ((*a.shape[:-2], a.shape[-1], a.shape[-2]),
                  (*a.strides[:-2], a.strides[-1], a.strides[-2]))
        return self._view_of("transpose", a, layout, 0, "transposed")

    def scale_inplace(self, a: Tensor, s: float) -> Tensor:
        """ggml_scale_inplace: a SCALE node that is a view of a ("a (view)"), writing a's bytes."""
        t = Tensor(name=f"{a.name} (view)", shape=a.shape, dtype=a.dtype, strides=a.strides,
                   op="scale", src=[a], params=_params("scale", {"s": s}))
        t.view_src = a.view_src or a
        t.view_offset = a.view_offset
        return t

    def cpy(self, a: Tensor, dst: Tensor) -> Tensor:
        """ggml_cpy(a, dst): a view of dst named "dst (copy of a)" (a's name when it is made:
        empty for a node not yet named)."""
        name = f"{dst.name} (copy of {a.name})" if dst.name else f"{a.name} (copy)"
        t = Tensor(name=name, shape=dst.shape, dtype=dst.dtype, strides=dst.strides, op="cpy",
                   src=[a, dst], params=_params("cpy", {}))
        t.view_src = dst.view_src or dst
        t.view_offset = dst.view_offset
        return t

    def cont(self, a: Tensor, shape=None) -> Tensor:
        params = {"shape": list(shape)} if shape is not None else {}
        return self.op("cont", [a], shape or a.shape, a.dtype, f"{a.name} (cont)", **params)

    def set_rows(self, dst: Tensor, src: Tensor, idx: Tensor) -> Tensor:
        """ggml_set_rows(dst, src, idx): the result is a view of dst named "dst (view)".
        Sources are in ggmlrun's order (dst, src, idx); ggml lists them (src, idx, dst), and
        `expand` walks them in ggml's order so the graph's order is llama.cpp's."""
        t = Tensor(name=f"{dst.name} (view)", shape=dst.shape, dtype=dst.dtype,
                   strides=dst.strides, op="set_rows", src=[dst, src, idx],
                   params=_params("set_rows", {}))
        t.view_src = dst.view_src or dst
        t.view_offset = dst.view_offset
        return t

    # --- naming (llama.cpp's graph callback) -----------------------------------------------
    def cb(self, t: Tensor, name: str, il: int) -> Tensor:
        t.name = f"{name}-{il}" if il >= 0 else name
        if name == "norm" and il >= 0:
            self.pins.append((t, name, il))
        return t

    # --- the graph (ggml_build_forward_expand) -----------------------------------------------
    def expand(self, tensor: Tensor) -> None:
        """ggml_visit_parents: sources left to right, depth first; a node after its sources."""
        visited, nodes, leafs = self._visited, self.nodes, self.leafs
        if tensor in visited:
            return
        stack = [(tensor, 0)]
        while stack:
            t, i = stack.pop()
            if i == 0:
                if t in visited:
                    continue
                visited.add(t)
            srcs = t.src if t.op != "set_rows" else ggml_set_rows_order(t.src)
            if i < len(srcs):
                stack.append((t, i + 1))
                src = srcs[i]
                if src not in visited:
                    stack.append((src, 0))
                continue
            if t.op is None:
                if not t.name:                 # ggml_visit_parents names an unnamed leaf
                    t.name = f"leaf_{len(leafs)}"
                leafs.append(t)
            else:
                if not t.name:
                    t.name = f"node_{len(nodes)}"
                nodes.append(t)

    def graph(self, name: str, outputs: list[Tensor], extra_leafs: list[Tensor] = ()) -> Graph:
        for t in outputs:
            t.is_output = True
        leafs = list(self.leafs) + [t for t in extra_leafs if t not in self._visited]
        return Graph(name=name, leafs=leafs, nodes=list(self.nodes), outputs=list(outputs),
                     ggml_leaf_order=True)


@dataclass
class LayerContext:
    """What llm_graph_context carries for one ubatch: sizes and the builder."""

    b: GraphBuilder
    n_tokens: int
    n_outputs: int
    n_kv: int
    kv_size: int
    flash_attn: bool
    norm_rms_eps: float

    def build_norm(self, cur: Tensor, weight: Tensor, il: int) -> Tensor:
        """LLM_NORM_RMS with a weight: rms_norm named "norm" (pinned by llama.cpp), then the mul."""
        cur = self.b.cb(self.b.op("rms_norm", [cur], cur.shape, eps=self.norm_rms_eps), "norm", il)
        return self.b.op("mul", [cur, weight], cur.shape)

    def mul_mat(self, w: Tensor, cur: Tensor) -> Tensor:
        """ggml_mul_mat(w, cur): w [.., M, K], cur [.., N, K] -> [.., N, M] in f32."""
        batch = cur.shape[:-2] if len(cur.shape) >= len(w.shape) else w.shape[:-2]
        return self.b.op("mul_mat", [w, cur], (*batch, cur.shape[-2], w.shape[-2]))


@dataclass
class KVCache:
    """llama_kv_cache: cache_k_l{il} / cache_v_l{il}, each [n_stream, kv_size, n_embd_gqa]
    (ggml ne [n_embd_gqa, kv_size, n_stream]); V is read transposed without flash attention.
    One stream unless the context keeps one per sequence (-np N without -kvu): each stream
    then has kv_size cells, and the graph attends per stream.

    A hybrid model's memory (llama_memory_hybrid) adds llama_memory_recurrent's state over its
    recurrent layers: cache_r_l{il} [rows, n_embd_r] and cache_s_l{il} [rows, n_embd_s], f32,
    rows = max(1, n_seq_max) * (1 + n_rs_seq), whatever the context."""

    kv_type: str
    kv_size: int
    v_trans: bool
    k: dict[int, Tensor] = field(default_factory=dict)
    v: dict[int, Tensor] = field(default_factory=dict)
    n_stream: int = 1
    r: dict[int, Tensor] = field(default_factory=dict)
    s: dict[int, Tensor] = field(default_factory=dict)

    def add_recurrent(self, il: int, n_embd_r: int, n_embd_s: int, rows: int = 1) -> None:
        self.r[il] = GraphBuilder.leaf(f"cache_r_l{il}", (rows, n_embd_r), "f32", role="weight")
        self.s[il] = GraphBuilder.leaf(f"cache_s_l{il}", (rows, n_embd_s), "f32", role="weight")

    def add_layer(self, il: int, n_embd_k_gqa: int, n_embd_v_gqa: int) -> None:
        ns = self.n_stream
        self.k[il] = GraphBuilder.leaf(f"cache_k_l{il}", (ns, self.kv_size, n_embd_k_gqa),
                                       self.kv_type, role="weight")
        self.v[il] = GraphBuilder.leaf(f"cache_v_l{il}", (ns, self.kv_size, n_embd_v_gqa),
                                       self.kv_type, role="weight")

    def add_k_layer(self, il: int, n_embd_k_gqa: int) -> None:
        """An MLA layer (llama_hparams::is_mla): K rows only; V is a view of them."""
        shape = (self.n_stream, self.kv_size, n_embd_k_gqa)
        self.k[il] = GraphBuilder.leaf(f"cache_k_l{il}", shape, self.kv_type, role="weight")

    def _all_streams(self, b: GraphBuilder, cache: Tensor) -> Tensor:
        """Several streams: the cache as one 2-D buffer (the row indices are global)."""
        if self.n_stream == 1:
            return cache
        return b.reshape(cache, (self.kv_size * self.n_stream, cache.shape[-1]))

    def cpy_k(self, b: GraphBuilder, k_cur: Tensor, k_idxs: Tensor, il: int) -> Tensor:
        n_tokens, n_head, hd = k_cur.shape[-3:]
        rows = b.view(k_cur, (n_tokens, n_head * hd), (k_cur.strides[-3], k_cur.strides[-1]))
        return b.set_rows(self._all_streams(b, self.k[il]), rows, k_idxs)

    def cpy_v(self, b: GraphBuilder, v_cur: Tensor, v_idxs: Tensor, il: int) -> Tensor:
        n_tokens, n_head, hd = v_cur.shape[-3:]
        gqa = n_head * hd
        if not self.v_trans:
            rows = b.view(v_cur, (n_tokens, gqa), (v_cur.strides[-3], v_cur.strides[-1]))
            return b.set_rows(self._all_streams(b, self.v[il]), rows, v_idxs)
        if v_cur.strides[-3] == row_size(v_cur.dtype, gqa):     # dims 0, 1 and 2 merge
            v_cur = b.reshape(v_cur, (n_tokens, gqa))
        else:                 # a strided view (a fused QKV's V): a contiguous copy first
            v_cur = b.cont(v_cur, (n_tokens, gqa))
        cache = self.v[il]
        width = cache.shape[-1]
        if gqa < width:       # [TAG_V_CACHE_VARIABLE]: rows padded to the widest layer's
            v_cur = b.op("pad", [v_cur], (n_tokens, width), pad=[0, width - gqa])
        v_view = b.reshape(cache, (cache.n_elements, 1))
        v_cur = b.reshape(v_cur, (v_cur.n_elements, 1))
        return b.set_rows(v_view, v_cur, v_idxs)

    def get_k(self, b: GraphBuilder, il: int, n_kv: int, n_head_kv: int, hd: int) -> Tensor:
        k = self.k[il]
        gqa = k.shape[-1]
        rs = lambda n: row_size(k.dtype, n)  # noqa: E731
        return b.view(k, (self.n_stream, n_kv, n_head_kv, hd),
                      (rs(gqa * self.kv_size), rs(gqa), rs(hd), TYPES[k.dtype].type_size))

    def get_v(self, b: GraphBuilder, il: int, n_kv: int, n_head_kv: int, hd: int) -> Tensor:
        v = self.v[il]
        gqa = v.shape[-1]
        rs = lambda n: row_size(v.dtype, n)  # noqa: E731
        item = TYPES[v.dtype].type_size
        ns = self.n_stream
        if not self.v_trans:
            return b.view(v, (ns, n_kv, n_head_kv, hd), (rs(gqa * self.kv_size), rs(gqa), rs(hd), item))
        return b.view(v, (ns, hd, n_head_kv, n_kv),
                      (rs(self.kv_size * gqa), rs(self.kv_size), rs(self.kv_size * hd), item))


def build_attn_kv(ctx: LayerContext, cache: KVCache, inputs: dict[str, Tensor], wo: Tensor | None,
                  q_cur: Tensor, k_cur: Tensor | None, v_cur: Tensor | None, kq_scale: float,
                  il: int, n_kv: int | None = None, iswa: bool = False,
                  kv_layer: int | None = None, sinks: Tensor | None = None) -> Tensor:
    """llm_graph_context::build_attn for llm_graph_input_attn_kv, with build_attn_mha inside:
    store K and V through set_rows, then attend over the whole cache view (`n_kv` cells,
    default the context's). `iswa`: the build_attn of llm_graph_input_attn_kv_iswa, which
    expands Q, K, V in that order (the plain one expands Q, V, K). Without K and V (None): no
    store, and the attention reads layer `kv_layer`'s cache (gemma4's KV-shared layers). `wo`
    None: no output projection (a gated attention applies it after its gate). `sinks`: a
    logit per head (gpt-oss's attn_sinks), the extra source ggml_soft_max_add_sinks /
    ggml_flash_attn_ext_add_sinks give the softmax and flash attention."""
    b = ctx.b
    k_rot, v_rot = inputs.get("k_rot"), inputs.get("v_rot")
    if k_rot is not None:
        q_cur = mul_mat_hadamard(ctx, q_cur, k_rot)
        if k_cur is not None:
            k_cur = mul_mat_hadamard(ctx, k_cur, k_rot)
    if v_rot is not None and v_cur is not None:
        v_cur = mul_mat_hadamard(ctx, v_cur, v_rot)
    b.expand(q_cur)
    for t in ((k_cur, v_cur) if iswa else (v_cur, k_cur)):
        if t is not None:
            b.expand(t)
    T, n_head, hd = q_cur.shape[-3:]
    n_kv = ctx.n_kv if n_kv is None else n_kv
    if k_cur is None:       # a layer reading an earlier layer's cache (llama_kv_cache reuse)
        src = kv_layer if kv_layer is not None else il
        n_head_kv = cache.k[src].shape[-1] // hd
        k = cache.get_k(b, src, n_kv, n_head_kv, hd)
        v = cache.get_v(b, src, n_kv, n_head_kv, hd)
    else:
        b.expand(cache.cpy_k(b, k_cur, inputs["k_idxs"], il))
        b.expand(cache.cpy_v(b, v_cur, inputs["v_idxs"], il))
        n_head_kv = k_cur.shape[-2]
        k = cache.get_k(b, il, n_kv, n_head_kv, hd)
        v = cache.get_v(b, il, n_kv, n_head_kv, v_cur.shape[-1])
    cur = build_attn_mha(ctx, q_cur, k, v, inputs["kq_mask"], kq_scale, il, cache.n_stream,
                         v_trans=cache.v_trans, sinks=sinks)
    b.cb(cur, "kqv_out", il)
    if v_rot is not None:
        cur = mul_mat_hadamard(ctx, cur, v_rot)
    return cur if wo is None else ctx.mul_mat(wo, cur)


def build_attn_mha(ctx: LayerContext, q_cur: Tensor, k: Tensor, v: Tensor, mask: Tensor,
                   kq_scale: float, il: int, ns: int, v_trans: bool,
                   v_mla: Tensor | None = None, sinks: Tensor | None = None) -> Tensor:
    """llm_graph_context::build_attn_mha over cache views k and v ([ns, n_kv, heads, hd]; v
    transposed when `v_trans`): Q split into the `ns` streams, then flash attention or
    KQ, soft_max, KQV. A V that is not transposed (MLA's view of K) is copied transposed
    first (v_cont) without flash attention; `v_mla` (MLA's attn_v_b, [n_head, v_head,
    kv_lora]) decompresses each head's output (kqv_mla, or fattn_mla after flash attention);
    `sinks` (gpt-oss) is the extra source of flash attention and soft_max."""
    b = ctx.b
    T, n_head, hd = q_cur.shape[-3:]
    q = b.view(q_cur, (ns, T // ns, n_head, hd),
               (q_cur.strides[-3] * (T // ns), *q_cur.strides[-3:]))
    q = b.permute(q, (0, 2, 1, 3))
    k = b.permute(k, (0, 2, 1, 3))
    v = b.permute(v, (0, 2, 1, 3))
    if ctx.flash_attn:
        # an f32 cache is cast to f16 first (ggml_cast: a CPY node named "x (copy)")
        k, v = (b.op("cast", [t], t.shape, "f16", f"{t.name} (copy)", dtype="f16")
                if t.dtype == "f32" else t for t in (k, v))
        dv = v.shape[-1]
        srcs = [q, k, v, mask] + ([sinks] if sinks is not None else [])
        cur = b.op("flash_attn_ext", srcs, (ns, T // ns, n_head, dv), scale=kq_scale,
                   max_bias=0.0, logit_softcap=0.0, prec="f32")
        if v_mla is not None:
            cur = b.permute(cur, (0, 2, 1, 3))
            cur = b.cb(ctx.mul_mat(v_mla, cur), "fattn_mla", il)
            cur = b.cont(b.permute(cur, (0, 2, 1, 3)))
        cur = b.reshape(cur, (T, n_head * cur.shape[-1]))
    else:
        kq = b.cb(ctx.mul_mat(k, q), "kq", il)
        srcs = [kq, mask] + ([sinks] if sinks is not None else [])
        kq = b.cb(b.op("soft_max", srcs, kq.shape, scale=kq_scale, max_bias=0.0),
                  "kq_soft_max", il)
        if not v_trans:
            v = b.cb(b.cont(b.transpose(v)), "v_cont", il)
        kqv = b.cb(ctx.mul_mat(v, kq), "kqv", il)
        if v_mla is not None:
            kqv = b.cb(ctx.mul_mat(v_mla, kqv), "kqv_mla", il)
        cur = b.permute(kqv, (0, 2, 1, 3))
        cur = b.cont(cur, (T, n_head * kqv.shape[-1]))
        b.kqv_outs.append(cur)      # pinned to the CPU under --no-kv-offload
    b.expand(cur)
    return cur


def build_attn_k(ctx: LayerContext, cache: KVCache, inputs: dict[str, Tensor], wo: Tensor,
                 q_cur: Tensor, k_cur: Tensor, v_cur: Tensor, v_mla: Tensor | None,
                 kq_scale: float, il: int) -> Tensor:
    """llm_graph_context::build_attn for llm_graph_input_attn_k (MLA's K-only cache): Q, V,
    K expanded in that order, only K stored, V read as a view of the first v_cur-width values
    of each cached K row, then build_attn_mha with `v_mla` and wo."""
    b = ctx.b
    for t in (q_cur, v_cur, k_cur):
        b.expand(t)
    b.expand(cache.cpy_k(b, k_cur, inputs["k_idxs"], il))
    hd, dv = k_cur.shape[-1], v_cur.shape[-1]
    k = cache.get_k(b, il, ctx.n_kv, k_cur.shape[-2], hd)
    v = b.view(k, (*k.shape[:-1], dv), k.strides)
    cur = build_attn_mha(ctx, q_cur, k, v, inputs["kq_mask"], kq_scale, il, cache.n_stream,
                         v_trans=False, v_mla=v_mla)
    b.cb(cur, "kqv_out", il)
    return ctx.mul_mat(wo, cur)


def rs_inputs(b: GraphBuilder, n_rs: int, n_seqs: int) -> dict[str, Tensor]:
    """build_rs_inp_impl: rs_s_copy i32 [n_rs] and its two views, the first n_seqs ids (the
    states the ubatch reads) and the rest (the states only copied along)."""
    s_copy = b.leaf("rs_s_copy", (n_rs,), "i32")
    return {"s_copy": s_copy,
            "s_copy_main": b.view(s_copy, (n_seqs,), (4,), 0),
            "s_copy_extra": b.view(s_copy, (n_rs - n_seqs,), (4,), n_seqs * 4)}


def build_rs(b: GraphBuilder, inputs: dict[str, Tensor], s: Tensor, state_size: int,
             n_seqs: int, n_rs: int, rs_head: int = 0, rs_zero: int = 0) -> Tensor:
    """llm_graph_context::build_rs: clear the one state rs_zero (an in-place scale by 0 of its
    row; a zero-sized view when rs_zero < 0), read the ubatch's states with get_rows, and copy
    the other n_rs - n_seqs along (zero-sized when n_rs == n_seqs, as in every reserve)."""
    states = b.reshape(s, (s.shape[0], state_size))
    row = states.strides[0]
    on = rs_zero >= 0
    zero = b.view(states, (state_size * on,), (4,), rs_zero * row * on)
    b.expand(b.scale_inplace(zero, 0.0))
    out = b.op("get_rows", [states, inputs["s_copy_main"]], (n_seqs, state_size))
    b.expand(out)
    extra = b.op("get_rows", [states, inputs["s_copy_extra"]], (n_rs - n_seqs, state_size))
    dst = b.view(s, (n_rs - n_seqs, state_size), (s.strides[0], 4), (rs_head + n_seqs) * row)
    b.expand(b.cpy(extra, dst))
    return out


def mul_mat_hadamard(ctx: LayerContext, cur: Tensor, rot: Tensor) -> Tensor:
    """llama_mul_mat_hadamard: rows of `n` rotated by the Walsh-Hadamard matrix (quantized KV
    caches), then back to cur's shape (ggml's reshape_4d to cur's ne: the same shape)."""
    b = ctx.b
    n = rot.shape[-1]
    flat = (cur.n_elements // n, n)
    res = b.reshape(cur, flat) if cur.is_contiguous else b.cont(cur, flat)
    res = ctx.mul_mat(rot, res)
    return b.reshape(res, cur.shape)
