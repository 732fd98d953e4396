"""A model's memory, sized before any graph: llama_model::create_memory.

llama.cpp decides the caches from the hyperparameters and the context's options alone, and the
graph only takes views of them. So does ggmlrun: `create_memory` answers, per layer, which
cache holds it and in which widths, from the per-layer questions the hyperparameter record
answers (as llama_hparams does):

- `is_recurrent(il)`: the layer keeps llama_memory_recurrent's state (cache_r_l / cache_s_l,
  n_embd_r / n_embd_s floats per row, max(1, n_seq_max) rows whatever the context): one family
  whose widths the hyperparameters give (llama_hparams::n_embd_r / n_embd_s: a short conv's
  n_embd (l_cache - 1) and no SSM state; a delta-net's or Mamba-2's conv state
  (d_conv - 1)(d_inner + 2 n_group d_state) and SSM state d_state d_inner);
- `has_kv(il)`: the layer stores K and V (gemma4's last layers read another layer's cache;
  nemotron_h's MLP layers, without KV heads, store nothing);
- `is_swa(il)`: into llama_kv_cache_iswa's sliding-window cache rather than the full one,
  whose kind (`swa_type`, llama_swa_type) says which cells a token sees: a window of n_swa
  positions back ("standard") or its own chunk of n_swa positions ("chunked", llama4);
  `swa_visible` is that rule (is_masked_swa), the one every mask over the cache follows;
- `n_embd_k_gqa_l(il)`, `n_embd_v_gqa_l(il)`: its row widths; V rows are the widest layer's
  (`n_embd_v_gqa`) while V is stored transposed, without flash attention
  ([TAG_V_CACHE_VARIABLE]);
- `is_mla`: K rows only, V being a view of them (llama_hparams::is_mla).

K and V each have their type (-ctk / -ctv: llama_context_params' type_k and type_v), so a
block type's bytes are its blocks': rows of `width` values in width / block_size blocks.

Each cache lists its tensors (name, NumPy-order shape, type) and so its bytes on each backend
once placement has put each layer somewhere; models/graph/attention.py makes the graph's
leaves from the same list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ggmlrun.core.ir.types import TYPES
from ggmlrun.models.options.params import (ModelOptions, kv_size, kv_streams, seq_max,
                                           swa_kv_size)

STATE_TYPE = "f32"     # llama_memory_recurrent: r and s in F32 whatever the KV type
SWA_TYPES = ("standard", "chunked")     # LLAMA_SWA_TYPE_STANDARD, LLAMA_SWA_TYPE_CHUNKED


def swa_visible(swa_type: str, n_swa: int, p0, p1):
    """Whether a token at position p1 sees the cell of position p0 (causality aside) in a
    sliding-window cache of this kind: llama_hparams::is_masked_swa, negated. Works on ints
    and on NumPy arrays alike."""
    if swa_type == "chunked":
        return p0 >= (p1 // n_swa) * n_swa
    return p1 - p0 < n_swa


@dataclass(frozen=True)
class CacheTensor:
    il: int
    name: str
    shape: tuple[int, ...]     # NumPy order: (n_stream, cells, width) or (rows, width)
    dtype: str

    @property
    def nbytes(self) -> int:
        return TYPES[self.dtype].contiguous_bytes(self.shape)


@dataclass(frozen=True)
class KVCache:
    """llama_kv_cache: per layer cache_k_l{il} (of type_k) and (unless MLA) cache_v_l{il}
    (of type_v), each [n_stream, cells, width]; `widths[il]` = (K width, V width or 0 for K
    only)."""
    type_k: str
    type_v: str
    cells: int                    # per stream (kv_size)
    n_stream: int
    v_trans: bool                 # V read transposed (no flash attention)
    widths: dict[int, tuple[int, int]] = field(default_factory=dict)
    swa: bool = False             # the iSWA pair's sliding-window cache
    swa_type: str = ""            # its kind (SWA_TYPES); "" for a full cache

    def tensors(self) -> list[CacheTensor]:
        out = []
        for il, (k, v) in self.widths.items():
            out.append(CacheTensor(il, f"cache_k_l{il}", (self.n_stream, self.cells, k),
                                   self.type_k))
            if v:
                out.append(CacheTensor(il, f"cache_v_l{il}", (self.n_stream, self.cells, v),
                                       self.type_v))
        return out


@dataclass(frozen=True)
class RecurrentState:
    """llama_memory_recurrent: cache_r_l{il} [rows, n_embd_r] and cache_s_l{il} [rows,
    n_embd_s] for each recurrent layer; `widths[il]` = (n_embd_r, n_embd_s)."""
    rows: int
    widths: dict[int, tuple[int, int]] = field(default_factory=dict)

    def tensors(self) -> list[CacheTensor]:
        out = []
        for il, (r, s) in self.widths.items():
            out.append(CacheTensor(il, f"cache_r_l{il}", (self.rows, r), STATE_TYPE))
            out.append(CacheTensor(il, f"cache_s_l{il}", (self.rows, s), STATE_TYPE))
        return out


@dataclass(frozen=True)
class Memory:
    """What create_memory made: the full KV cache, the SWA cache of an iSWA model (None
    otherwise), the recurrent state of a hybrid model (None otherwise)."""
    kv: KVCache
    swa: KVCache | None = None
    recurrent: RecurrentState | None = None
    swa_full: bool = False        # --swa-full: the SWA cache has the full cache's cells
    # the graph's flash attention where it is not the cache's layout's: -fa auto makes the
    # cache for flash attention (V not transposed) before its probe may turn it off
    # (llama_context: create_memory, then sched_reserve's resolve_fused_ops); None: not v_trans
    flash_attn: bool | None = None

    @property
    def graph_fa(self) -> bool:
        return not self.kv.v_trans if self.flash_attn is None else self.flash_attn

    @property
    def key(self) -> tuple:
        """What the memory was made from, beside the model's hyperparameters: equal keys for
        one model are equal memories (a graph cache's key)."""
        kv, swa, rec = self.kv, self.swa, self.recurrent
        return (kv.type_k, kv.type_v, kv.cells, kv.n_stream, kv.v_trans, swa.cells if swa else 0,
                rec.rows if rec else 0, self.swa_full, self.graph_fa)

    @property
    def caches(self) -> list[KVCache]:
        return [self.kv] + ([self.swa] if self.swa is not None else [])

    def cache_of(self, il: int) -> KVCache:
        return self.swa if self.swa is not None and il in self.swa.widths else self.kv

    def kv_tensors(self, linear_only: bool = False) -> list[CacheTensor]:
        """Every attention cache's tensors; `linear_only`: the caches whose cells are the
        context (the full cache, and the SWA cache under --swa-full)."""
        out = []
        for cache in self.caches:
            if linear_only and cache.swa and not self.swa_full:
                continue
            out += cache.tensors()
        return out

    def state_tensors(self) -> list[CacheTensor]:
        return self.recurrent.tensors() if self.recurrent is not None else []


def create_memory(hp, *, cells: int, flash_attn: bool, kv_type: str = "f16",
                  type_k: str | None = None, type_v: str | None = None, n_stream: int = 1,
                  swa_cells: int = 0, n_seq_max: int = 1, swa_full: bool = False) -> Memory:
    """llama_model::create_memory for explicit sizes (`cells`, `swa_cells` per stream); K's
    and V's types `type_k` and `type_v`, each `kv_type` unless given (as --kv-type)."""
    v_trans = not flash_attn
    types = (type_k or kv_type, type_v or kv_type)
    full = KVCache(*types, cells, n_stream, v_trans)
    swa = KVCache(*types, swa_cells or cells, n_stream, v_trans, swa=True,
                  swa_type=hp.swa_type) if hp.has_swa else None
    state = RecurrentState(max(1, n_seq_max))
    for il in range(hp.n_layer):
        if hp.is_recurrent(il):
            state.widths[il] = (hp.n_embd_r, hp.n_embd_s)
            continue
        if not hp.has_kv(il):
            continue
        v = 0 if hp.is_mla else (hp.n_embd_v_gqa if v_trans else hp.n_embd_v_gqa_l(il))
        cache = swa if swa is not None and hp.is_swa(il) else full
        cache.widths[il] = (hp.n_embd_k_gqa_l(il), v)
    return Memory(full, swa, state if state.widths else None, swa_full)


def model_memory(hp, opts: ModelOptions) -> Memory:
    """The memory a context with these options makes (llama_context's cparams: the padded
    context per stream, the streams, the SWA cache's cells, the sequences). -fa auto counts
    as on here: cparams.flash_attn is "not disabled" when the memory is made."""
    return create_memory(hp, type_k=opts.type_k, type_v=opts.type_v,
                         cells=kv_size(opts, hp.n_ctx_train),
                         flash_attn=opts.flash_attn is not False, n_stream=kv_streams(opts),
                         swa_cells=swa_kv_size(opts, hp), n_seq_max=seq_max(opts),
                         swa_full=opts.swa_full)
