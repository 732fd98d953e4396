"""Evaluate a real model file: the prompt in ubatches of --ubatch tokens, llama.cpp's graph,
real weights.

Weights come memory-mapped from the GGUF (mapped.py: one map of one descriptor, checked
against the header; block types stay raw bytes, as the quantized kernels take them), the KV
cache (and a hybrid model's recurrent state) starts empty (zeros), and the inputs are the ones
llama.cpp's set_input fills for one batch in sequence 0 split into ubatches: ubatch i at
positions p0..p0+n_tok-1 writes cache cells p0.., attends with a causal mask over the n_kv cells
in use (padded to 256), and the caches it wrote carry over to the next (the recurrent state is
cleared by the first ubatch only: rs_z 0, then -1); the last token's row is the one output.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.engine import check_capacity, execute, plan_memory
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.run.exec import RunResult
from ggmlrun.core.sched.scheduler import Scheduler
from ggmlrun.core.util.errors import InputError, RunError
from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.models.arch.build import graph_over
from ggmlrun.models.graph.output import ModelGraph
from ggmlrun.models.gguf.mapped import MappedFile, sigbus_guard
from ggmlrun.models.modelfile import ModelFile
from ggmlrun.models.options.params import (KV_PAD, ModelOptions, context_size, fa_requested,
                                           kv_size, swa_kv_size, ubatch_size)
from ggmlrun.models.memory.caches import create_memory, swa_visible
from ggmlrun.models.memory.placement import place
from ggmlrun.models.reserve import check_options, fa_probe, placed_tensors



def storage_shape(shape: tuple[int, ...], dtype: str) -> tuple[tuple[int, ...], np.dtype]:
    """How a tensor's bytes are held in NumPy: plain types as themselves, bf16 as uint16 and
    block types as uint8 rows of their bytes."""
    g = TYPES[dtype]
    if g.numpy is not None:
        return shape, g.numpy
    if g.is_block:
        return (*shape[:-1], g.row_bytes(shape[-1])), np.dtype(np.uint8)
    return shape, np.dtype(np.uint16)


def weight_values(model: ModelFile, mg: ModelGraph, data: list[np.ndarray]
                  ) -> dict[Tensor, np.ndarray]:
    """Views of the mapped files' bytes (`data`, one per shard of a split set) for the
    weights, zeros for the KV cache."""
    values = {}
    leaves = list(mg.weights.items())
    if "output.weight" not in mg.weights:       # tied: the duplicate reads token_embd's bytes
        leaves.append(("token_embd.weight", mg.output_weight))
    leaves += [(mg.rope_freqs_name, leaf) for leaf in mg.rope_freqs.values()]
    for name, leaf in leaves:
        info = model.tensors[name]
        shape, dtype = storage_shape(info.shape, info.dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        values[leaf] = data[info.shard][info.offset:info.offset + nbytes].view(dtype).reshape(
            shape)
    for cache in mg.caches:
        for leaf in (*cache.k.values(), *cache.v.values(), *cache.r.values(), *cache.s.values()):
            shape, dtype = storage_shape(leaf.shape, leaf.dtype)
            values[leaf] = np.zeros(shape, dtype)
    return values


def attn_input_values(inp: dict, n_tok: int, n_kv: int, kv_cells: int, n_embd_v_gqa: int,
                      n_swa: int = 0, p0: int = 0,
                      swa_type: str = "standard") -> dict[Tensor, np.ndarray]:
    """One cache's attention inputs for n_tok tokens of sequence 0 at positions p0.. in cells p0..
    (llama_kv_cache's set_input_k_idxs / v_idxs / kq_mask): a causal mask over its n_kv cells,
    and with `n_swa` the sliding window of that kind too (caches.swa_visible)."""
    cells = np.arange(p0, p0 + n_tok, dtype=np.int64)
    if "v_idxs" not in inp:       # MLA: the K-only cache
        v_idxs = None
    elif inp["v_idxs"].shape[0] == n_tok:
        v_idxs = cells
    else:       # transposed V: one row per element, element e of token t at e * kv_size + t
        v_idxs = (np.arange(n_embd_v_gqa, dtype=np.int64)[None, :] * kv_cells
                  + cells[:, None]).reshape(-1)
    p1, pc = cells[:, None], np.arange(n_kv)[None, :]
    keep = (pc <= p1) & (pc < p0 + n_tok)
    if n_swa:
        keep &= swa_visible(swa_type, n_swa, pc, p1)
    mask = np.where(keep, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
    mask_t = inp["kq_mask"]
    rotations = {inp[key]: hadamard(inp[key].shape[0]) for key in ("k_rot", "v_rot") if key in inp}
    out = {**rotations, inp["k_idxs"]: cells,
           mask_t: mask.astype(mask_t.np_dtype).reshape(mask_t.shape)}
    if v_idxs is not None:
        out[inp["v_idxs"]] = v_idxs
    return out


def input_values(mg: ModelGraph, tokens: list[int], n_kv: int, kv_cells: int,
                 n_embd_v_gqa: int, p0: int = 0) -> dict[Tensor, np.ndarray]:
    """One ubatch of `tokens` at positions p0.. (cells p0.., after p0 cells in use)."""
    n_tok = len(tokens)
    inp = mg.inputs
    values = attn_input_values(inp, n_tok, n_kv, kv_cells, n_embd_v_gqa, p0=p0)
    if mg.swa_cache is not None:      # llama_kv_cache_iswa: the SWA cache's own inputs
        values.update(attn_input_values(mg.swa_inputs, n_tok, mg.swa_n_kv, mg.swa_cache.kv_size,
                                        n_embd_v_gqa, mg.n_swa, p0=p0,
                                        swa_type=mg.swa_cache.memory.swa_type))
    pos = np.arange(p0, p0 + n_tok, dtype=np.int32)
    if inp["pos"].shape[0] == 4 * n_tok:     # M-RoPE / IMROPE text positions: t, h, w the same, e 0
        pos = np.concatenate([pos, pos, pos, np.zeros(n_tok, np.int32)])
    values.update({inp["tokens"]: np.asarray(tokens, dtype=np.int32),
                   inp["embd"]: np.zeros(inp["embd"].shape, np.float32),
                   inp["pos"]: pos,
                   inp["out_ids"]: np.array([n_tok - 1], dtype=np.int32)})
    if "s_copy" in inp:               # the recurrent state: sequence 0 reads its own row
        values[inp["s_copy"]] = np.zeros(inp["s_copy"].shape, np.int32)
    if "ple_tokens" in inp:           # gemma4's per-layer embeddings read the tokens again
        values[inp["ple_tokens"]] = np.asarray(tokens, dtype=np.int32)
    return values


def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix llama_kv_cache rotates a quantized cache with."""
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def run_model(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions,
              tokens: list[int], *, repeat: int = 1, warmup: int = 0,
              record_events: bool = False, progress=None) -> tuple[np.ndarray, RunResult]:
    """The last token's logits and the run (`repeat` timed runs after `warmup` untimed ones;
    `record_events` for a trace or a profile); the result carries `schedule` and
    `memory_plan` for those."""
    check_options(model, backends, opts)
    hp = model.hparams
    if not tokens:
        raise InputError("--tokens is empty; give at least one token id")
    bad = [t for t in tokens if not 0 <= t < hp.n_vocab]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the vocabulary 0..{hp.n_vocab - 1}")
    cells = kv_size(opts, hp.n_ctx_train)
    if len(tokens) > context_size(opts, hp.n_ctx_train):
        raise InputError(f"{len(tokens)} tokens do not fit the context of "
                         f"{context_size(opts, hp.n_ctx_train)}; raise --ctx")
    ubatch = ubatch_size(opts, hp.n_ctx_train)
    swa = swa_kv_size(opts, hp)
    placement = place(hp, model.tensors, backends, opts)
    scheduler = Scheduler(backends, op_offload=opts.op_offload, ggml=opts.ggml)
    # a sliding-window cache's cells are reused past its size: a prompt longer than it runs as
    # one ubatch (as before); the others in ubatches of --ubatch tokens, as llama.cpp splits it
    # (llama4's chunked cache is full-size up to its chunk of 8192)
    step = len(tokens) if hp.has_swa and len(tokens) > swa else ubatch
    chunks = [tokens[i:i + step] for i in range(0, len(tokens), step)]
    if not model.files:
        raise InputError(f"model '{model.name}' is a card, with no weights to run; run a GGUF file")
    kv_memory = create_memory(hp, type_k=opts.type_k, type_v=opts.type_v, cells=cells,
                              flash_attn=opts.flash_attn is not False, swa_cells=swa)
    flash_attn = fa_requested(opts)
    if flash_attn is None:       # -fa auto: llama.cpp's probe on this placement
        flash_attn = fa_probe(model, backends, opts, placement, kv_memory, 1)
    kv_memory = replace(kv_memory, flash_attn=flash_attn)

    def prepare(i: int):
        """Ubatch i's graph, placed, scheduled, planned and checked against the memory."""
        p0, n_tok = i * step, len(chunks[i])
        used = (p0 + n_tok + KV_PAD - 1) // KV_PAD * KV_PAD
        n_kv = min(cells, max(KV_PAD, used))                                       # get_n_kv
        mg = graph_over(model, kv_memory, n_tok, 1, n_kv, swa_n_kv=min(swa, max(KV_PAD, used)),
                        shared=placement.shared_copies(), rs_zero=0 if i == 0 else -1)
        writes = cache_writes(mg) if i < len(chunks) - 1 else {}   # what the next one reads
        sched = scheduler.schedule(mg.graph, placed=placed_tensors(mg, placement, backends))
        plan, memory = plan_memory(sched, "ggml")
        check_capacity(sched, memory)
        check_run_memory(model, mg, memory)
        return p0, n_tok, n_kv, mg, writes, sched, plan

    # before anything is computed: the most tokens (the first) and the most cells (the last)
    ready = {i: prepare(i) for i in sorted({0, len(chunks) - 1})}
    weights = []
    try:
        for f in model.files:                   # every shard of a split set
            weights.append(MappedFile(f.path, f.stamp, f.data_end))
    except BaseException:
        for mapped in weights:
            mapped.close()
        raise
    caches: dict[str, np.ndarray] = {}       # cache leaf name -> its bytes after the last ubatch
    try:
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            p0, n_tok, n_kv, mg, writes, sched, plan = ready.pop(i) if i in ready else prepare(i)
            values = weight_values(model, mg, [w.bytes for w in weights])
            values.update((leaf, caches[leaf.name]) for leaf in cache_leaves(mg)
                          if leaf.name in caches)
            values.update(input_values(mg, chunk, n_kv, cells, hp.n_embd_v_gqa, p0))
            values.update((leaf, fill(range(p0, p0 + n_tok))) for leaf, fill in mg.extra_inputs.items())
            with sigbus_guard(model.path):
                result = execute(sched, plan, values, repeat=repeat if last else 1,
                                 warmup=warmup if last else 0,
                                 record_events=record_events and last,
                                 progress=progress if last else None)
            for name, node in writes.items():       # what this ubatch left in the caches
                caches[name] = np.asarray(result.outputs[node.name]).reshape(
                    storage_shape(node.view_src.shape, node.view_src.dtype)[0])
            values = None
        for mapped in weights:
            mapped.check_unchanged()
    finally:
        values = None
        for mapped in weights:
            mapped.close()
    result.schedule, result.memory_plan = sched, plan
    logits = np.asarray(result.outputs["result_output"], dtype=np.float32).reshape(1, hp.n_vocab)
    return logits, result


def cache_leaves(mg: ModelGraph) -> list[Tensor]:
    return [leaf for cache in mg.caches
            for leaf in (*cache.k.values(), *cache.v.values(), *cache.r.values(),
                         *cache.s.values())]


def cache_writes(mg: ModelGraph) -> dict[str, Tensor]:
    """Per cache tensor, the node whose result views all of it after the ubatch wrote it (the
    K/V set_rows, the conv and delta states' copies), made an output of the graph so its bytes
    come back and seed the next ubatch."""
    roots = {id(leaf): leaf for leaf in cache_leaves(mg)}
    out = {}
    for node in mg.graph.nodes:
        root = node.view_src
        if (node.op in ("set_rows", "cpy") and root is not None and id(root) in roots
                and node.nbytes == root.nbytes and node.view_offset == 0):
            out[root.name] = node
    for node in out.values():
        if not node.is_output:
            node.is_output = True
            mg.graph.outputs.append(node)
    return out


def check_run_memory(model: ModelFile, mg: ModelGraph, memory) -> None:
    """Before anything is allocated: every backend's buffers (the executor copies the weights
    in) and the KV cache's starting values against the machine's available memory, and with
    the mapped file against the address-space limit (RLIMIT_AS) where one is set."""
    from ggmlrun.core.util import ram

    buffers = sum(m.arena_bytes + m.weights_bytes for m in memory)
    caches = sum(leaf.nbytes for cache in mg.caches
                 for leaf in (*cache.k.values(), *cache.v.values(), *cache.r.values(),
                              *cache.s.values()))
    inputs = 2 * sum(t.nbytes for t in (*mg.inputs.values(), *mg.swa_inputs.values()))
    need = buffers + caches + inputs
    what = (f"running this model ({human_bytes(buffers)} of backend buffers, "
            f"{human_bytes(caches + inputs)} of cache and input values)")
    ram.ensure_memory(need, what)
    space = address_space()
    if space is not None:
        limit, used = space
        mapped = sum(f.stamp.size for f in model.files)
        if used + mapped + need > limit:
            raise RunError(f"{what} needs {human_bytes(need)} and the mapped file "
                           f"{human_bytes(mapped)} more address space, but RLIMIT_AS "
                           f"({human_bytes(limit)}) leaves {human_bytes(max(0, limit - used))}; "
                           f"raise the limit (ulimit -v) or use a smaller --ctx or fewer tokens")


def address_space() -> tuple[int, int] | None:
    """(RLIMIT_AS's soft limit, the address space this process uses now); None without a limit.
    Read through core/util/host.py, the one reader of the host (GGMLRUN_HOST_LIMIT plays
    another machine; the tightest of RLIMIT_AS and a cgroup's memory limit)."""
    from ggmlrun.core.util import host

    limit = host.memory_limit()
    if limit is None:
        return None
    return limit, host.read_address_space_used()
