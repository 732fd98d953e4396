"""llama.cpp's buffers for a model and options, from the header alone.

- Model buffers: on the CPU the weights are memory-mapped, and llama.cpp wraps the file range
  from the first to the end of the last CPU tensor (llama_model_loader::get_mapping_range) in
  one buffer; on a device each tensor takes its size rounded up to the device's alignment.
- KV buffers: per backend, every cache tensor rounded up to the alignment.
- Compute buffers: llama_context::sched_reserve reserves the worst-case graphs in the order
  pp (n_tokens = n_ubatch, n_outputs = n_tokens, the whole cache), tg (1 token), pp again; ggml's
  allocator only grows, so each backend's buffer is its largest of the three. Each graph is
  scheduled with ggml's rules and planned with ggml's allocator (planner "ggml").
`n_nodes` / `n_splits` are the pp graph's, the numbers llama.cpp logs first.

Graphs are built once per shape and re-placed for each call (placement only changes where
weights live and which nodes are pinned), so a search over --ngl costs scheduling and
allocation only.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.memory.alloc import GraphAllocator, allocation_sequence
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.sched.schedule import Schedule
from ggmlrun.core.sched.scheduler import Scheduler
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.gcpause import gc_paused
from ggmlrun.models.decoder import ModelGraph, build_graph
from ggmlrun.models.modelfile import ModelFile
from ggmlrun.models.options import (KV_TYPES, U32_MAX, ModelOptions, context_size, gpu_layers,
                                     kv_size, ubatch_size)
from ggmlrun.models.placement import Placement, place

GGUF_ALIGNMENT = 32


@dataclass
class BackendFigures:
    name: str
    kind: str
    weights_bytes: int
    kv_bytes: int
    arena_bytes: int
    memory_bytes: int
    state_bytes: int = 0          # the recurrent state (llama_memory_recurrent), hybrid models


@dataclass
class ModelMeasure:
    n_nodes: int
    n_splits: int
    ctx: int
    ubatch: int
    ngl: int
    backends: list[BackendFigures]
    schedule: Schedule            # the last reserve's (pp)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


_GRAPHS: dict[tuple, tuple[ModelFile, ModelGraph]] = {}


def model_graph(model: ModelFile, n_tokens: int, n_outputs: int, n_kv: int, kv: int,
                flash_attn: bool, kv_type: str, shared: tuple = ()) -> ModelGraph:
    """The graph for one ubatch shape, built once per model and shape (and sharing of the
    per-layer duplicated tensors, Placement.shared_copies). Entries hold their model, so an id
    in a key always belongs to the model it was made for."""
    key = (id(model), n_tokens, n_outputs, n_kv, kv, flash_attn, kv_type, shared)
    entry = _GRAPHS.get(key)
    if entry is None or entry[0] is not model:
        if len(_GRAPHS) >= 16:
            _GRAPHS.clear()
        entry = _GRAPHS[key] = (model, build_graph(model, n_tokens, n_outputs, n_kv, kv,
                                                   flash_attn, kv_type, shared))
    return entry[1]


def apply_placement(mg: ModelGraph, placement: Placement, backends: list[BackendSpec]) -> None:
    """Weights and caches into their buffers, llama.cpp's pins onto their nodes."""
    names = [b.name for b in backends]
    for name, leaf in mg.weights.items():
        leaf.backend = names[placement.weights[name]]
    mg.output_weight.backend = names[placement.output_weight]
    copies = placement.layer_copies.get(mg.rope_freqs_name, placement.rope_freqs)
    for il, leaf in mg.rope_freqs.items():
        leaf.backend = names[copies[il]]
    for il, leaf in mg.cache.k.items():
        leaf.backend = mg.cache.v[il].backend = names[placement.kv[il]]
    for il, leaf in mg.cache.r.items():       # the recurrent state: where the KV would be
        leaf.backend = mg.cache.s[il].backend = names[placement.kv[il]]
    pin = mg.n_tokens < 32 or placement.full_offload
    for node, il in mg.norm_pins:
        b = placement.layer[il]
        node.backend = names[b] if pin and backends[b].supports_op(node.op) else None
    for node in mg.kqv_outs:
        node.backend = names[placement.cpu] if placement.no_kv_offload else None


def check_options(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions) -> None:
    if opts.kv_type not in KV_TYPES:
        raise InputError(f"--kv-type {opts.kv_type}: choose one of {', '.join(KV_TYPES)}")
    if opts.kv_type in TYPES and TYPES[opts.kv_type].is_block and not opts.flash_attn:
        raise InputError(f"--kv-type {opts.kv_type} needs --flash-attn on (llama.cpp: a "
                         f"quantized V cache requires flash attention)")
    if opts.kv_type in TYPES and TYPES[opts.kv_type].is_block:
        block = TYPES[opts.kv_type].block_size      # llama_init_from_model refuses the same
        for kind, head in (("k", model.hparams.n_embd_head_k), ("v", model.hparams.n_embd_head_v)):
            if head % block:
                raise InputError(f"--kv-type {opts.kv_type}: its {block}-value blocks do not divide "
                                 f"the model's head size {head} (llama.cpp: {kind.upper()} cache "
                                 f"type {opts.kv_type} with block size {block} does not divide "
                                 f"n_embd_head_{kind}={head}); use --kv-type f16")
    if opts.ctx is not None and not 1 <= opts.ctx <= U32_MAX:
        raise InputError(f"--ctx must be 1..{U32_MAX} (llama.cpp's uint32), got {opts.ctx}")
    if not 1 <= opts.ubatch <= U32_MAX:
        raise InputError(f"--ubatch must be 1..{U32_MAX} (llama.cpp's uint32), got "
                         f"{opts.ubatch}")
    if not backends or backends[-1].kind != "cpu":
        raise InputError("the last backend must be a CPU")


