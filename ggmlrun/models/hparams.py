"""A llama model's hyperparameters, read from GGUF metadata as llama.cpp's loader reads them.

Keys are `{arch}.{name}` (llama.cpp's LLM_KV names). Defaults are llama.cpp's where a key is
optional; a missing required key is an input error naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.util.errors import InputError


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

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv


def from_metadata(fields: dict, arch: str = "llama", types: dict | None = None) -> LlamaHParams:
    """`fields`: GGUF key -> plain value (ints, floats, strings, lists); `types`: GGUF key ->
    its stored GGUF type where known (`gguf_types`). Every value is checked against
    hparam_rules (types, ranges, the rules between keys) before it is used."""
    from ggmlrun.models import hparam_rules as rules

    prefix = f"{arch}."
    values = rules.check(fields, prefix=prefix, types=types)

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
        tokens = fields.get(rules.VOCAB_LIST)
        if tokens is None:
            raise InputError(f"GGUF metadata has neither '{arch}.vocab_size' nor "
                             f"'{rules.VOCAB_LIST}'; the vocabulary size is unknown")
        n_vocab = rules.check_vocab_list(len(tokens))
    n_head_kv = get("attention.head_count_kv", n_head)
    head_k = get("attention.key_length", 0) or n_embd // n_head
    head_v = get("attention.value_length", 0) or n_embd // n_head
    n_rot = get("rope.dimension_count", head_k)
    rules.check_heads(arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_k=head_k,
                      head_v=head_v, n_rot=n_rot, prefix=prefix)
    scale = 1.0
    factor = get("rope.scaling.factor", 0.0)
    scaling = get("rope.scaling.type", "linear")
    if scaling == "longrope" or (scaling == "yarn" and factor not in (0.0, 1.0)):
        # llama.cpp then rotates with YaRN's ramp or longrope's factors, which this builder
        # does not make: refused rather than computed differently
        raise InputError(f"{prefix}rope.scaling.type {scaling!r} (factor {factor:g}) is not "
                         f"built by ggmlrun's {arch} graph; supported: none, linear, and yarn "
                         f"with factor 1")
    if factor and scaling == "linear":
        scale = 1.0 / factor
    return LlamaHParams(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        n_ff=get("feed_forward_length"), n_vocab=n_vocab,
        n_ctx_train=get("context_length"), n_rot=n_rot,
        rope_freq_base=get("rope.freq_base", 10000.0), rope_freq_scale=scale,
        norm_rms_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
        n_embd_head_k=head_k, n_embd_head_v=head_v)


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


def llama_tensor_shapes(hp: LlamaHParams) -> dict[str, tuple[int, ...]]:
    """Every tensor llama.cpp loads for a llama model, NumPy order (ggml's ne reversed).
    `output.weight` is listed; a file without it ties the output to `token_embd.weight`."""
    shapes = {"token_embd.weight": (hp.n_vocab, hp.n_embd),
              "output_norm.weight": (hp.n_embd,),
              "output.weight": (hp.n_vocab, hp.n_embd)}
    q, kv = hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa
    for i in range(hp.n_layer):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (hp.n_embd,),
                       p + "attn_q.weight": (q, hp.n_embd),
                       p + "attn_k.weight": (kv, hp.n_embd),
                       p + "attn_v.weight": (hp.n_embd_v_gqa, hp.n_embd),
                       p + "attn_output.weight": (hp.n_embd, hp.n_embd_head_v * hp.n_head),
                       p + "ffn_norm.weight": (hp.n_embd,),
                       p + "ffn_gate.weight": (hp.n_ff, hp.n_embd),
                       p + "ffn_up.weight": (hp.n_ff, hp.n_embd),
                       p + "ffn_down.weight": (hp.n_embd, hp.n_ff)})
    return shapes
