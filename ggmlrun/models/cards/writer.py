"""A model card written from a GGUF header (`ggmlrun card MODEL -o FILE.yaml`), so the exact
description of a model travels without its weights.

The card's hyperparameters are the header's own metadata under the card's keys (cards/reader.py
HPARAMS and the architecture's card_hparams); `weights:` is the file type the header names
(`general.file_type`, llama.cpp's LLAMA_FTYPE), else the most common weight type; `types:`
then gives, per tensor class, the file's type wherever the mixture would pick another. The card
is written only if it reads back as the same model: the same hyperparameters and the same
tensors, each of the same shape and type. Anything a card cannot say (a type that differs
between layers of one class other than as the mixture varies it, an optional tensor the card's
architecture does not carry, a key outside the card's) is one error naming it.
"""

from __future__ import annotations

from collections import Counter

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import get_arch
from ggmlrun.models.cards.quant_mixture import MIXTURES
from ggmlrun.models.cards.reader import _CLASS_RE, HPARAMS
from ggmlrun.models.modelfile import ModelFile

# llama.cpp's LLAMA_FTYPE (llama.h) -> the card's `weights:` (the mixtures cards know)
FTYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1",
          14: "q4_K_S", 15: "q4_K_M", 16: "q5_K_S", 17: "q5_K_M", 18: "q6_K", 32: "bf16",
          38: "mxfp4_moe"}


def card_data(model: ModelFile) -> dict:
    """The card (as the YAML's data) that describes `model`, checked by reading it back."""
    if model.kv is None:
        raise InputError("a card is written from a GGUF header; this is a card already",
                         file=model.label)
    arch, kv = model.arch, model.kv
    keys = HPARAMS | get_arch(arch).card_hparams
    hparams = {}
    for card_key, (gguf_key, required, _) in keys.items():
        full = f"{arch}.{gguf_key}"
        if full in kv:
            value = kv[full]
            if not isinstance(value, (int, float, str, bool, list)):
                raise InputError(f"key '{full}' is an array of {len(value)} items, longer than "
                                 f"a card carries", file=model.label)
            hparams[card_key] = value
        elif required and hasattr(model.hparams, card_key):
            hparams[card_key] = getattr(model.hparams, card_key)
    data = {"architecture": arch, "name": model.name, "hparams": hparams,
            "weights": _weights(model)}
    if "output.weight" not in model.tensors:
        data["tied_embeddings"] = True
    for _ in range(2):                  # the mixture's choices, then the classes it misses
        card = _read_back(_render(data, model), model)
        wrong = [name for name, info in model.tensors.items()
                 if name in card.tensors and card.tensors[name].dtype != info.dtype]
        if not wrong:
            break
        types = dict(data.get("types", {}))
        for name in wrong:
            cls = _CLASS_RE.match(name).group(2)
            found = {info.dtype for t, info in model.tensors.items()
                     if _CLASS_RE.match(t).group(2) == cls}
            if len(found) > 1 or cls in types:
                kinds = ", ".join(sorted(found))
                raise InputError(f"tensor '{name}' is {model.tensors[name].dtype}, but the "
                                 f"{cls} tensors are of {len(found)} types ({kinds})"
                                 f" that the {data['weights']} mixture does not reproduce; a "
                                 f"card gives one type per tensor class", file=model.label)
            types[cls] = found.pop()
        data["types"] = types
    return data


def _weights(model: ModelFile) -> str:
    ftype = model.kv.get("general.file_type")
    if isinstance(ftype, int) and ftype in FTYPES:
        return FTYPES[ftype]
    counts = Counter(t.dtype for t in model.tensors.values() if len(t.shape) > 1)
    for dtype, _ in counts.most_common():
        if dtype in MIXTURES:
            return dtype
    return "f16"


def card_text(model: ModelFile) -> str:
    """The card's YAML, read back (as `fit CARD` reads it) and found to be the same model."""
    data = card_data(model)
    text = _render(data, model)
    _same_model(_read_back(text, model), model)
    return text


def _render(data: dict, model: ModelFile) -> str:
    import yaml

    return (f"# {model.name}: written by `ggmlrun card` from the header of {model.label}\n"
            + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100))


def _read_back(text: str, model: ModelFile) -> ModelFile:
    """The card's model, read from its text as a card file is (the reader takes files)."""
    import tempfile
    from pathlib import Path

    from ggmlrun.models.cards.reader import read_card

    with tempfile.TemporaryDirectory(prefix="ggmlrun-card-") as folder:
        path = Path(folder) / "card.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            return read_card(path)
        except InputError as err:
            raise InputError(f"the card format cannot describe this model: {err.message}",
                             file=model.label) from None


def _same_model(card: ModelFile, model: ModelFile) -> None:
    if card.hparams != model.hparams:
        diff = [k for k in vars(model.hparams) if getattr(card.hparams, k, None)
                != getattr(model.hparams, k)]
        raise InputError(f"the card format cannot carry this model's hyperparameters exactly "
                         f"({', '.join(diff[:4]) or 'their kind'} differ)", file=model.label)
    missing = [n for n in model.tensors if n not in card.tensors]
    extra = [n for n in card.tensors if n not in model.tensors]
    if missing or extra:
        which = (f"tensor '{missing[0]}', which the card's {model.arch} model does not carry"
                 if missing else f"no tensor '{extra[0]}', which a {model.arch} card carries")
        raise InputError(f"the card format cannot describe this model: it has {which}",
                         file=model.label)
    for name, info in model.tensors.items():
        other = card.tensors[name]
        if (other.shape, other.dtype) != (info.shape, info.dtype):
            raise InputError(f"tensor '{name}': the card gives {other.dtype} {list(other.shape)}, "
                             f"the file {info.dtype} {list(info.shape)}", file=model.label)
