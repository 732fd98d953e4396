"""Hyperparameter rules, one set for GGUF metadata and model cards.

Each key llama.cpp reads has a type and a range (`RULES`, keyed by the GGUF key without the
architecture prefix); `check` applies them to one model's values and returns them checked
(per-layer arrays reduced to their one value), and `check_heads` the rules between keys. A
GGUF file and a card with the same numbers pass or fail alike, with the same words.

As llama.cpp reads them (src/llama-model.cpp load_hparams, src/llama-model-loader.cpp
get_key / get_key_or_arr / get_arr):

- an integer key is a GGUF UINT32 (get_key checks the stored type exactly: an INT32, a
  FLOAT32 or a STRING `embedding_length` is "wrong type"); a float key is a FLOAT32, a string
  key a STRING;
- `feed_forward_length`, `attention.head_count` and `attention.head_count_kv` may instead be
  arrays of one UINT32/INT32/BOOL per layer (get_key_or_arr; length = block_count);
- `block_count` is 1..LLAMA_MAX_LAYERS (512), a GGML_ASSERT in load_hparams; the scaling type
  is one of llama.cpp's names (an assert too);
- for llama the rotary dimensions equal the key head size ("invalid n_rot") and the value head
  size equals the key head size (a GGML_ASSERT in the graph).

ggmlrun adds the ranges a kernel needs so that nothing unchecked reaches one: floats finite
and positive (a freq_base of 0 or NaN makes rope's angles NaN, and so the logits), eps small,
dimensions at most MAX_DIM (2**24, past every real model: with at most 512 layers every
tensor's and the whole model's byte count is then a 64-bit number, and a small card cannot ask
for millions of layers' bookkeeping), heads dividing, head sizes positive, the rotary
dimensions even; and, where a value is inverted or squared on the way to the logits (rope's
base and scaling factor, the softcap, the attention factor), a range whose results stay finite
in float32 (the fuzzer's denormal 1e-45 and 1e30 gave NaN logits with exit 0).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ggmlrun.core.util.errors import InputError

LLAMA_MAX_LAYERS = 512            # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024          # src/llama-hparams.h
MAX_DIM = 2**24                   # embedding, feed-forward, vocabulary, heads, head sizes
U32_MAX = 2**32 - 1               # llama.cpp's uint32_t fields (context length, -c, -ub)
F32_MAX = 3.4028234663852886e38
MAX_EPS = 1.0                     # an rms_norm eps past this is no longer "small"
# a factor whose inverse a kernel takes (rope's 1/scaling factor, the softcap's 1/cap): at
# least this, so the inverse and rope's angles at any uint32 position stay finite in float32
# (1e-45 made freq_scale infinite and the logits NaN)
MIN_INVERTED = 2.0**-20          # about 9.5e-7, exact in float32
# rope's attention factor multiplies cos and sin, so Q.K by its square: 1e30 overflowed
# float32 (NaN logits); YaRN's own, 0.1 ln(s) + 1, is under 10 for any float32 scale s
MAX_ATTN_FACTOR = 100.0
_BASE_WHY = ("a base under 1 makes rope's angles grow along the head, past float32 for a "
             "small one")
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")    # LLAMA_ROPE_SCALING_TYPES
# architectures whose graph rotates the whole head (llama.cpp: n_rot == n_embd_head)
FULL_ROPE = ("llama", "qwen2", "qwen3", "mistral3", "qwen3moe")
# architectures whose cached key and value differ in size (MLA: K is kv_lora_rank plus the
# rotated part, V the first kv_lora_rank values of the same row)
MLA_HEADS = ("deepseek2",)

# Weight types a card may give a tensor: those ggmlrun has a kernel for (f32/f16/bf16 and the
# block types core/ir/types.decode_blocks decodes) and llama.cpp loads as weights. Not the
# vec_dot-only q8_1/q8_K, nor the integer and f64 types.
WEIGHT_TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K",
                "q4_K", "q5_K", "q6_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl",
                "iq3_s", "iq2_s", "iq4_xs", "iq1_m", "tq1_0", "tq2_0", "mxfp4", "nvfp4")


@dataclass(frozen=True)
class Rule:
    kind: str                     # "u32", "f32", "str" or "bool": the GGUF type llama.cpp reads
    lo: float = 1                 # inclusive lower bound (u32), or exclusive when lo_open
    hi: float = MAX_DIM           # inclusive upper bound
    lo_open: bool = False         # floats: value > lo rather than >= lo
    per_layer: bool = False       # get_key_or_arr: a value, or one per layer
    keep_array: bool = False      # get_arr: an array kept as one flag per layer (a pattern)
    choices: tuple = ()           # strings: the accepted values
    why: str = ""                 # what the range is for, in a message
    or_zero: bool = False         # floats: 0 ("none") is accepted besides the range

    def range_text(self) -> str:
        if self.or_zero:
            return f"0 or a finite number >= {self.lo:g} and <= {self.hi:g}"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind == "bool":
            return "true or false"
        if self.kind == "u32":
            return f"an integer from {self.lo} to {self.hi}"
        low = f"> {self.lo:g}" if self.lo_open else f">= {self.lo:g}"
        return f"a finite number {low} and <= {self.hi:g}"


RULES: dict[str, Rule] = {
    "block_count": Rule("u32", 1, LLAMA_MAX_LAYERS, why="llama.cpp's LLAMA_MAX_LAYERS"),
    "context_length": Rule("u32", 1, U32_MAX),
    "embedding_length": Rule("u32"),
    "feed_forward_length": Rule("u32", per_layer=True),
    "attention.head_count": Rule("u32", per_layer=True),
    "attention.head_count_kv": Rule("u32", per_layer=True),
    "attention.key_length": Rule("u32"),
    "attention.value_length": Rule("u32"),
    "rope.dimension_count": Rule("u32"),
    "vocab_size": Rule("u32"),
    "rope.freq_base": Rule("f32", 1.0, F32_MAX, why=_BASE_WHY),
    "attention.layer_norm_rms_epsilon": Rule("f32", 0.0, MAX_EPS, lo_open=True),
    "rope.scaling.factor": Rule("f32", MIN_INVERTED, F32_MAX, or_zero=True,
                                why="0: no scaling; rope takes its inverse"),
    "rope.scaling.type": Rule("str", choices=ROPE_SCALING_TYPES),
    # read by llama.cpp though not used by ggmlrun's llama graph: a file llama.cpp refuses
    # (a wrong type, an expert count past LLAMA_MAX_EXPERTS) is refused here too
    "rope.scaling.finetuned": Rule("bool"),
    "rope.scaling.original_context_length": Rule("u32", 1, U32_MAX),
    "expert_count": Rule("u32", 0, LLAMA_MAX_EXPERTS, why="llama.cpp's LLAMA_MAX_EXPERTS"),
    # mixtures of experts (qwen3moe ...): experts used per token, an expert's FFN width
    "expert_used_count": Rule("u32", 0, LLAMA_MAX_EXPERTS, per_layer=True,
                              why="llama.cpp's LLAMA_MAX_EXPERTS"),
    "expert_feed_forward_length": Rule("u32", 0, per_layer=True),
    # qwen35moe: the shared expert's FFN width (0 or absent: feed_forward_length)
    "expert_shared_feed_forward_length": Rule("u32", 0),
    # glm4moe: shared experts, leading dense layers, routing weights, gating, NextN layers
    "expert_shared_count": Rule("u32", 0, LLAMA_MAX_EXPERTS),
    "leading_dense_block_count": Rule("u32", 0, LLAMA_MAX_LAYERS),
    "expert_weights_scale": Rule("f32", 0.0, F32_MAX),
    "expert_weights_norm": Rule("bool"),
    "expert_gating_func": Rule("u32", 0, 3, why="none, softmax, sigmoid, softmax_weight"),
    # rope scaling as llama_context derives it (every architecture), and keys some
    # architectures' load_arch_hparams read (mistral3: YaRN's betas and log multiplier,
    # Llama 4's attention temperature)
    "rope.scale_linear": Rule("f32", MIN_INVERTED, F32_MAX, or_zero=True,
                              why="the older key of rope.scaling.factor"),
    "rope.scaling.attn_factor": Rule("f32", 0.0, MAX_ATTN_FACTOR, lo_open=True,
                                     why="it scales Q.K by its square"),
    "rope.scaling.yarn_beta_fast": Rule("f32", 0.0, F32_MAX),
    "rope.scaling.yarn_beta_slow": Rule("f32", 0.0, F32_MAX),
    "rope.scaling.yarn_log_multiplier": Rule("f32", 0.0, F32_MAX),
    "attention.temperature_scale": Rule("f32", 0.0, F32_MAX, why="0: no temperature"),
    # sliding-window attention (gemma3): the window, which layers use it (a period n: layer il
    # slides unless il % n == n - 1; or one BOOL per layer), its own rope base; and the final
    # logits' softcap
    "attention.sliding_window": Rule("u32", 0, U32_MAX, why="0: no sliding window"),
    "attention.sliding_window_pattern": Rule("u32", 0, U32_MAX, per_layer=True, keep_array=True),
    "rope.freq_base_swa": Rule("f32", 1.0, F32_MAX, why=_BASE_WHY),
    "final_logit_softcapping": Rule("f32", MIN_INVERTED, F32_MAX, or_zero=True,
                                    why="0: none; the logits are divided by it"),
    # gemma4: the sliding layers' own head sizes and rotary dimensions, the layers that read
    # an earlier layer's cache, the per-layer embeddings' width
    "attention.key_length_swa": Rule("u32"),
    "attention.value_length_swa": Rule("u32"),
    "rope.dimension_count_swa": Rule("u32"),
    "attention.shared_kv_layers": Rule("u32", 0, LLAMA_MAX_LAYERS),
    "embedding_length_per_layer_input": Rule("u32", 0, MAX_DIM, why="0: none"),
    # recurrent (gated delta-net) layers of the hybrid qwen35 / qwen35moe
    "ssm.conv_kernel": Rule("u32", 2, 64),
    "ssm.inner_size": Rule("u32"),
    "ssm.state_size": Rule("u32"),
    "ssm.time_step_rank": Rule("u32"),
    "ssm.group_count": Rule("u32"),
    "full_attention_interval": Rule("u32", 1, LLAMA_MAX_LAYERS),
    "rope.dimension_sections": Rule("u32arr", 0, MAX_DIM, why="up to 4 section sizes"),
    "attention.recurrent_layers": Rule("boolarr", why="one per layer: recurrent or not"),
    "nextn_predict_layers": Rule("u32", 0, LLAMA_MAX_LAYERS, why="MTP / NextN blocks"),
    # deepseek2's multi-head latent attention: the low-rank Q (0: none, the lite variant) and
    # KV compressions, and the per-head sizes Q/K and V decompress to
    "attention.q_lora_rank": Rule("u32", 0, MAX_DIM, why="0: no Q compression"),
    "attention.kv_lora_rank": Rule("u32"),
    "attention.key_length_mla": Rule("u32"),
    "attention.value_length_mla": Rule("u32"),
}
VOCAB_LIST = "tokenizer.ggml.tokens"     # its length is the vocabulary when vocab_size is absent

_INT_TYPES = ("UINT32", "INT32", "BOOL")  # get_arr's accepted elements for a uint32 array
_GGUF_OF = {"u32": "UINT32", "f32": "FLOAT32", "str": "STRING", "bool": "BOOL",
            "u32arr": "ARRAY[INT32]", "boolarr": "ARRAY[BOOL]"}


class HParamError(InputError):
    """A hyperparameter out of its rule; `key` is the GGUF key (no architecture prefix) to
    blame, so a card can point at its own line."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _kind_of(value) -> str:
    """A value whose stored GGUF type is not known (a card's YAML), named for a message."""
    if isinstance(value, bool):
        return "a BOOL"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a FLOAT"
    if isinstance(value, str):
        return "a STRING"
    if isinstance(value, (list, tuple, range)):
        return "an ARRAY"
    return f"a {type(value).__name__}"


