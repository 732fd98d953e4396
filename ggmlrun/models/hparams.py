"""A model's hyperparameters, read from GGUF metadata as llama.cpp's loader reads them.

Keys are `{arch}.{name}` (llama.cpp's LLM_KV names). Defaults are llama.cpp's where a key is
optional; a missing required key is an input error naming it. `LlamaHParams` holds what
llama_model_base::load_hparams reads for every architecture (plus the RMS epsilon every
registered architecture requires); an architecture with keys of its own reads them in its
module's `read_hparams` (its load_arch_hparams) into a subclass (models/arch/).
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.util.errors import InputError


ROPE_SCALING = ("none", "linear", "yarn", "longrope")     # llama.cpp's LLAMA_ROPE_SCALING_TYPES


@dataclass(frozen=True)
class LlamaHParams:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    n_rot: int
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    norm_rms_eps: float = 1e-5
    n_embd_head_k: int = 0          # 0: n_embd / n_head
    n_embd_head_v: int = 0
    # rope scaling, as llama_model_base::load_hparams reads it for every architecture
    rope_scaling: str = "linear"    # rope.scaling.type: none | linear | yarn | longrope
    n_ctx_orig_yarn: int = 0        # rope.scaling.original_context_length; 0: n_ctx_train
    rope_attn_factor: float = 1.0   # rope.scaling.attn_factor
    yarn_beta_fast: float = 32.0    # read by the architectures that read it (mistral3)
    yarn_beta_slow: float = 1.0
    rope_yarn_log_mul: float = 0.0

    def __post_init__(self):
        for key in ("n_layer", "n_embd", "n_ff", "n_vocab", "n_ctx_train", "n_rot"):
            if getattr(self, key) <= 0:
                raise InputError(f"hyperparameter {key} must be positive, got {getattr(self, key)}")
        if self.n_head <= 0 or self.n_head_kv <= 0 or self.n_head % self.n_head_kv:
            raise InputError(f"attention heads {self.n_head} must be a positive multiple of "
                             f"the KV heads {self.n_head_kv}")
        if not self.n_embd_head_k:
            object.__setattr__(self, "n_embd_head_k", self.n_embd // self.n_head)
        if not self.n_embd_head_v:
            object.__setattr__(self, "n_embd_head_v", self.n_embd // self.n_head)
        if self.rope_scaling not in ROPE_SCALING:
            raise InputError(f"rope.scaling.type '{self.rope_scaling}' is not one llama.cpp "
                             f"knows ({', '.join(ROPE_SCALING)})")
        if not self.n_ctx_orig_yarn:
            object.__setattr__(self, "n_ctx_orig_yarn", self.n_ctx_train)

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv


HParams = LlamaHParams     # the common base, under the name every architecture shares


def from_metadata(fields: dict, arch: str = "llama") -> LlamaHParams:
    """`fields`: GGUF key -> plain value (ints, floats, strings, lists)."""

    def get(key: str, default=None, required: bool = True):
        full = f"{arch}.{key}"
        if full in fields:
            return fields[full]
        if required and default is None:
            raise InputError(f"GGUF metadata lacks '{full}', which a {arch} model needs")
        return default

    n_embd = int(get("embedding_length"))
    def per_layer(key: str, default=None) -> int:
        """get_key_or_arr: one value, or one per layer; the dense builders take equal ones."""
        value = get(key, default)
        if isinstance(value, (list, tuple)):
            if not value or any(v != value[0] for v in value):
                raise InputError(f"'{arch}.{key}' differs between layers ({list(value)[:8]}...); "
                                 f"ggmlrun's {arch} graph takes one value for every layer")
            value = value[0]
        return int(value)

    n_head = per_layer("attention.head_count")
    n_vocab = get("vocab_size", required=False)
    if n_vocab is None:
        tokens = fields.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise InputError(f"GGUF metadata has neither '{arch}.vocab_size' nor "
                             f"'tokenizer.ggml.tokens'; the vocabulary size is unknown")
        n_vocab = len(tokens)
    head_k = int(get("attention.key_length", 0) or 0) or n_embd // max(n_head, 1)
    # rope_freq_scale_train = 1 / rope.scaling.factor (or the older rope.scale_linear), whatever
    # the scaling type; the context turns it back to 1 for type none (rope_params in decoder.py)
    factor = float(get("rope.scaling.factor", 0.0) or 0.0) or float(get("rope.scale_linear", 0.0)
                                                                     or 0.0)
    scale = 1.0 / factor if factor else 1.0
    common = dict(
        n_layer=int(get("block_count")), n_embd=n_embd, n_head=n_head,
        n_head_kv=per_layer("attention.head_count_kv", n_head),
        n_ff=per_layer("feed_forward_length"), n_vocab=int(n_vocab),
        n_ctx_train=int(get("context_length")),
        n_rot=int(get("rope.dimension_count", head_k)),
        rope_freq_base=float(get("rope.freq_base", 10000.0)),
        rope_freq_scale=scale,
        # required: every registered architecture's load_arch_hparams reads it without a default
        norm_rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        n_embd_head_k=head_k,
        n_embd_head_v=int(get("attention.value_length", 0) or 0) or n_embd // max(n_head, 1),
        rope_scaling=str(get("rope.scaling.type", "linear")),
        n_ctx_orig_yarn=int(get("rope.scaling.original_context_length", 0) or 0),
        rope_attn_factor=float(get("rope.scaling.attn_factor", 1.0)))
    from ggmlrun.models.arch import get_arch

    spec = get_arch(arch)
    if spec.read_hparams is None:
        return LlamaHParams(**common)
    return spec.read_hparams(get, common)


def tensor_shapes(hp: LlamaHParams, arch: str = "llama",
                  optional: tuple[str, ...] = ("output.weight",)) -> dict[str, tuple[int, ...]]:
    """The tensors a model of `arch` has, NumPy order (ggml's ne reversed), in llama.cpp's load
    order: every required one, and of the optional ones those named in `optional` (by default
    `output.weight`: a file without it ties the output to `token_embd.weight`)."""
    from ggmlrun.models.arch import get_arch

    return {name: spec.shape for name, spec in get_arch(arch).tensors(hp).items()
            if spec.required is True or name in optional}


def llama_tensor_shapes(hp: LlamaHParams) -> dict[str, tuple[int, ...]]:
    """Every tensor a plain llama model has (tensor_shapes of llama)."""
    return tensor_shapes(hp, "llama")
