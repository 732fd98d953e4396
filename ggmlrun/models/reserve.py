"""llama.cpp's buffers for a model and options, from the header alone.

- Model, KV, state and output buffers: models/memory/ (the caches sized from hyperparameters
  and options, create_memory; their bytes from the placement alone), before any graph.
- Compute buffers: llama_context::sched_reserve reserves the worst-case graphs in the order
  pp (n_tokens = n_ubatch, n_outputs = n_tokens, the whole cache), tg (1 token), pp again; ggml's
  allocator only grows, so each backend's buffer is its largest of the three. Each graph is
  scheduled with ggml's rules and planned with ggml's allocator (planner "ggml").
`n_nodes` / `n_splits` are the pp graph's, the numbers llama.cpp logs first.

Graphs are built once per memory and shape and never written on: each call hands the
scheduler its placement (placed_tensors: where weights and caches live, which nodes are
pinned), so a search over --ngl costs scheduling and allocation only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.memory.alloc import GraphAllocator
from ggmlrun.core.memory.sequence import allocation_sequence
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.sched.schedule import Schedule
from ggmlrun.core.sched.scheduler import Scheduler
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.gcpause import gc_paused
from ggmlrun.models.arch.build import graph_over
from ggmlrun.models.graph.output import ModelGraph
from ggmlrun.models.modelfile import ModelFile
from ggmlrun.models.options.params import (ModelOptions, context_size, fa_requested, gpu_layers,
                                           seq_max, ubatch_size)
from ggmlrun.models.options.table import check_fields
from ggmlrun.models.memory.buffers import (WeightBytes, kv_bytes, output_bytes, state_bytes,
                                           weights_bytes)
from ggmlrun.models.memory.caches import Memory, model_memory
from ggmlrun.models.memory.placement import Placement, place
from ggmlrun.models.projector.clip import read_clip
from ggmlrun.models.projector.measure import ProjectorFigures, measure_projector

@dataclass
class BackendFigures:
    name: str
    kind: str
    weights_bytes: int
    kv_bytes: int
    arena_bytes: int
    memory_bytes: int
    output_bytes: int = 0         # the CPU: the output (logits) buffer, host memory
    mapped_bytes: int = 0         # the CPU: the mapped file range (--no-mmap: allocated)
    repack_bytes: int = 0         # the CPU: ggml-cpu's CPU_REPACK buffer
    state_bytes: int = 0          # the recurrent state (llama_memory_recurrent), hybrid models
    mmproj_bytes: int = 0         # the projector's (--mmproj) weights and compute buffer here
    # of kv_bytes, the caches whose cells are the context (the full cache, and the SWA cache
    # under --swa-full): what grows in proportion to it (fit's context bounds); None: all
    kv_linear_bytes: int | None = None

    @property
    def kv_linear(self) -> int:
        return self.kv_bytes if self.kv_linear_bytes is None else self.kv_linear_bytes


@dataclass
class ModelMeasure:
    n_nodes: int
    n_splits: int
    ctx: int
    ubatch: int
    ngl: int
    backends: list[BackendFigures]
    schedule: Schedule | None     # the pp graph's (None: not reserved, see `reserved`)
    n_copies: int = 1             # the scheduler's copies: > 1 with pipeline parallelism
    # the flash attention planned for (-fa auto resolved); None: auto, not resolved (a measure
    # cut short before any graph)
    flash_attn: bool | None = False
    # the graphs reserved: "pp+tg" (llama.cpp's whole reserve), or, cut short by
    # measure_model's `enough`, "pp" or "none" (arenas a lower bound; "none": no schedule)
    reserved: str = "pp+tg"
    mmproj: ProjectorFigures | None = None    # --mmproj: the projector, measured on its own
    mmproj_note: str | None = None    # why an hf:// repository's projector was left out
    # the draft model's own figures (models/draft.py), already added into `backends`
    draft: ModelMeasure | None = None

    @property
    def partial(self) -> bool:
        return self.reserved != "pp+tg"


_GRAPHS: dict[tuple, tuple[ModelFile, ModelGraph]] = {}


def model_graph(model: ModelFile, memory: Memory, n_tokens: int, n_outputs: int,
                shared: tuple = ()) -> ModelGraph:
    """The reserve graph for one ubatch shape over the whole memory (every cell attended
    over), built once per model, memory and shape (and sharing of the per-layer duplicated
    tensors, Placement.shared_copies). Entries hold their model, so an id in a key always
    belongs to the model it was made for."""
    swa = memory.swa.cells if memory.swa is not None else 0
    key = (id(model), memory.key, n_tokens, n_outputs, shared)
    entry = _GRAPHS.get(key)
    if entry is None or entry[0] is not model:
        if len(_GRAPHS) >= 16:
            _GRAPHS.clear()
        entry = _GRAPHS[key] = (model, graph_over(
            model, memory, n_tokens, n_outputs, memory.kv.cells, swa_n_kv=swa, shared=shared,
            n_seqs=memory.recurrent.rows if memory.recurrent else 1))
    return entry[1]


def placed_tensors(mg: ModelGraph, placement: Placement, backends: list[BackendSpec]
                   ) -> dict[Tensor, str | None]:
    """Where the placement puts the graph's weights and caches (their buffers) and llama.cpp's
    pins on its nodes, as the scheduler's `placed` map: the graph itself is never written
    on, so one graph serves every placement of a search."""
    names = [b.name for b in backends]
    placed: dict[Tensor, str | None] = {}
    for name, leaf in mg.weights.items():
        b = placement.weights.get(name)
        if b is not None:             # None: a NextN layer's tensor, never loaded nor used
            placed[leaf] = names[b]
    placed[mg.output_weight] = names[placement.output_weight]
    copies = placement.layer_copies.get(mg.rope_freqs_name, placement.rope_freqs)
    for il, leaf in mg.rope_freqs.items():
        placed[leaf] = names[copies[il]]
    for cache in mg.caches:              # each layer's K/V where its layer is (full or SWA)
        for il, leaf in cache.k.items():
            for t in (leaf, cache.v.get(il)):     # MLA: K only
                if t is not None:
                    placed[t] = names[placement.kv[il]]
    for il, leaf in mg.cache.r.items():       # the recurrent state: where the KV would be
        placed[leaf] = placed[mg.cache.s[il]] = names[placement.kv[il]]
    pin = mg.n_tokens < 32 or placement.full_offload
    for node, il in mg.norm_pins:
        b = placement.layer[il]
        placed[node] = names[b] if pin and backends[b].supports_op(node.op) else None
    for node in mg.kqv_outs:
        placed[node] = names[placement.cpu] if placement.no_kv_offload else None
    return placed


def check_options(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions) -> None:
    try:
        check_fields(opts)
    except ValueError as err:
        raise InputError(str(err)) from None
    check_kv_types(model.hparams, opts)
    if not backends or backends[-1].kind != "cpu":
        raise InputError("the last backend must be a CPU")


def check_kv_types(hp, opts: ModelOptions) -> None:
    """llama_init_from_model's refusals of -ctk/-ctv, in its order and words: an MLA model's
    K and V of one type; a quantized (block) V only with flash attention; with flash
    attention, a block type's size dividing every layer's head size on its side. Without
    flash attention llama.cpp checks no quantized K's block against the head size (the views
    of K would split blocks, ggml_row_size's assert being compiled out): refused here."""
    k, v = opts.type_k, opts.type_v
    said = f"--cache-type-k {k} --cache-type-v {v}"
    if hp.is_mla and k != v:
        raise InputError(f"{said}: an MLA model takes one type for K and V (llama.cpp: model "
                         f"does not support different K ({k}) and V ({v}) cache types)")
    if TYPES[v].is_block and opts.flash_attn is False:
        raise InputError(f"--cache-type-v {v} needs --flash-attn on (llama.cpp: quantized V "
                         f"cache requires flash_attn to be enabled)")
    for side, gtype, head_of in (("k", TYPES[k], hp.head), ("v", TYPES[v], hp.head_v)):
        head = next((head_of(il) for il in range(hp.n_layer)
                     if head_of(il) % gtype.block_size), None)
        if not gtype.is_block or head is None:
            continue
        flag = f"--cache-type-{side} {gtype.name}"
        if opts.flash_attn is False:    # side "k": a quantized V was refused above
            raise InputError(f"{flag}: its {gtype.block_size}-value blocks do not divide the "
                             f"head size {head}; without flash attention llama.cpp takes it "
                             f"unchecked and reads K through views that split its blocks")
        raise InputError(f"{flag}: its {gtype.block_size}-value blocks do not divide the "
                         f"model's head size {head} (llama.cpp: {side.upper()} cache type "
                         f"{gtype.name} with block size {gtype.block_size} does not divide "
                         f"n_embd_head_{side}={head}); use f16")


