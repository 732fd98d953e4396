"""llama.cpp's context and loader options, as one value the builder, placement and reserve share."""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass

from ggmlrun.models.hparams.keys import U32_MAX   # n_ctx, n_ubatch, n_batch: uint32_t

# common/arg.cpp's kv_cache_types, in its order: what -ctk and -ctv take
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
KV_PAD = 256          # llama-context.cpp: n_ctx = GGML_PAD(n_ctx, 256)


@dataclass(frozen=True)
class ModelOptions:
    ctx: int | None = None        # None: min(n_ctx_train, 4096)
    ubatch: int = 512             # clamped to ctx
    flash_attn: bool | None = None   # None: auto, resolved per placement (fa_resolved)
    ngl: int | None = None        # None: all (n_layer + 1)
    no_kv_offload: bool = False
    type_k: str = "f16"           # -ctk: the K cache's type (KV_TYPES)
    type_v: str = "f16"           # -ctv: the V cache's
    overrides: tuple[tuple[str, str], ...] = ()   # (regex, backend name), in order
    tensor_split: tuple[float, ...] | None = None # over non-CPU backends in order
    op_offload: bool = True
    ggml: str = "0.25"
    swa_full: bool = False        # --swa-full: sliding-window layers get a full-size cache
    sched_copies: int = 4         # GGML_SCHED_MAX_COPIES: pipeline-parallel copies (1: off)
    no_mmap: bool = False         # --no-mmap: CPU weights allocated, not mapped
    parallel: int | None = None   # -np: n_seq_max; None: llama-server's auto (seq_max)
    kv_unified: bool = False      # -kvu: one KV cache for all sequences (else one per sequence);
                                  # read unified(): -np auto is unified whatever this says
    target: str = "server"        # --for: whose defaults (llama-server's -np auto, llama-cli's 1)
    cpu_moe: bool = False         # --cpu-moe: every expert tensor on the CPU
    n_cpu_moe: int = 0            # --n-cpu-moe N: the experts of layers 0..N-1 on the CPU
    # llama-server's host growth (models/memory/host_share.py)
    cache_ram: int = 8192         # --cache-ram MiB of prompt cache (-1: no limit, 0: off)
    ctx_checkpoints: int = 32     # --ctx-checkpoints: context checkpoints kept per slot
    # the multimodal projector llama-server loads beside the model (models/projector/)
    mmproj: str | None = None     # --mmproj: its clip GGUF (a path, URL or hf:// file)
    no_mmproj: bool = False       # --no-mmproj: left out, even when --mmproj names one
    mmproj_offload: bool = True   # --no-mmproj-offload: on the CPU, not the main device
    # the draft model of speculative decoding (models/draft.py derives its options from these)
    model_draft: str | None = None   # -md MODEL, as given (a path, URL or hf:// name)
    ngl_draft: int | None = None     # -ngld: None all, as llama.cpp's default (-1) loads it
    ctx_draft: int | None = None     # None: the target's context, as llama.cpp sizes it
    type_k_draft: str = "f16"        # -ctkd: the draft's own K type (not the target's -ctk)
    type_v_draft: str = "f16"        # -ctvd
    devices_draft: tuple[str, ...] | None = None   # -devd: its devices, in order (): none
    # --kv-type: K and V both, when given (replace(opts, kv_type=T) too); never read back
    # (opts.kv_type is None): read type_k and type_v
    kv_type: InitVar[str | None] = None

    def __post_init__(self, kv_type: str | None) -> None:
        if kv_type is not None:
            object.__setattr__(self, "type_k", kv_type)
            object.__setattr__(self, "type_v", kv_type)


SCHED_MAX_COPIES = 4              # ggml-backend.h: GGML_SCHED_MAX_COPIES


# common/common.h: the expert tensors --cpu-moe and --n-cpu-moe keep on the CPU
LLM_FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def moe_overrides(opts: ModelOptions, cpu: str = "CPU") -> tuple[tuple[str, str], ...]:
    """--cpu-moe and --n-cpu-moe N as common/arg.cpp turns them into -ot rules: --cpu-moe is
    LLM_FFN_EXPS_REGEX, --n-cpu-moe N is llm_ffn_block_regex(i) = "blk\\.<i>" + that for
    i < N, each to the CPU's buffer type. They come after the --override-tensor rules (the
    first match wins), --cpu-moe's before --n-cpu-moe's."""
    rules = [(LLM_FFN_EXPS_REGEX, cpu)] if opts.cpu_moe else []
    rules += [(rf"blk\.{i}{LLM_FFN_EXPS_REGEX}", cpu) for i in range(opts.n_cpu_moe)]
    return tuple(rules)


def context_size(opts: ModelOptions, n_ctx_train: int) -> int:
    """The requested context (before llama.cpp pads the cache)."""
    return opts.ctx if opts.ctx is not None else min(n_ctx_train, 4096)


# tools/server/server.cpp: n_parallel < 0 (common/arg.cpp's server default -1, "auto") becomes
# 4 slots with kv_unified = true, whatever -kvu/-no-kvu said; llama-cli keeps common.h's 1
SERVER_AUTO_PARALLEL = 4


TARGETS = ("server", "cli")


def seq_max(opts: ModelOptions) -> int:
    """n_seq_max: -np as given, else the target's default: llama-server's auto (4),
    llama-cli's common_params.n_parallel (1)."""
    if opts.parallel is None:
        return SERVER_AUTO_PARALLEL if opts.target == "server" else 1
    return max(1, opts.parallel)


def unified(opts: ModelOptions) -> bool:
    """kv_unified as llama-server sets it: true under -np auto (whatever -kvu said), else
    -kvu's; llama-cli's is -kvu's."""
    return (opts.parallel is None and opts.target == "server") or opts.kv_unified


