"""llama.cpp's context and loader options, as one value the builder, placement and reserve share."""

from __future__ import annotations

from dataclasses import dataclass

KV_TYPES = ("f16", "f32", "q8_0")
KV_PAD = 256          # llama-context.cpp: n_ctx = GGML_PAD(n_ctx, 256)


@dataclass(frozen=True)
class ModelOptions:
    ctx: int | None = None        # None: min(n_ctx_train, 4096)
    ubatch: int = 512             # clamped to ctx
    flash_attn: bool = False
    ngl: int | None = None        # None: all (n_layer + 1)
    no_kv_offload: bool = False
    kv_type: str = "f16"          # f16 | f32 | q8_0
    overrides: tuple[tuple[str, str], ...] = ()   # (regex, backend name), in order
    tensor_split: tuple[float, ...] | None = None # over non-CPU backends in order
    op_offload: bool = True
    ggml: str = "0.25"


def context_size(opts: ModelOptions, n_ctx_train: int) -> int:
    """The requested context (before llama.cpp pads the cache)."""
    return opts.ctx if opts.ctx is not None else min(n_ctx_train, 4096)


def kv_size(opts: ModelOptions, n_ctx_train: int) -> int:
    """KV cells: the context rounded up to 256, as llama_context pads cparams.n_ctx."""
    n = context_size(opts, n_ctx_train)
    return (n + KV_PAD - 1) // KV_PAD * KV_PAD


def ubatch_size(opts: ModelOptions, n_ctx_train: int) -> int:
    """n_ubatch = min(n_batch, n_ubatch) with n_batch = min(n_ctx, n_batch): llama_context clamps
    against the context as asked, before padding it (n_batch taken as >= n_ubatch)."""
    return min(opts.ubatch, context_size(opts, n_ctx_train))


def gpu_layers(opts: ModelOptions, n_layer: int) -> int:
    return n_layer + 1 if opts.ngl is None else opts.ngl