def pipeline_copies(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions) -> int:
    """ggml_backend_sched's n_copies as llama_context makes it: GGML_SCHED_MAX_COPIES
    (`--sched-copies`, 4) when llama.cpp turns pipeline parallelism on, else 1. On when the
    model has more than one device, every layer is offloaded (-ngl past n_layer: the output
    layer too), layers are split across devices (the only split ggmlrun has), the KV cache is
    offloaded, no tensor override is given (-ot; --cpu-moe and --n-cpu-moe are overrides too),
    and every device supports async compute and events (RPC and CUDA devices do; ggmlrun's
    sim devices stand for those)."""
    devices = [b for b in backends if b.kind != "cpu"]
    on = (len(devices) > 1
          and gpu_layers(opts, model.hparams.n_layer_all) > model.hparams.n_layer_all
          and not opts.no_kv_offload
          and not opts.overrides
          and not opts.cpu_moe and not opts.n_cpu_moe)
    return max(1, opts.sched_copies) if on else 1


def measure_model(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions,
                  enough: Callable[[list[BackendFigures], str], bool] | None = None,
                  outputs_max: int | None = None) -> ModelMeasure:
    """`enough(figures, reserved)`: asked first with the weights, KV and state alone (reserved
    "none": no compute buffer yet), then with the pp graph's buffers ("pp"): each is a lower
    bound of the whole reserve's (the allocator only grows), so when it says yes the rest is
    left out and the measure is partial (`reserved` says how far it went). fit passes "a
    device already misses", which nothing left out could undo. `outputs_max`: the context's
    n_outputs_max (None: n_batch, llama.cpp's default), which caps the pp graph's outputs (a
    draft's: -np, models/draft.py)."""
    check_options(model, backends, opts)
    with gc_paused():
        return _measure(model, backends, opts, enough, outputs_max)