def _shown(value) -> str:
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


def as_f32(value) -> float | None:
    """The value as llama.cpp's float holds it; None when it is not a finite float32 (NaN,
    infinite, a string, or an integer too large: YAML reads 2**1100 as an int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > F32_MAX:
        return None
    value = float(value)
    if not math.isfinite(value) or abs(value) > F32_MAX:
        return None
    return struct.unpack("<f", struct.pack("<f", value))[0]


def _one(key: str, rule: Rule, value, gguf_type: str | None, name: str, n_layer: int | None):
    """One key's value, checked; a per-layer array reduced to its one value."""
    def wrong(what: str):
        per_layer = " (or an array of one per layer)" if rule.per_layer else ""
        return HParamError(key, f"{name} must be {rule.range_text()} (llama.cpp reads a "
                                f"{_GGUF_OF[rule.kind]}{per_layer}), got {what}")

    def out_of_range(shown: str):
        extra = f" ({rule.why})" if rule.why else ""
        return HParamError(key, f"{name} must be {rule.range_text()}{extra}, got {shown}")

    gguf_type = gguf_type or None
    if rule.kind == "boolarr":       # get_key_or_arr(key, arr, n_layer_all): one bool per layer
        items = list(value) if isinstance(value, (list, tuple)) else None
        if (items is None or not items or not all(isinstance(v, (bool, int)) and v in (0, 1)
                                                  for v in items)
                or n_layer is not None and len(items) != n_layer):
            raise HParamError(key, f"{name} must be an array of {n_layer or 'block_count'} "
                                   f"booleans, got {_shown(value)}")
        return tuple(bool(v) for v in items)
    if rule.kind == "u32arr":        # get_key_or_arr(key, arr, 4): up to 4 integers, zero-padded
        items = list(value) if isinstance(value, (list, tuple, range)) else [value]
        if not 1 <= len(items) <= 4 or any(isinstance(v, bool) or not isinstance(v, int)
                                           or not rule.lo <= v <= rule.hi for v in items):
            raise HParamError(key, f"{name} must be 1 to 4 integers from {rule.lo} to "
                                   f"{rule.hi}, got {_shown(value)}")
        return tuple(items) + (0,) * (4 - len(items))
    if isinstance(value, (list, tuple, range)) or (gguf_type or "").startswith("ARRAY"):
        elem = gguf_type[6:-1] if gguf_type and gguf_type.startswith("ARRAY[") else None
        if not rule.per_layer or (elem is not None and elem not in _INT_TYPES):
            raise wrong(f"an array{f' of {elem}' if elem else ''}")
        try:
            items = list(value)
        except TypeError:
            raise wrong(f"an array whose items were not read ({_shown(value)})") from None
        if n_layer is not None and len(items) != n_layer:
            raise HParamError(key, f"{name} has {len(items)} per-layer values but block_count "
                                   f"is {n_layer}")
        if not items:
            raise wrong("an empty array")
        if rule.keep_array:
            if any(isinstance(v, float) or not isinstance(v, (bool, int)) for v in items):
                raise wrong("an array holding a non-integer")
            return tuple(bool(v) for v in items)
        first = None
        for i, v in enumerate(items):
            if isinstance(v, bool) and elem == "BOOL":
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise wrong(f"an array holding {_kind_of(v)} {_shown(v)} (layer {i})")
            if not rule.lo <= v <= rule.hi:
                raise out_of_range(f"{_shown(v)} in layer {i}")
            first = v if first is None else first
            if v != first:
                raise HParamError(key, f"{name} differs between layers ({first} in layer 0, "
                                       f"{v} in layer {i}); ggmlrun builds every layer of a "
                                       f"llama model with one value")
        return first
    if gguf_type is not None and gguf_type != _GGUF_OF[rule.kind]:
        raise wrong(f"a {gguf_type} ({_shown(value)})")
    if rule.kind == "u32":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong(f"{_kind_of(value)} {_shown(value)}")
        if not rule.lo <= value <= rule.hi:
            raise out_of_range(_shown(value))
        return value
    if rule.kind == "f32":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong(f"{_kind_of(value)} {_shown(value)}")
        f = as_f32(value)
        if rule.or_zero and f == 0.0:
            return float(value)
        if f is None or not ((f > rule.lo) if rule.lo_open else (f >= rule.lo)) or f > rule.hi:
            raise out_of_range(_shown(value))
        return float(value)
    if rule.kind == "bool":
        if not isinstance(value, bool):
            raise wrong(f"{_kind_of(value)} {_shown(value)}")
        return value
    if not isinstance(value, str):
        raise wrong(f"{_kind_of(value)} {_shown(value)}")
    if rule.choices and value not in rule.choices:
        raise out_of_range(_shown(value))
    return value