def kv_streams(opts: ModelOptions) -> int:
    """KV streams: one, or with -np N and no -kvu one per sequence."""
    return 1 if unified(opts) else seq_max(opts)


def kv_size(opts: ModelOptions, n_ctx_train: int) -> int:
    """KV cells per stream: the context rounded up to 256, as llama_context pads
    cparams.n_ctx; with a stream per sequence, n_ctx_seq = n_ctx / n_seq_max rounded up to 256
    (the whole cache then holds n_ctx_seq * n_seq_max cells)."""
    n = context_size(opts, n_ctx_train)
    n = (n + KV_PAD - 1) // KV_PAD * KV_PAD
    streams = kv_streams(opts)
    if streams > 1:
        n = (n // streams + KV_PAD - 1) // KV_PAD * KV_PAD
    return n


def ubatch_size(opts: ModelOptions, n_ctx_train: int) -> int:
    """n_ubatch = min(n_batch, n_ubatch) with n_batch = min(n_ctx, n_batch): llama_context clamps
    against the context as asked, before padding it (n_batch taken as >= n_ubatch)."""
    return min(opts.ubatch, context_size(opts, n_ctx_train))


def swa_kv_size(opts: ModelOptions, hp) -> int:
    """llama_kv_cache_iswa's SWA cache: PAD(min(kv_size, n_swa * (n_seq_max when one unified
    cache, else 1) + n_ubatch), 256) cells per stream, or the full cache's size under
    --swa-full; 0 for a model without SWA layers."""
    if not hp.has_swa:
        return 0
    size = kv_size(opts, hp.n_ctx_train)
    if opts.swa_full:
        return size
    windows = seq_max(opts) if unified(opts) else 1
    n = min(size, hp.n_swa * windows + ubatch_size(opts, hp.n_ctx_train))
    return (n + KV_PAD - 1) // KV_PAD * KV_PAD


def fa_requested(opts: ModelOptions) -> bool | None:
    """-fa after llama_init_from_model's own rule: auto with a quantized (block) V cache is
    enabled outright ("enabling flash_attn since it is required for quantized V cache"), no
    probe; None: auto, left to the probe (reserve.resolve_flash_attn)."""
    from ggmlrun.core.ir.types import TYPES     # the type table: not for --version's start

    if opts.flash_attn is None and TYPES[opts.type_v].is_block:
        return True
    return opts.flash_attn


def gpu_layers(opts: ModelOptions, n_layer: int) -> int:
    return n_layer + 1 if opts.ngl is None else opts.ngl


# --- option bounds, as llama.cpp's types bound them ---------------------------------------------
LLAMA_MAX_SEQ = 256               # llama-cparams.h: n_seq_max's bound
I32_MAX = 2**31 - 1               # n_gpu_layers is an int32_t in llama_model_params
MAX_REPEAT = 1000                 # RE2's (and ECMAScript engines') largest counted repetition


def split_proportions(parts) -> tuple[float, ...]:
    """--tensor-split's proportions, checked in float64 and scaled by a power of two so that
    the largest lies in [0.5, 1): llama.cpp's float32 split points (placement.split_points)
    are then the same as for the values as given (a power of two scales every float32 sum and
    the final division exactly) and can neither overflow (1e300,1e300) nor vanish
    (1e-300,1e-300). ValueError when a part is negative or not a number, or the sum is 0 or
    not finite."""
    parts = tuple(float(p) for p in parts)
    if any(not p >= 0 for p in parts):
        raise ValueError("every proportion must be a number >= 0")
    try:
        total = math.fsum(parts)
    except OverflowError:        # fsum: finite parts whose sum is past float64
        total = math.inf
    if not math.isfinite(total):
        raise ValueError("the proportions must be finite and their sum too")
    if not total > 0:
        raise ValueError("the proportions must not all be 0")
    _, exponent = math.frexp(max(parts))
    return tuple(math.ldexp(p, -exponent) for p in parts)


def _repeat_too_large(pattern: str) -> str | None:
    """A counted repetition ({n}, {n,}, {n,m}) past MAX_REPEAT, outside a character class and
    not escaped: RE2 reads one whose count overflows as literal text, so it is refused here."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        elif c == "{" and not in_class:
            j = i + 1
            while j < len(pattern) and (pattern[j].isdigit() or pattern[j] == ","):
                j += 1
            if j < len(pattern) and pattern[j] == "}" and j > i + 1:
                counts = [int(n) for n in pattern[i + 1:j].split(",") if n.isdigit()]
                if any(n > MAX_REPEAT for n in counts):
                    return pattern[i:j + 1]
            i = j
            continue
        i += 1
    return None


def compile_override(pattern: str):
    """An --override-tensor pattern compiled by RE2 (google-re2): matching takes time linear in
    the name whatever the pattern ('(a+)+$' included), and compiling is bounded by RE2's
    memory budget. Its syntax is RE2's: no backreferences or look-around, which it refuses.
    A pattern RE2 refuses is a ValueError with RE2's reason."""
    try:
        import re2
    except ImportError:          # a dependency (pyproject); never fall back to backtracking
        raise ValueError("--override-tensor needs the google-re2 package "
                         "(python3 -m pip install google-re2)") from None
    big = _repeat_too_large(pattern)
    if big:
        raise ValueError(f"repetition {big} is larger than {MAX_REPEAT}")
    options = re2.Options()
    options.log_errors = False   # RE2 would print its own line on stderr
    try:
        return re2.compile(pattern, options=options)
    except re2.error as err:
        reason = err.args[0] if err.args else err
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(str(reason)) from None