def _measure(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions,
             enough: Callable[[list[BackendFigures], str], bool] | None,
             outputs_max: int | None = None) -> ModelMeasure:
    hp = model.hparams
    memory = model_memory(hp, opts)       # llama_model::create_memory: before any graph
    n_tokens = min(memory.kv.cells, ubatch_size(opts, hp.n_ctx_train))
    placement = place(hp, model.tensors, backends, opts)
    n_copies = pipeline_copies(model, backends, opts)
    wb = weights_bytes(model.tensors, placement, backends, no_mmap=opts.no_mmap)
    # pp, tg, pp again: the third is the first graph under the same placement, which ggml's
    # deterministic allocator sizes exactly as before, so its result is reused
    # llama_context::graph_reserve with n_seqs = n_seq_max: pp rounds its tokens up to a
    # multiple of the sequences (its outputs stay the ubatch's), tg is one token per sequence
    n_seqs = seq_max(opts)
    pp_tokens = -(-n_tokens // n_seqs) * n_seqs
    # -fa auto is resolved by a graph: only once the buffers before any graph leave room
    flash_attn = fa_requested(opts)

    def graph(tokens: int, outputs: int) -> ModelGraph:
        return model_graph(model, memory, tokens, outputs, placement.shared_copies())

    mmproj, mmproj_note = projector_figures(model, backends, opts)
    static = _figures(model, opts, backends, placement, memory, wb)  # no compute buffer yet
    if mmproj is not None:
        static = [replace(f, mmproj_bytes=mmproj.bytes_on(f.name)) for f in static]
    figures, arena, reserved, sched, n_nodes = static, [0] * len(backends), "none", None, 0
    if enough is None or not enough(static, "none"):
        if flash_attn is None:
            flash_attn = fa_probe(model, backends, opts, placement, memory, n_copies)
        memory = replace(memory, flash_attn=flash_attn)
        pp = graph(pp_tokens, n_tokens if outputs_max is None else min(n_tokens, outputs_max))
        n_nodes = len(pp.graph.nodes)
        scheduler = Scheduler(backends, op_offload=opts.op_offload, ggml=opts.ggml,
                              n_copies=n_copies)
        allocator = GraphAllocator([b.alignment for b in backends], ggml=opts.ggml,
                                   sizers=[b.alloc_size if b.row_padding else None
                                           for b in backends])
        for mg, stage in ((pp, "pp"), (None, "pp+tg")):
            mg = mg or graph(n_seqs, n_seqs)
            graph_sched = scheduler.schedule(mg.graph,
                                             placed=placed_tensors(mg, placement, backends))
            plan = allocator.plan(*allocation_sequence(graph_sched))
            arena = [max(a, b) for a, b in zip(arena, plan.arena_bytes)]
            sched, reserved = sched or graph_sched, stage
            figures = [replace(f, arena_bytes=a) for f, a in zip(static, arena)]
            if stage == "pp" and enough is not None and enough(figures, "pp"):
                break
    return ModelMeasure(n_nodes=n_nodes,
                        n_splits=len(sched.splits) if sched else 0,
                        ctx=context_size(opts, hp.n_ctx_train), ubatch=n_tokens,
                        ngl=gpu_layers(opts, hp.n_layer_all), backends=figures, schedule=sched,
                        n_copies=n_copies, reserved=reserved, flash_attn=flash_attn,
                        mmproj=mmproj, mmproj_note=mmproj_note)


def fa_probe(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions,
             placement: Placement, memory: Memory, n_copies: int) -> bool:
    """-fa auto as llama_context::resolve_fused_ops resolves it: the graph of one token per
    sequence (n_seq_max tokens and outputs) is built with flash attention over the memory
    already made for it and scheduled; flash attention stays on when every flash_attn_ext
    node lands on its layer's device (model.dev_layer(il): the CPU for a layer left there),
    else it is off for the whole context. A device without the op (a backend's `supports`,
    a head size its kernels lack) sends the node elsewhere; so does -nkvo, the cache being
    on the CPU while the layer is not (llama.cpp's own TODO: dev_layer is wrong there)."""
    n = seq_max(opts)
    mg = model_graph(model, replace(memory, flash_attn=True), n, n, placement.shared_copies())
    scheduler = Scheduler(backends, op_offload=opts.op_offload, ggml=opts.ggml,
                          n_copies=n_copies)
    where = scheduler.schedule(mg.graph, placed=placed_tensors(mg, placement, backends)
                               ).backend_of
    return all(where.get(node) == placement.layer[il] for node, il in mg.fa_nodes)


_PROJECTORS: dict[tuple, tuple[ProjectorFigures | None, str | None]] = {}
_REPO_MMPROJ: dict[tuple[str, str], str | None] = {}


def projector_figures(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions
                      ) -> tuple[ProjectorFigures | None, str | None]:
    """llama-server's projector and, when there is none, why (None: none asked for).
    `--mmproj` names it; without it an hf:// model brings its repository's, as `-hf` does
    (gguf/source.py repo_mmproj); `--no-mmproj` leaves either out. One the user named and
    ggmlrun cannot size is refused (exit 2); a repository's is left out with a note. Measured
    once per file, backends and settings: it is placed whole, whatever -ngl, so fit's probes
    share it. Its flash attention is the model's -fa as given, not as the text context resolved
    it: llama-server hands params_base.flash_attn_type to libmtmd, so auto (None) is clip's own
    probe (measure_projector)."""
    if opts.no_mmproj:
        return None, None
    from ggmlrun.models.gguf import hub

    name, named = opts.mmproj, bool(opts.mmproj)
    # a remote name's file is the Hub's: the same name on another endpoint is another file
    where = hub.endpoint() if hub.is_hf(str(name or model.source or "")) else ""
    if not named:
        source = model.source or ""
        if not hub.is_hf(source):
            return None, None
        if (where, source) not in _REPO_MMPROJ:
            from ggmlrun.models.gguf.source import repo_mmproj

            _REPO_MMPROJ[where, source] = repo_mmproj(source)
        name = _REPO_MMPROJ[where, source]
        if name is None:
            return None, None
    key = (where, name, tuple((b.name, b.kind, b.alignment, b.row_padding) for b in backends),
           opts.mmproj_offload, opts.flash_attn, opts.ggml)
    if key not in _PROJECTORS:
        try:
            _PROJECTORS[key] = (measure_projector(read_clip(name), backends,
                                                  offload=opts.mmproj_offload,
                                                  flash_attn=opts.flash_attn, ggml=opts.ggml),
                                None)
        except InputError as err:
            if named:
                raise
            _PROJECTORS[key] = (None, f"the repository's projector {name} is left out (give "
                                      f"--no-mmproj to skip it): {err}")
    return _PROJECTORS[key]


def _figures(model: ModelFile, opts: ModelOptions, backends: list[BackendSpec],
             placement: Placement, memory: Memory, wb: WeightBytes) -> list[BackendFigures]:
    """Every buffer but the compute buffers (arena_bytes 0): the placement and the memory
    decide them, before any graph."""
    kvb = kv_bytes(memory, placement, backends)
    rsb = state_bytes(memory, placement, backends)
    linear = kv_bytes(memory, placement, backends, linear_only=True)
    return [BackendFigures(name=b.name, kind=b.kind, weights_bytes=wb.sizes[i], kv_bytes=kvb[i],
                           arena_bytes=0, memory_bytes=b.memory,
                           output_bytes=output_bytes(model.hparams, opts) if i == placement.cpu else 0,
                           mapped_bytes=wb.mapped if i == placement.cpu else 0,
                           repack_bytes=wb.repack if i == placement.cpu else 0,
                           state_bytes=rsb[i], kv_linear_bytes=linear[i])
            for i, b in enumerate(backends)]
