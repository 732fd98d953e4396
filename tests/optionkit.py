"""Random model options drawn from the option table, for the tests that state a claim over
many option sets (tests/test_option_table.py, tests/test_api.py)."""

from __future__ import annotations

from pathlib import Path

from ggmlrun.models.options.params import I32_MAX
from ggmlrun.models.options.kinds import (Choice, Count, Devices, Layers, ModelName, OnOff,
                                          Overrides, Split, Switch)
from ggmlrun.models.options.table import OPTIONS

DRAFT = Path(__file__).resolve().parent.parent / "examples" / "models" / "tiny-llama-q8_0.gguf"
# a draft's options (-ngld, -cd, -ctkd, -ctvd) are refused without a draft (-md)
DRAFT_ONLY = ("ngl_draft", "ctx_draft", "type_k_draft", "type_v_draft", "devices_draft")
PATTERNS = (r"ffn_.*", r"blk\.1\..*", r"blk\.(0|2)\.ffn_(up|down)", r"attn_[qkv]\.weight$",
            r"output", r"token_embd")
MMPROJS = tuple(str(p) for p in sorted(
    (Path(__file__).parent / "data" / "llamacpp").glob("tiny-mmproj-*.gguf")))
SMALL = {"ctx": (1, 4096), "ubatch": (1, 1024), "ngl": (0, 40), "n_cpu_moe": (0, 8),
         "parallel": (1, 6)}


def draw(rng, option, backends: tuple[str, ...], devices: int, big: bool):
    """One value of `option`, as Python or as the command line's text; `big`: anywhere in the
    table's range (for the line), else small enough to measure quickly."""
    kind = option.kind
    if isinstance(kind, Switch):
        return rng.random() < 0.5
    if isinstance(kind, OnOff):
        return rng.choice([True, False, "on", "off"])
    if isinstance(kind, Choice):
        return rng.choice(kind.values)
    if isinstance(kind, Layers):
        lo, hi = (0, I32_MAX) if big else SMALL["ngl"]
        return rng.choice([None, "all", lo, rng.randint(lo, hi), str(rng.randint(lo, hi))])
    if isinstance(kind, Count):
        lo, hi = (kind.lo, kind.hi) if big else SMALL.get(option.name, (kind.lo, 4))
        return rng.choice([lo, hi, rng.randint(lo, hi), rng.randint(lo, min(hi, lo + 600))])
    if isinstance(kind, Split):
        parts = [rng.choice([0, 1, 2, 3, 5, 24, 0.3, 0.7, 1e-3]) for _ in range(devices)]
        parts[rng.randrange(devices)] = rng.randint(1, 9)
        return rng.choice([tuple(parts), ",".join(str(p) for p in parts)])
    if isinstance(kind, Overrides):
        return [(rng.choice(PATTERNS), rng.choice(backends)) if rng.random() < 0.5
                else f"{rng.choice(PATTERNS)}={rng.choice(backends)}"
                for _ in range(rng.randint(1, 3))]
    if isinstance(kind, Devices):       # some of the devices in any order, or none
        names = list(backends[:-1])
        rng.shuffle(names)
        chosen = names[:rng.randint(0, len(names))]
        return rng.choice([tuple(chosen), ",".join(chosen) or "none"])
    if isinstance(kind, ModelName):     # by option: --mmproj a tiny projector, -md a draft
        if option.name == "mmproj":     # every tiny model's vocabulary matches
            return rng.choice(MMPROJS)
        return str(DRAFT)
    raise AssertionError(f"no drawing for {option.name}")  # a new kind needs a case here


def random_options(rng, *, backends=("SIM0", "CPU"), big=False, skip=()) -> dict:
    """Some of the table's options (each with probability one half), by name."""
    devices = len(backends) - 1
    out = {o.name: draw(rng, o, backends, devices, big) for o in OPTIONS
           if o.field and o.name not in skip and rng.random() < 0.5}
    if "model_draft" not in out:
        out = {k: v for k, v in out.items() if k not in DRAFT_ONLY}
    return out
