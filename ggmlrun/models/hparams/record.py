"""A model's hyperparameters, read from GGUF metadata as llama.cpp's loader reads them.

Keys are `{arch}.{name}` (llama.cpp's LLM_KV names). Defaults are llama.cpp's where a key is
optional; a missing required key is an input error naming it. `HParams` holds what
llama_model_base::load_hparams reads for every architecture (plus the RMS epsilon every
registered architecture requires); an architecture with keys of its own reads them in its
module's `read_hparams` (its load_arch_hparams) into a subclass (models/arch/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ggmlrun.core.util.errors import InputError


ROPE_SCALING = ("none", "linear", "yarn", "longrope")     # llama.cpp's LLAMA_ROPE_SCALING_TYPES


@dataclass(frozen=True)
class HParams:
    N_FF_OPTIONAL: ClassVar[bool] = False     # feed_forward_length may be 0 (absent)
    # llama_hparams::is_mla: one K-only cache row per token (V is a view of it)
    is_mla: ClassVar[bool] = False
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
    # NextN (multi-token prediction) layers at the end of block_count (glm4moe): counted by
    # -ngl and in the layer split, never loaded nor run; n_layer is the trunk (llama.cpp's
    # n_layer(), n_layer_all being block_count)
    n_layer_nextn: int = 0
    # sliding-window attention (llama_hparams n_swa, is_swa): read by the architectures that
    # have it (gemma3); a model with any SWA layer gets llama_kv_cache_iswa's two caches
    n_swa: int = 0
    swa_layers: tuple = ()          # per layer: True for a sliding-window layer
    rope_freq_base_swa: float = 10000.0    # rope_freq_base_train_swa (SWA layers' rope)
    rope_freq_scale_swa: float = 1.0

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    @property
    def has_swa(self) -> bool:
        return any(self.swa_layers)

    # llama_hparams' per-layer questions, which models/memory/caches.py sizes the caches by;
    # an architecture whose layers differ answers them in its own record (models/arch/)
    def is_recurrent(self, il: int) -> bool:
        return False

    def has_kv(self, il: int) -> bool:
        return True

    def n_embd_k_gqa_l(self, il: int) -> int:
        return self.n_embd_k_gqa

    def n_embd_v_gqa_l(self, il: int) -> int:
        return self.n_embd_v_gqa

    def __post_init__(self):
        for key in ("n_layer", "n_embd", "n_ff", "n_vocab", "n_ctx_train", "n_rot"):
            if key == "n_ff" and self.n_ff == 0 and self.N_FF_OPTIONAL:
                continue
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
    def n_layer_all(self) -> int:
        return self.n_layer + self.n_layer_nextn

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv



def read_hparams(fields: dict, spec, types: dict | None = None) -> HParams:
    """`fields`: GGUF key -> plain value (ints, floats, strings, lists); `spec`: the
    architecture's registry entry (models/arch/: its own keys and reader), handed down by the
    caller; `types`: GGUF key -> its stored GGUF type where known (`gguf_types`). Every value is checked by hparam_rules
    against hparam_keys' table (types, ranges) and the rules between keys before it is used;
    the common keys are read here, the architecture's own by its module (models/arch/)."""
    from ggmlrun.models.hparams import rules
    from ggmlrun.models.hparams.keys import VOCAB_LIST

    arch = spec.name
    prefix = f"{arch}."
    values = rules.check(fields, prefix=prefix, types=types, per_layer=spec.per_layer)
    # per-layer values (an architecture that has them: gemma4): layer 0's stands for the
    # common scalar, the whole tuple is the architecture's to read (get.arrays)
    arrays = {key: value for key, value in values.items() if isinstance(value, tuple)
              and key in spec.per_layer}
    values.update((key, value[0]) for key, value in arrays.items())

    def get(key: str, default=None, required: bool = True):
        if key in values:
            return values[key]
        if required and default is None:
            raise InputError(f"GGUF metadata lacks '{prefix}{key}', which a {arch} model needs")
        return default

    n_layer = get("block_count")
    n_embd = get("embedding_length")
    n_head = get("attention.head_count")
    n_vocab = get("vocab_size", required=False)
    if n_vocab is None:
        tokens = fields.get(VOCAB_LIST)
        if tokens is None:
            raise InputError(f"GGUF metadata has neither '{arch}.vocab_size' nor "
                             f"'{VOCAB_LIST}'; the vocabulary size is unknown")
        n_vocab = rules.check_vocab_list(len(tokens))
    n_head_kv = get("attention.head_count_kv", n_head)
    head_k = get("attention.key_length", 0) or n_embd // n_head
    head_v = get("attention.value_length", 0) or n_embd // n_head
    n_rot = get("rope.dimension_count", head_k)
    rules.check_heads(arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_k=head_k,
                      head_v=head_v, n_rot=n_rot, prefix=prefix)
    scaling = get("rope.scaling.type", "linear")
    if scaling == "longrope" and not spec.longrope:
        # llama.cpp then rotates with the rope_factors_long/short tensors, which this
        # architecture's builder does not make: refused rather than computed differently
        raise InputError(f"{prefix}rope.scaling.type 'longrope' is not built by ggmlrun's "
                         f"{arch} graph (phi3's is); supported: none, linear, yarn")
    # rope_freq_scale_train = 1 / rope.scaling.factor (or the older rope.scale_linear), whatever
    # the scaling type; the context turns it back to 1 for type none (decoder.rope_params)
    factor = get("rope.scaling.factor", 0.0) or get("rope.scale_linear", 0.0)
    common = dict(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        # llama.cpp reads it optionally; an architecture whose FFN widths have keys of their own
        # (qwen35moe's experts) may lack it (0)
        n_ff=get("feed_forward_length", 0 if spec.n_ff_optional else None), n_vocab=n_vocab,
        n_ctx_train=get("context_length"), n_rot=n_rot,
        rope_freq_base=get("rope.freq_base", 10000.0),
        rope_freq_scale=1.0 / factor if factor else 1.0,
        # required: every registered architecture's load_arch_hparams reads it without a default
        norm_rms_eps=get("attention.layer_norm_rms_epsilon"),
        n_embd_head_k=head_k, n_embd_head_v=head_v,
        rope_scaling=scaling,
        n_ctx_orig_yarn=get("rope.scaling.original_context_length", 0),
        rope_attn_factor=get("rope.scaling.attn_factor", 1.0))
    if spec.read_hparams is None:
        return HParams(**common)
    get.arrays = arrays
    return spec.read_hparams(get, common)


_GGUF_TYPE_NAMES = {"u8": "UINT8", "i8": "INT8", "u16": "UINT16", "i16": "INT16",
                    "u32": "UINT32", "i32": "INT32", "u64": "UINT64", "i64": "INT64",
                    "f32": "FLOAT32", "f64": "FLOAT64", "bool": "BOOL", "str": "STRING"}


def gguf_types(kv_types: dict[str, str], prefix: str) -> dict[str, str]:
    """Each `prefix` key's stored GGUF type by gguf.GGUFValueType's name ("UINT32",
    "ARRAY[INT32]"), from the header reader's short names ("u32", "arr[i32]"): what hparam_rules
    checks a value's type against."""
    types = {}
    for key, short in kv_types.items():
        if not key.startswith(prefix):
            continue
        if short.startswith("arr[") and short.endswith("]"):
            types[key] = f"ARRAY[{_GGUF_TYPE_NAMES.get(short[4:-1], short[4:-1].upper())}]"
        else:
            types[key] = _GGUF_TYPE_NAMES.get(short, short.upper())
    return types
