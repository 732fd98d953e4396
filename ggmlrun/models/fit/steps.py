"""One more step: when fit's answer leaves layers (or experts) on the CPU, cannot reach the
context asked, or nothing fits, what a single change of the user's options would free, each
measured exactly at the answer's placement (a reserve per step, never an estimate), and only
the steps that free something: flash attention on (when off), a q8_0 KV cache (-ctk q8_0
-ctv q8_0, which needs flash attention, and a head size its 32-value blocks divide), and one
sequence (--parallel 1) when the context serves several. What is freed is counted where it
is wanted: on the backends short of memory when nothing fits, else on the devices (the CPU
when there are none)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.fit.core import FitBackend, Prober
from ggmlrun.models.options.params import seq_max

SMALLER_KV = "q8_0"
LARGER_THAN_Q8 = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class Step:
    option: str          # the llama.cpp words to add (-fa on, -ctk q8_0 -ctv q8_0 -fa on)
    saves_bytes: int     # freed on the backends it is counted on (module docstring)
    where: tuple[str, ...]


def candidates(opts) -> list[tuple[str, dict]]:
    """The single changes that could free memory, given the options as they are."""
    out = []
    fa_on = opts.flash_attn is True
    if not fa_on:
        out.append(("-fa on", {"flash_attn": True}))
    if opts.type_k in LARGER_THAN_Q8 or opts.type_v in LARGER_THAN_Q8:
        words = f"-ctk {SMALLER_KV} -ctv {SMALLER_KV}" + ("" if fa_on else " -fa on")
        out.append((words, {"flash_attn": True, "type_k": SMALLER_KV, "type_v": SMALLER_KV}))
    if seq_max(opts) > 1:
        out.append(("-np 1", {"parallel": 1}))
    return out


def one_more_step(probe: Prober, ngl: int, ctx: int) -> list[Step]:
    """Each candidate step measured at (ngl, ctx) with the prober's experts and split."""
    rows = probe.full(ngl, ctx, complete=True)[0]
    short = [i for i, r in enumerate(rows) if not r.fits]
    devices = [i for i, r in enumerate(rows) if r.kind != "cpu"]
    counted = short or devices or [len(rows) - 1]
    steps = []
    for words, change in candidates(probe.opts):
        other = Prober(probe.model, probe.backends, replace(probe.opts, **change), probe.margins,
                       probe.draft)
        try:
            after = other.full(ngl, ctx, probe.n_cpu_moe, probe.split, complete=True)[0]
        except InputError:           # llama.cpp refuses it for this model (a head size)
            continue
        saved = sum(_total(rows[i]) - _total(after[i]) for i in counted)
        if saved > 0:
            steps.append(Step(words, saved, tuple(rows[i].name for i in counted)))
    return steps


def _total(r: FitBackend) -> int:
    return r.total_bytes


def steps_text(steps: list[Step]) -> str:
    """`one more step: -fa on frees 1.20 GiB on GPU0+GPU1; -np 1 frees ...` ('' for none)."""
    from ggmlrun.core.util.fmt import human_bytes

    if not steps:
        return ""
    return "one more step: " + "; ".join(
        f"{s.option} frees {human_bytes(s.saves_bytes)} on {'+'.join(s.where)}" for s in steps)