def weights_bytes(model: ModelFile, placement: Placement, backends: list[BackendSpec]) -> list[int]:
    sizes = [0] * len(backends)
    cpu_range: list[int] = []
    placed = list(placement.weights.items())
    # TENSOR_DUPLICATED tensors take bytes again in each other buffer they are copied into
    duplicates = set()
    if "output.weight" not in model.tensors:
        duplicates.add(("token_embd.weight", placement.output_weight))
    for name, copies in placement.layer_copies.items():   # rope factors: one copy per layer
        duplicates.update((name, b) for b in copies)
    placed += sorted(d for d in duplicates if d not in set(placed))
    for name, b in placed:
        info = model.tensors[name]
        nbytes = TYPES[info.dtype].row_bytes(_elements(info.shape))
        if backends[b].kind == "cpu" and info.offset is not None:
            cpu_range += [info.offset, info.offset + nbytes]
        elif backends[b].kind == "cpu":
            sizes[b] += _align(nbytes, GGUF_ALIGNMENT)      # a card: the file's own padding
        else:
            spec = backends[b]
            sizes[b] += _align(spec.alloc_size(info.dtype, info.shape, nbytes), spec.alignment)
    if cpu_range:
        sizes[placement.cpu] += max(cpu_range) - min(cpu_range)
    return sizes


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def kv_bytes(mg: ModelGraph, placement: Placement, backends: list[BackendSpec]) -> list[int]:
    sizes = [0] * len(backends)
    for il, k in mg.cache.k.items():
        b = placement.kv[il]
        for t in (k, mg.cache.v[il]):
            spec = backends[b]
            sizes[b] += _align(spec.alloc_size(t.dtype, t.shape, t.nbytes), spec.alignment)
    return sizes


def state_bytes(mg: ModelGraph, placement: Placement, backends: list[BackendSpec]) -> list[int]:
    """llama_memory_recurrent's buffers: cache_r_l / cache_s_l of each recurrent layer, on its
    layer's backend (the CPU under --no-kv-offload), each rounded up to the alignment; their
    rows do not depend on the context."""
    sizes = [0] * len(backends)
    for il, r in mg.cache.r.items():
        b = placement.kv[il]
        for t in (r, mg.cache.s[il]):
            spec = backends[b]
            sizes[b] += _align(spec.alloc_size(t.dtype, t.shape, t.nbytes), spec.alignment)
    return sizes


def measure_model(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions) -> ModelMeasure:
    check_options(model, backends, opts)
    with gc_paused():
        return _measure(model, backends, opts)


def _measure(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions) -> ModelMeasure:
    hp = model.hparams
    kv = kv_size(opts, hp.n_ctx_train)
    n_tokens = min(kv, ubatch_size(opts, hp.n_ctx_train))
    placement = place(hp, model.tensors, backends, opts)
    scheduler = Scheduler(backends, op_offload=opts.op_offload, ggml=opts.ggml)
    allocator = GraphAllocator([b.alignment for b in backends], ggml=opts.ggml,
                               sizers=[b.alloc_size if b.row_padding else None for b in backends])
    arena = [0] * len(backends)
    reserved = []
    # pp, tg, pp again: the third is the first graph under the same placement, which ggml's
    # deterministic allocator sizes exactly as before, so its result is reused
    for tokens in (n_tokens, 1):
        mg = model_graph(model, tokens, tokens, kv, kv, opts.flash_attn, opts.kv_type,
                         placement.shared_copies())
        apply_placement(mg, placement, backends)
        sched = scheduler.schedule(mg.graph)
        plan = allocator.plan(*allocation_sequence(sched))
        arena = [max(a, b) for a, b in zip(arena, plan.arena_bytes)]
        reserved.append((mg, sched))
    (pp, sched), _ = reserved
    weights = weights_bytes(model, placement, backends)
    kvb = kv_bytes(pp, placement, backends)
    rsb = state_bytes(pp, placement, backends)
    figures = [BackendFigures(name=b.name, kind=b.kind, weights_bytes=weights[i], kv_bytes=kvb[i],
                              arena_bytes=arena[i], memory_bytes=b.memory, state_bytes=rsb[i])
               for i, b in enumerate(backends)]
    return ModelMeasure(n_nodes=len(pp.graph.nodes), n_splits=len(sched.splits),
                        ctx=context_size(opts, hp.n_ctx_train), ubatch=n_tokens,
                        ngl=gpu_layers(opts, hp.n_layer), backends=figures, schedule=sched)