def check(values: dict, *, prefix: str = "", types: dict | None = None,
          names: dict | None = None, per_layer: frozenset = frozenset()) -> dict:
    """`values`: key -> value for the keys present (GGUF keys; with `prefix`, e.g. "llama.",
    only keys under it are looked at and the prefix is dropped). `types`: full key -> GGUF
    type name as gguf.GGUFValueType names it ("UINT32", "FLOAT32", "STRING", "BOOL", and
    "ARRAY[INT32]" for an array of INT32) where the file says; without it a value's Python
    type stands for it (cards). A GGUF reader hands over the per-layer arrays' items (at most
    LLAMA_MAX_LAYERS) as a list. `names`: short key -> the name to use in messages (a card's
    own keys). `per_layer`: keys whose arrays may differ between layers (an architecture that
    builds each layer with its own value); they come back as a tuple, checked item by item.
    Returns short key -> checked value (other arrays reduced)."""
    types = types or {}
    names = names or {}
    out = {}
    order = ["block_count"] + [k for k in RULES if k != "block_count"]
    for key in order:
        full = prefix + key
        if full not in values:
            continue
        name = names.get(key, full)
        value, rule = values[full], RULES[key]
        if key in per_layer and isinstance(value, (list, tuple)):
            items = list(value)
            if len(items) != out.get("block_count", len(items)):
                raise HParamError(key, f"{name} has {len(items)} per-layer values but "
                                       f"block_count is {out.get('block_count')}")
            elem = (types.get(full) or "")[6:-1] or None
            one = Rule(rule.kind, rule.lo, rule.hi, rule.lo_open, False, False, rule.choices,
                       rule.why, rule.or_zero)
            out[key] = tuple(_one(key, one, int(v) if isinstance(v, bool) else v,
                                  None if elem in (None, "INT32", "BOOL") else elem,
                                  f"{name}[{i}]", None) for i, v in enumerate(items))
            continue
        out[key] = _one(key, rule, value, types.get(full), name, out.get("block_count"))
    return out


