"""Model cards: a model described in a few lines of YAML, for models not downloaded yet.

`measure` and `fit` need only a model's header: its hyperparameters and every tensor's shape
and type. A card gives the hyperparameters and the weight type the way users name a file
(`Q4_K_M`); the per-tensor types are then the ones llama.cpp's quantizer picks for that
mixture (src/llama-quant.cpp of the reference llama.cpp; quant_mixture), so the bytes match
the real file:

    architecture: llama
    name: Meta-Llama-3-8B Q4_K_M
    hparams: {n_layer: 32, n_embd: 4096, n_head: 32, n_head_kv: 8, n_ff: 14336,
              n_vocab: 128256, n_ctx_train: 8192, rope_freq_base: 500000}
    weights: q4_K_M           # a llama.cpp file type (ftype): f16, q8_0, q4_K_M, ...
    types: {output: q8_0}     # optional: a type per tensor class, over the mixture's choice

Card tensors carry no data (`offset` None): a card can be measured and fitted, not run.
"""

from __future__ import annotations

import re
from pathlib import Path

from ggmlrun.core.frontend.yamlfile import describe_value, read_yaml, shown, unknown_keys
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import did_you_mean
from ggmlrun.models.arch import ARCHITECTURES, get_arch
from ggmlrun.models.hparams.rules import WEIGHT_TYPES
from ggmlrun.models.modelfile import ModelFile, TensorInfo
from ggmlrun.models.cards.quant_mixture import ATTN_V_LIKE, MIXTURES, fit_row, mixture_type

CARDS_DIR = Path(__file__).parent       # the bundled cards live beside their reader
TOP_KEYS = ("architecture", "name", "hparams", "weights", "types", "tied_embeddings")

# card key -> (GGUF metadata key under the architecture, required, default)
HPARAMS = {
    "n_layer": ("block_count", True, None),
    "n_embd": ("embedding_length", True, None),
    "n_head": ("attention.head_count", True, None),
    "n_head_kv": ("attention.head_count_kv", False, None),     # default: n_head (no GQA)
    "n_ff": ("feed_forward_length", True, None),
    "n_vocab": ("vocab_size", True, None),
    "n_ctx_train": ("context_length", True, None),
    "n_rot": ("rope.dimension_count", False, None),            # default: the head size
    "n_embd_head_k": ("attention.key_length", False, None),    # default: n_embd / n_head
    "n_embd_head_v": ("attention.value_length", False, None),  # default: n_embd_head_k
    "rope_freq_base": ("rope.freq_base", False, 10000.0),
    "norm_rms_eps": ("attention.layer_norm_rms_epsilon", False, 1e-5),
    "rope_scaling": ("rope.scaling.type", False, None),        # none | linear | yarn | longrope
    "rope_scaling_factor": ("rope.scaling.factor", False, None),
    "n_ctx_orig": ("rope.scaling.original_context_length", False, None),
    "rope_attn_factor": ("rope.scaling.attn_factor", False, None),
}

TENSOR_CLASSES = ("token_embd", "output_norm", "output", "attn_norm", "attn_q", "attn_k",
                  "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
                  "attn_q_norm", "attn_k_norm",
                  # mixtures of experts: the router and the experts (one tensor per layer each)
                  "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                  # the hybrid qwen35's delta-net layers
                  "attn_qkv", "attn_gate", "post_attention_norm", "ssm_out", "ssm_alpha",
                  "ssm_beta",
                  # gpt-oss's attention sinks
                  "attn_sinks")
_LAYER_RE = re.compile(r"\Ablk\.\d+\.")
# the class and layer of a tensor name; LLM_TENSOR_SSM_A_NOSCAN ("blk.N.ssm_a") has no suffix;
# glm4moe's NextN tensors have a dot in the class ("nextn.eh_proj")
_CLASS_RE = re.compile(r"(?:blk\.(\d+)\.)?([a-z_][a-z0-9_.]*?)(?:\.(weight|bias))?\Z")
_BY_LOWER = {k.lower(): k for k in MIXTURES}     # `weights:` in any case (Q4_K_M, q4_k_m)


def is_card(data) -> bool:
    return isinstance(data, dict) and "architecture" in data


def read_card(path: Path) -> ModelFile:
    data, doc = read_yaml(path)
    return card_model(data, doc, Path(path))


