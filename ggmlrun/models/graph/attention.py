"""llama.cpp's build_attn family and the llama_kv_cache views it reads and writes.

`KVCache` is llama_kv_cache's tensors (cache_k_l{il} / cache_v_l{il}, a hybrid model's
recurrent cache_r / cache_s) and its views: cpy_k / cpy_v store the ubatch's K and V through
set_rows, get_k / get_v view the cells attended over; `attn_inputs` are the graph inputs
they need (build_attn_inp_kv). `build_attn_kv` is build_attn for
llm_graph_input_attn_kv (and the iSWA one), `build_attn_k` the K-only (MLA) cache's,
`build_attn_mha` the attention itself, `mul_mat_hadamard` the quantized cache's rotation.
Kept apart from models/graph/builder.py (the builder every graph uses) as llama.cpp keeps
llama-kv-cache.cpp apart from llama-graph.cpp.
"""

from __future__ import annotations

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.types import TYPES
from ggmlrun.models.graph.builder import GraphBuilder, LayerContext, row_size


class KVCache:
    """The graph's views of one memory cache (models/memory/caches.py, sized before any graph):
    a leaf per cache tensor of each layer the graph builds, named, shaped and typed as the
    memory lists it, cache_k_l{il} / cache_v_l{il} [n_stream, kv_size, width] (ggml ne
    [width, kv_size, n_stream]); V is read transposed without flash attention. One stream
    unless the context keeps one per sequence (-np N without -kvu): each stream then has
    kv_size cells, and the graph attends per stream.

    A hybrid model's graph also views llama_memory_recurrent's state over its recurrent
    layers (`state`): cache_r_l{il} and cache_s_l{il}, f32, whatever the context."""

    def __init__(self, memory, state=None):
        self.memory, self.state = memory, state
        self.type_k, self.type_v, self.kv_size = memory.type_k, memory.type_v, memory.cells
        self.kv_type = memory.type_k     # an MLA cache's one type (K only; K and V are one)
        self.v_trans, self.n_stream = memory.v_trans, memory.n_stream
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        self.r: dict[int, Tensor] = {}
        self.s: dict[int, Tensor] = {}
        self._kv = self._by_layer(memory.tensors())
        self._state = self._by_layer(state.tensors() if state is not None else [])

    @staticmethod
    def _by_layer(tensors) -> dict[int, list]:
        out: dict[int, list] = {}
        for t in tensors:
            out.setdefault(t.il, []).append(t)
        return out

    @staticmethod
    def _leaves(by_layer: dict, il: int, what: str) -> list[Tensor]:
        mine = by_layer.get(il)
        if not mine:
            raise ValueError(f"layer {il} has no {what} in the model's memory (create_memory)")
        return [GraphBuilder.leaf(t.name, t.shape, t.dtype, role="weight") for t in mine]

    def add_layer(self, il: int) -> None:
        """Layer il's K (and V, unless the cache is MLA's K-only one) views."""
        leaves = self._leaves(self._kv, il, "KV cache")
        self.k[il] = leaves[0]
        if len(leaves) > 1:
            self.v[il] = leaves[1]

    def add_recurrent(self, il: int) -> None:
        self.r[il], self.s[il] = self._leaves(self._state, il, "recurrent state")

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


def attn_inputs(b: GraphBuilder, hp, n_tokens: int, n_kv: int, n_stream: int,
                flash_attn: bool, cache) -> dict[str, Tensor]:
    """build_attn_inp_kv_impl: the cells K and V are stored to (V's per element when it is
    stored transposed, without flash attention), the mask over the `n_kv` cells attended
    over (f16 for flash attention), and the rotations of `cache` (the memory's KVCache) where
    its K or V type is quantized. An iSWA model makes a second set for its sliding-window
    cache, named as the first."""
    v_rows = n_tokens if not cache.v_trans else n_tokens * hp.n_embd_v_gqa
    out = {"k_idxs": b.leaf("attn_inp_k_idxs", (n_tokens,), "i64"),
           "v_idxs": b.leaf("attn_inp_v_idxs", (v_rows,), "i64"),
           "kq_mask": b.leaf("attn_inp_kq_mask", (n_stream, 1, n_tokens // n_stream, n_kv),
                             "f16" if flash_attn else "f32")}
    out.update(rotation_inputs(b, hp, cache))
    return out


def _one_head(sizes: set[int]) -> int:
    """llama_kv_cache's n_embd_head_{k,v}_all: the cache's layers' one head size, 0 for no
    layer, -1 when they differ."""
    return sizes.pop() if len(sizes) == 1 else (-1 if sizes else 0)


def rotation_inputs(b: GraphBuilder, hp, cache) -> dict[str, Tensor]:
    """llama_kv_cache's Hadamard rotations (attn_rot_k / attn_rot_v), each on where its side's
    type is quantized (a block type; bf16 is not), the model's head size is a multiple of 64
    and the cache's layers share one head size: K rotates by the largest power of two from 64
    up dividing that size, V by 64. MLA's K-only cache is read without them."""
    if hp.is_mla:
        return {}
    layers = list(cache.widths)
    out = {}
    head_k = _one_head({hp.head(il) for il in layers})
    if TYPES[cache.type_k].is_block and head_k > 0 and hp.n_embd_head_k % 64 == 0:
        nrot = 64
        while head_k % (nrot * 2) == 0:
            nrot *= 2
        out["k_rot"] = b.leaf("attn_inp_k_rot", (nrot, nrot), "f32")
    head_v = _one_head({hp.head_v(il) for il in layers})
    if TYPES[cache.type_v].is_block and head_v > 0 and hp.n_embd_head_v % 64 == 0:
        out["v_rot"] = b.leaf("attn_inp_v_rot", (64, 64), "f32")
    return out


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
        b.fa_nodes.append((cur, il))    # llm_graph_result's fused nodes: -fa auto's probe
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


def mul_mat_hadamard(ctx: LayerContext, cur: Tensor, rot: Tensor) -> Tensor:
    """llama_mul_mat_hadamard: rows of `n` rotated by the Walsh-Hadamard matrix (quantized KV
    caches), then back to cur's shape (ggml's reshape_4d to cur's ne: the same shape)."""
    b = ctx.b
    n = rot.shape[-1]
    flat = (cur.n_elements // n, n)
    res = b.reshape(cur, flat) if cur.is_contiguous else b.cont(cur, flat)
    res = ctx.mul_mat(rot, res)
    return b.reshape(res, cur.shape)