def check_vocab_list(length: int, name: str = VOCAB_LIST) -> int:
    """The vocabulary size taken from the token list's length (get_arr_n into a uint32)."""
    if not 1 <= length <= MAX_DIM:
        raise HParamError("vocab_size", f"{name} has {length} entries; a vocabulary is 1 to "
                                        f"{MAX_DIM} tokens")
    return length


def check_heads(arch: str, *, n_embd: int, n_head: int, n_head_kv: int, head_k: int,
                head_v: int, n_rot: int, names: dict | None = None, prefix: str = "") -> None:
    """The rules between keys, once defaults are filled in (head sizes default to
    n_embd / n_head, n_rot to the key head size)."""
    names = names or {}

    def name(key: str) -> str:
        return names.get(key, prefix + key)

    if head_k < 1 or head_v < 1:
        raise HParamError("attention.head_count",
                          f"{name('attention.head_count')} {n_head} is more than "
                          f"{name('embedding_length')} {n_embd}: the head size would be 0")
    if n_head % n_head_kv:
        raise HParamError("attention.head_count_kv",
                          f"{name('attention.head_count')} {n_head} is not a multiple of "
                          f"{name('attention.head_count_kv')} {n_head_kv}")
    for key, size in (("attention.key_length", head_k), ("attention.value_length", head_v)):
        if size * n_head > MAX_DIM:
            raise HParamError(key, f"{name(key)} {size} times {name('attention.head_count')} "
                                   f"{n_head} is {size * n_head}, more than {MAX_DIM}")
    if n_rot % 2 or n_rot > head_k:
        raise HParamError("rope.dimension_count",
                          f"{name('rope.dimension_count')} {n_rot} must be even and at most "
                          f"the head size {head_k}")
    if arch in FULL_ROPE:
        if n_rot != head_k:
            raise HParamError("rope.dimension_count",
                              f"{name('rope.dimension_count')} {n_rot} must equal the head "
                              f"size {head_k} for {arch} (llama.cpp: invalid n_rot, or its "
                              f"graph's assert)")
    # every other registered graph asserts n_embd_head_v == n_embd_head_k
    if head_v != head_k and arch not in MLA_HEADS:
        raise HParamError("attention.value_length",
                          f"{name('attention.value_length')} {head_v} must equal the key "
                          f"head size {head_k} for {arch}")


def check_weight_type(dtype, name: str) -> None:
    if dtype not in WEIGHT_TYPES:
        raise InputError(f"type {dtype!r} for {name} is not a weight type ggmlrun can compute "
                         f"with; weight types: {', '.join(WEIGHT_TYPES)}")