def bundled_cards() -> list[Path]:
    return sorted(CARDS_DIR.glob("*.yaml"))


def card_model(data, doc, path: Path | None) -> ModelFile:
    """A checked card as a ModelFile whose tensors have llama.cpp's shapes and types."""
    if not is_card(data):
        raise doc.error("a model card is a mapping with 'architecture:', 'hparams:' and 'weights:'")
    unknown_keys(doc, data, TOP_KEYS, (), None, "top-level key")
    arch = data["architecture"]
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise doc.error(f"architecture {shown(arch)} is not supported; "
                        f"{did_you_mean(str(arch), ARCHITECTURES)}", ("architecture",))
    name = data.get("name", path.stem if path else "card")
    if not isinstance(name, str) or not name.strip() or "\n" in name:
        raise doc.error(f"name must be a one-line string, got {describe_value(name)}", ("name",))
    for key in ("hparams", "weights"):
        if key not in data:
            raise doc.error(f"missing '{key}:'")
    spec = get_arch(arch)
    keys = HPARAMS | spec.card_hparams          # the architecture's own keys too
    values = _hparams(doc, data["hparams"], keys, arch)
    tied = data.get("tied_embeddings", False)
    if not isinstance(tied, bool):
        raise doc.error(f"tied_embeddings must be true or false, got {describe_value(tied)}",
                        ("tied_embeddings",))
    ftype = _ftype(doc, data["weights"])
    overrides = _type_overrides(doc, data.get("types", {}))
    hparams = _build_hparams(doc, arch, values, keys)
    is_70b = spec.is_70b(hparams)
    kept = {}
    for tname, tspec in spec.tensors(hparams).items():
        carried = (_LAYER_RE.sub("", tname) in spec.card_tensors
                   or spec.card_tensor is not None and spec.card_tensor(tname, hparams)
                   or tname.startswith("rope_factors") and hparams.rope_scaling == "longrope"
                   # required unless its alternative is there (Q/K/V unless a fused attn_qkv)
                   or isinstance(tspec.required, str) and tspec.required not in kept)
        if tspec.required is not True and (tied and tname == "output.weight" or not carried):
            continue      # optional: only those the real files of the architecture have
        kept[tname] = tspec
    # llama-quant.cpp counts attn_v-like tensors (category_is_attn_v: attn_v and a fused or
    # delta-net attn_qkv; i_attention_wv of n_attention_wv), which is the layer index only
    # where every layer has one
    n_attn_v = sum(1 for t in kept if _CLASS_RE.match(t).group(2) in ATTN_V_LIKE)
    i_attn_v = 0
    tensors = {}
    one_d, applied = set(), set()          # classes seen only 1-D / an override applied to
    for tname, tspec in kept.items():
        shape = tspec.shape
        match = _CLASS_RE.match(tname)
        cls, layer = match.group(2), int(match.group(1) or 0)
        count = values["n_layer"]
        if cls in ATTN_V_LIKE:
            layer, count, i_attn_v = i_attn_v, n_attn_v, i_attn_v + 1
        if len(shape) == 1 or match.group(3) == "bias":   # the quantizer takes only 2-D+
            dtype = "f32"                                  # "*weight" tensors (gpt-oss's
            one_d.add(cls)                                 # expert biases stay f32)
        else:
            applied.add(cls)
            dtype = overrides.get(cls) or mixture_type(ftype, cls, layer, count, is_70b=is_70b,
                                                       n_expert=hparams.n_expert)
        if tied and cls == "token_embd" and "token_embd" not in overrides:
            applied.add("output")       # the tied embedding is quantized as the output
            dtype = overrides.get("output") or mixture_type(ftype, "output", 0, values["n_layer"],
                                                            is_70b=is_70b)
        tensors[tname] = TensorInfo(name=tname, shape=tuple(shape), dtype=fit_row(dtype, shape[-1]),
                                    offset=None)
    for cls in overrides:
        if cls not in applied:      # never silently dropped (llama.cpp's quantizer ignores it)
            why = ("its tensors are 1-D, which llama.cpp's quantizer never converts (they stay "
                   "f32)" if cls in one_d else f"a {arch} card with these hyperparameters has "
                   f"no such tensor")
            raise doc.error(f"types: {cls}: {why}; remove it", ("types", cls))
    return ModelFile(path=path, arch=arch, name=name, hparams=hparams, tensors=tensors)


