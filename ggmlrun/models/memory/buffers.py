"""The buffers llama.cpp allocates for a model before any graph is reserved: the weights per
backend (llama_model::load_tensors), the KV cache and recurrent state (llama_memory_*), the
output buffer. Their bytes follow from the placement and the memory (models/memory/caches.py)
alone, so fit can count them, and rule a placement out, without building a graph.
`tensors`: the model's tensor table (GGUF name -> dtype, shape, file offset)."""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.fmt import align_up
from ggmlrun.models.memory.caches import Memory
from ggmlrun.models.memory.placement import Placement
from ggmlrun.models.options.params import ModelOptions, seq_max

GGUF_ALIGNMENT = 32


@dataclass
class WeightBytes:
    """Model buffers per backend as llama.cpp allocates them; on the CPU, `mapped` (the file
    range with mmap, or the allocated tensors with --no-mmap) plus `repack` (CPU_REPACK)."""
    sizes: list[int]
    mapped: int = 0
    repack: int = 0


def weights_bytes(tensors: dict, placement: Placement, backends: list[BackendSpec],
                  no_mmap: bool = False) -> WeightBytes:
    """llama_model::load_tensors' buffers. A CPU matrix ggml-cpu repacks (its type and rows,
    core/backends/repack.py) goes to CPU_REPACK (its bytes, aligned); every other CPU tensor
    lives in the mapped file, whose buffer is the range from the first to the end of the last
    of them (llama_model_loader::get_mapping_range: it spans tensors that live elsewhere, on a
    device or repacked), or with --no-mmap is allocated, each aligned. A card has no offsets:
    its mapped tensors count each padded to GGUF's 32 bytes, as in the real file."""
    from ggmlrun.core.backends.repack import repacked

    sizes = [0] * len(backends)
    # a device's host buffer type comes before CPU_REPACK in llama.cpp's CPU list (profiles.py)
    host_first = any(b.kind != "cpu" and b.host_buffer for b in backends)

    def to_repack(spec: BackendSpec, dtype: str, shape) -> bool:
        return not host_first and repacked(spec.repack_kind, dtype, shape)

    cpu_range: dict[int, list[int]] = {}     # per file of a split set: llama.cpp maps each
    mapped = repack = 0
    placed = list(placement.weights.items())
    # TENSOR_DUPLICATED tensors take bytes again in each other buffer they are copied into
    duplicates = set()
    if "output.weight" not in tensors:
        duplicates.add(("token_embd.weight", placement.output_weight))
    for name, copies in placement.layer_copies.items():   # rope factors: one copy per layer
        duplicates.update((name, b) for b in copies if b is not None)
    placed_set = set(placed)
    placed += sorted(d for d in duplicates if d not in placed_set)
    for name, b in placed:
        info = tensors[name]
        nbytes = TYPES[info.dtype].row_bytes(_elements(info.shape))
        spec = backends[b]
        if spec.kind != "cpu":
            sizes[b] += align_up(spec.alloc_size(info.dtype, info.shape, nbytes), spec.alignment)
            continue
        if name != "token_embd.weight" and to_repack(spec, info.dtype, info.shape):
            repack += align_up(nbytes, spec.alignment)      # read by MUL_MAT: CPU_REPACK
        elif no_mmap:
            mapped += align_up(nbytes, spec.alignment)
        elif info.offset is not None:
            cpu_range.setdefault(info.shard, []).extend((info.offset, info.offset + nbytes))
        else:
            mapped += align_up(nbytes, GGUF_ALIGNMENT)      # a card: the file's own padding
    # a tied output on the CPU: the duplicate of token_embd that the output's MUL_MAT reads
    # (one tensor with token_embd on the CPU) is still offered to CPU_REPACK
    if "output.weight" not in tensors and backends[placement.output_weight].kind == "cpu":
        info = tensors["token_embd.weight"]
        spec = backends[placement.output_weight]
        if to_repack(spec, info.dtype, info.shape):
            repack += align_up(TYPES[info.dtype].row_bytes(_elements(info.shape)), spec.alignment)
    for ends in cpu_range.values():        # llama_model_loader::get_mapping_range, per file
        mapped += max(ends) - min(ends)
    sizes[placement.cpu] += mapped + repack
    return WeightBytes(sizes, mapped, repack)


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _cache_bytes(tensors, placement: Placement, backends: list[BackendSpec]) -> list[int]:
    """Each cache tensor on its layer's backend (placement.kv: the CPU under
    --no-kv-offload), rounded up to that backend's alignment."""
    sizes = [0] * len(backends)
    for t in tensors:
        b = placement.kv[t.il]
        spec = backends[b]
        sizes[b] += align_up(spec.alloc_size(t.dtype, t.shape, t.nbytes), spec.alignment)
    return sizes


def kv_bytes(memory: Memory, placement: Placement, backends: list[BackendSpec],
             linear_only: bool = False) -> list[int]:
    """Every attention cache's tensors (llama_kv_cache_iswa: the full and the SWA cache, each
    its own buffers). `linear_only`: the caches whose cells are the context (without
    --swa-full the SWA cache stops growing at its window plus a ubatch)."""
    return _cache_bytes(memory.kv_tensors(linear_only), placement, backends)


def state_bytes(memory: Memory, placement: Placement, backends: list[BackendSpec]) -> list[int]:
    """llama_memory_recurrent's buffers: cache_r_l / cache_s_l of each recurrent layer; their
    rows do not depend on the context."""
    return _cache_bytes(memory.state_tensors(), placement, backends)


def output_bytes(hp, opts: ModelOptions) -> int:
    """llama_context::output_reserve at creation: logits for max(n_outputs, n_seq_max) rows,
    n_outputs being n_seq_max then: n_vocab floats per sequence, in host memory (the CPU's
    buffer type, or the output device's pinned host buffer type, CUDA_Host)."""
    return hp.n_vocab * 4 * seq_max(opts)
