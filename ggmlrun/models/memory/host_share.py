"""The host memory llama-server grows into after it starts: its prompt cache and its slots'
context checkpoints (tools/server/server-context.cpp, server-task.cpp of the vendored
llama.cpp). Neither is allocated at start (the weights, KV cache, compute and output buffers
are, models/reserve.py); both are std::vector copies of sequence states made while serving, so
`fit` states them as upper bounds the host must leave room for. llama-cli runs the same server
in a thread (tools/cli/cli-server.h), with one slot, so it grows alike.

- A context checkpoint (server_prompt_checkpoint) is llama_state_seq_get_size_ext(ctx, slot,
  LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY): the part of a sequence's memory that cannot be rolled
  back. llama-server makes them while it processes a completion's prompt only where the memory
  cannot remove a sequence's tail: a recurrent or hybrid model (the partial state is the
  recurrent state alone: llama_memory_hybrid skips its attention cache), or an SWA model
  without --swa-full (n_swa = 0 under --swa-full; the partial state of llama_kv_cache_iswa is
  its SWA cache's cells of the sequence that are not masked: at most n_swa). A slot keeps at
  most --ctx-checkpoints of them (create_checkpoint erases the oldest first).
- The prompt cache (server_prompt_cache) keeps idle prompts' full states (flags 0: every cache
  of the sequence) with their checkpoints; --cache-ram N MiB bounds their sum (limit_size; an
  entry over it is skipped), -1 lifts that bound and leaves its token bound (limit_tokens =
  n_ctx, update() pops the oldest entries past it), 0 turns the cache off.

The byte counts are the state writer's (llama_kv_cache::state_write, llama_memory_recurrent::
state_write behind llama_context::state_seq_get_size's 4-byte magic and 4-byte sequence id), so
a checkpoint's size is exact for a full window, not an estimate of the tensors alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.ir.types import TYPES
from ggmlrun.models.memory.caches import KVCache, Memory, RecurrentState
from ggmlrun.models.options.params import ModelOptions, seq_max

MIB = 2**20
_HEADER = 8           # llama_context::state_seq_get_size: io_magic, seq_id
_CELL_EXT = 12        # llama_kv_cell_ext: x, y, tok (M-RoPE's 2D position, has_cell_ext)


def _row(dtype: str, width: int) -> int:
    return TYPES[dtype].contiguous_bytes((width,))


def kv_state_bytes(hp, cache: KVCache, cells: int) -> int:
    """llama_kv_cache::state_write for one sequence holding `cells` cells of one stream (the
    other streams write an empty count)."""
    n = 4 + 4 * cache.n_stream              # n_stream, then each stream's cell_count
    if cells == 0 or not cache.widths:
        return n
    meta = 4 + 4 + 4 + (_CELL_EXT if hp.rope_sections else 0)   # pos, n_seq_id, seq_id[, ext]
    n += cells * meta + 4 + 4              # v_trans, n_layer
    for il, (k, v) in cache.widths.items():
        n += 4 + 8 + cells * _row(cache.type_k, k)    # type, row size, rows
        if not v:
            continue
        if cache.v_trans:      # type, element size, n_embd_v_gqa(il), then its elements
            n += 4 + 4 + 4 + cells * _row(cache.type_v, hp.n_embd_v_gqa_l(il))
        else:
            n += 4 + 8 + cells * _row(cache.type_v, v)
    return n


def recurrent_state_bytes(state: RecurrentState) -> int:
    """llama_memory_recurrent::state_write for one sequence: its one cell (pos, n_seq_id 0),
    s_trans, n_layer, then each recurrent layer's r row and s row with their type and size."""
    n = 4 + 4 + 4 + 4 + 4
    for r, s in state.widths.values():
        n += 4 + 8 + _row("f32", r) + 4 + 8 + _row("f32", s)
    return n


def checkpoint_bytes(hp, memory: Memory, tokens: int | None = None) -> int:
    """One context checkpoint of a sequence of `tokens` tokens (None: at its largest, a whole
    window); 0 where the model makes none."""
    if memory.recurrent is not None:
        return _HEADER + recurrent_state_bytes(memory.recurrent)
    if memory.swa is not None and not memory.swa_full:
        window = hp.n_swa if tokens is None else min(tokens, hp.n_swa)
        return _HEADER + kv_state_bytes(hp, memory.swa, min(window, memory.swa.cells))
    return 0


def sequence_bytes(hp, memory: Memory, tokens: int) -> int:
    """A sequence's full state at `tokens` tokens (flags 0): what the prompt cache copies."""
    n = _HEADER + kv_state_bytes(hp, memory.kv, min(tokens, memory.kv.cells))
    if memory.swa is not None:
        window = tokens if memory.swa_full else min(tokens, hp.n_swa)
        n += kv_state_bytes(hp, memory.swa, min(window, memory.swa.cells))
    if memory.recurrent is not None:
        n += recurrent_state_bytes(memory.recurrent)
    return n


@dataclass(frozen=True)
class HostGrowth:
    """What llama-server may add to the host after it starts (all upper bounds)."""
    slots: int
    checkpoints_per_slot: int       # --ctx-checkpoints, 0 where the model makes none
    checkpoint_bytes: int           # one checkpoint (0: the model makes none)
    cache_ram_mib: int              # --cache-ram as given (negative: no limit, 0: off)
    prompt_cache_bytes: int         # its bound: --cache-ram, or n_ctx tokens' state under -1
    prompt_cache_bound: str         # "cache-ram", "tokens" (-1: n_ctx tokens) or "off"

    @property
    def checkpoints_bytes(self) -> int:
        return self.slots * self.checkpoints_per_slot * self.checkpoint_bytes

    @property
    def total_bytes(self) -> int:
        return self.checkpoints_bytes + self.prompt_cache_bytes


def host_growth(hp, memory: Memory, opts: ModelOptions) -> HostGrowth:
    """llama-server's growth for these options and this memory. llama-cli is the same server
    run in a thread (tools/cli/cli-server.h: llama_server(params) with llama-cli's params), so
    --for cli grows alike, with its one slot."""
    one = checkpoint_bytes(hp, memory)
    per_slot = max(0, opts.ctx_checkpoints) if one else 0
    ram = opts.cache_ram
    if ram > 0:
        cache, bound = ram * MIB, "cache-ram"
    elif ram < 0:
        # limit_tokens = llama_n_ctx (the padded context, every stream's cells): the prompts
        # hold that many tokens in all, each at most a stream's; the stream-full prompts and
        # the checkpoints each keeps (many shorter prompts repeat the headers, SWA windows and
        # recurrent states, which this leaves out: llama.cpp bounds -1 by tokens, not bytes)
        full = sequence_bytes(hp, memory, memory.kv.cells) + per_slot * one
        cache, bound = memory.kv.n_stream * full, "tokens"
    else:
        cache, bound = 0, "off"
    return HostGrowth(seq_max(opts), per_slot, one, ram, cache, bound)


def server_growth(hp, opts: ModelOptions, ctx: int) -> HostGrowth:
    """host_growth for the memory llama-server makes at context `ctx` (fit's answer or
    measure's): -fa auto makes its cache as for flash attention, as model_memory does."""
    from dataclasses import replace

    from ggmlrun.models.memory.caches import model_memory

    return host_growth(hp, model_memory(hp, replace(opts, ctx=ctx)), opts)
