"""Hyperparameter checks, one set for GGUF metadata and model cards.

`check` applies the table of hparam_keys (each key's type and range) to one model's values
and returns them checked (per-layer arrays reduced to their one value), and `check_heads` the
rules between keys: heads dividing, head sizes positive, the rotary dimensions even and, for
llama, equal to the key head size ("invalid n_rot") and the value head size equal to the key
head size (a GGML_ASSERT in the graph). A GGUF file and a card with the same numbers pass or
fail alike, with the same words.
"""

from __future__ import annotations

import math
import struct

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.hparams.keys import F32_MAX, MAX_DIM, RULES, VOCAB_LIST, Rule

# architectures whose graph rotates the whole head (llama.cpp: n_rot == n_embd_head)
FULL_ROPE = ("llama", "qwen2", "qwen3", "mistral3", "qwen3moe", "qwen3vl", "qwen3vlmoe")
# architectures whose cached key and value differ in size (MLA: K is kv_lora_rank plus the
# rotated part, V the first kv_lora_rank values of the same row)
MLA_HEADS = ("deepseek2", "mistral4")

# Weight types a card may give a tensor: those ggmlrun has a kernel for (f32/f16/bf16 and the
# block types core/ir/types.decode_blocks decodes) and llama.cpp loads as weights. Not the
# vec_dot-only q8_1/q8_K, nor the integer and f64 types.
WEIGHT_TYPES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K",
                "q4_K", "q5_K", "q6_K", "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl",
                "iq3_s", "iq2_s", "iq4_xs", "iq1_m", "tq1_0", "tq2_0", "mxfp4", "nvfp4")


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
            one = Rule(rule.kind, 0 if rule.zero_layers else rule.lo, rule.hi, rule.lo_open,
                       False, False, rule.choices, rule.why, rule.or_zero)
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
    if n_head_kv < 1 or n_head % n_head_kv:
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


def check_rope_sections(sections: tuple, n_rot: int) -> tuple:
    """M-RoPE / IMROPE sections (the qwen35 family, qwen3vl) as ggml's multi-rope takes them:
    one of the first three counts positive (it asserts it and divides by their sum), and no
    more pairs than the rotated dimensions have."""
    if not any(sections[:3]):
        raise InputError(f"rope.dimension_sections {list(sections)}: one of the first "
                         f"three must be > 0 (ggml's multi-rope asserts it and divides by "
                         f"their sum)")
    if sum(sections) * 2 > n_rot:
        raise InputError(f"rope.dimension_sections {list(sections)} add up past "
                         f"rope.dimension_count / 2 = {n_rot // 2}")
    return sections


def check_experts(arch: str, n_expert: int, n_expert_used: int, n_ff: int, n_ff_exp: int,
                  *, derive_width: bool = True) -> int:
    """A mixture of experts' counts and width, as every MoE load_arch_hparams checks them:
    both counts positive, no more used than there are, and experts of a positive width
    (`n_ff_exp`, or with `derive_width` n_ff / n_expert_used where the file gives none).
    Returns the width."""
    if n_expert <= 0 or n_expert_used <= 0:
        raise InputError(f"{arch}.expert_count and {arch}.expert_used_count must be > 0 "
                         f"(got {n_expert} and {n_expert_used})")
    if n_expert_used > n_expert:
        raise InputError(f"{arch}.expert_used_count {n_expert_used} is more than "
                         f"expert_count {n_expert}")
    if not n_ff_exp and derive_width:
        n_ff_exp = n_ff // n_expert_used
    if n_ff_exp <= 0:
        how = (f" (no expert_feed_forward_length, and feed_forward_length {n_ff} // "
               f"expert_used_count {n_expert_used} is 0)" if derive_width else "")
        raise InputError(f"{arch}.expert_feed_forward_length must be > 0: the experts' "
                         f"feed-forward length must be positive{how}")
    return n_ff_exp