def _hparams(doc, raw, keys: dict = HPARAMS, arch: str = "llama") -> dict:
    """The card's hyperparameters (the common ones and the architecture's own, `keys`), checked
    by the same rules as a GGUF file's metadata (hparam_rules), each error at the line of the
    key it blames."""
    from ggmlrun.models.hparams import rules

    path = ("hparams",)
    if not isinstance(raw, dict):
        raise doc.error(f"hparams must be a mapping, got {describe_value(raw)}", path)
    unknown_keys(doc, raw, tuple(keys), path, None, "hyperparameter")
    for key, (_, required, _) in keys.items():
        if required and key not in raw:
            raise doc.error(f"missing hyperparameter '{key}'", path)
    card_key = {gguf: key for key, (gguf, _, _) in keys.items()}
    per_layer = get_arch(arch).per_layer if arch in ARCHITECTURES else frozenset()
    try:
        checked = rules.check({keys[k][0]: v for k, v in raw.items()}, names=card_key,
                              per_layer=per_layer)
    except rules.HParamError as err:
        raise doc.error(err.message, path + (card_key[err.key],)) from None
    values = {key: checked.get(gguf, default) for key, (gguf, _, default) in keys.items()}
    arrays = {key: v for key, v in values.items() if isinstance(v, tuple)
              and keys[key][0] in per_layer}          # per-layer values: layer 0's for checks
    values.update((key, v[0]) for key, v in arrays.items())
    if values["n_head_kv"] is None:
        values["n_head_kv"] = values["n_head"]
    if values["n_embd_head_k"] is None and values["n_embd"] % values["n_head"]:
        raise doc.error(f"n_embd {values['n_embd']} is not a multiple of n_head {values['n_head']}",
                        path + ("n_embd",))
    if values["n_embd_head_v"] is None:
        values["n_embd_head_v"] = values["n_embd_head_k"]     # a card: V heads as K's
    head = values["n_embd_head_k"] or values["n_embd"] // values["n_head"]
    head_v = values["n_embd_head_v"] or head
    if values["n_rot"] is None:
        values["n_rot"] = head
    try:
        rules.check_heads(arch, n_embd=values["n_embd"], n_head=values["n_head"],
                          n_head_kv=values["n_head_kv"], head_k=head, head_v=head_v,
                          n_rot=values["n_rot"], names=card_key)
    except rules.HParamError as err:
        raise doc.error(err.message, path + (card_key.get(err.key, "n_head"),)) from None
    values.update(arrays)
    return values


def _build_hparams(doc, arch: str, values: dict, keys: dict = HPARAMS):
    """Through the GGUF metadata path, so a card and a file with the same numbers agree."""
    from ggmlrun.core.util.errors import InputError
    from ggmlrun.models.arch import from_metadata

    fields = {"general.architecture": arch}
    for key, (gguf_key, _, _) in keys.items():
        value = values[key]
        if value is None:
            continue
        fields[f"{arch}.{gguf_key}"] = value
    try:
        return from_metadata(fields, arch)
    except InputError as err:
        raise doc.error(err.message, ("hparams",)) from None


def _ftype(doc, raw) -> str:
    if not isinstance(raw, str) or raw.lower() not in _BY_LOWER:
        raise doc.error(f"weights {shown(raw)} is not a file type this tool knows; "
                        f"{did_you_mean(str(raw), MIXTURES)}", ("weights",))
    return _BY_LOWER[raw.lower()]


def _type_overrides(doc, raw) -> dict[str, str]:
    path = ("types",)
    if not isinstance(raw, dict):
        raise doc.error(f"types must be a mapping of tensor class to type, got "
                        f"{describe_value(raw)}", path)
    unknown_keys(doc, raw, TENSOR_CLASSES, path, None, "tensor class")
    for cls, dtype in raw.items():
        if not isinstance(dtype, str) or dtype not in TYPES:
            raise doc.error(f"unknown type {shown(dtype)} for {cls}; "
                            f"{did_you_mean(str(dtype), TYPES)}", path + (cls,))
        if dtype not in WEIGHT_TYPES:
            raise doc.error(f"type {shown(dtype)} for {cls} is not a weight type (llama.cpp "
                            f"loads no weights of it, and ggmlrun has no kernel for it); "
                            f"{did_you_mean(str(dtype), WEIGHT_TYPES)}", path + (cls,))
    return dict(raw)
