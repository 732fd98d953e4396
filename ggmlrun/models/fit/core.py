"""What every search of `fit` shares: llama.cpp's figures per backend with the margin kept
free on it, one reserve per placement (measured once), whether a placement fits, and the bytes
per layer the searches' guesses move."""

from __future__ import annotations

import copy

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ggmlrun.models.draft import add_figures, measure_draft, with_draft
from ggmlrun.models.modelfile import ModelFile
from ggmlrun.models.reserve import BackendFigures, ModelMeasure, measure_model

CTX_STEP = 256                    # llama.cpp pads the KV cache to 256 cells
MIN_CTX = 4096                    # llama.cpp's --fit-ctx default
SAME = object()                   # Prober.full: the split the prober holds


@dataclass
class FitBackend(BackendFigures):
    """llama.cpp's figures for one backend, with the margin the fit keeps free on it."""
    margin_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_bytes + self.state_bytes + self.arena_bytes
                + self.output_bytes + self.mmproj_bytes)

    @property
    def free_bytes(self) -> int:
        """What is left of the memory after the total and the margin (negative: short)."""
        return self.memory_bytes - self.margin_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return self.free_bytes >= 0


@dataclass
class FitResult:
    ngl: int | None               # None: nothing fits
    ctx: int
    n_layer: int
    shown_ngl: int                # the -ngl of `backends`: the answer, or the nearest miss
    backends: list[FitBackend]
    measure: ModelMeasure | None
    probes: list[tuple[int, int]] = field(default_factory=list)   # (ngl, ctx) measured
    probe_moe: list[int] = field(default_factory=list)   # each probe's --n-cpu-moe
    # each probe's reserve: "pp+tg" (whole), "pp" or "none" (the devices already short)
    probe_reserved: list[str] = field(default_factory=list)
    probe_splits: list = field(default_factory=list)    # each probe's -ts (None: llama.cpp's)
    seconds: float = 0.0
    advice: str = ""
    command: str = ""             # llama.cpp's options that reproduce the answer (command_line)
    program: str = "llama-server" # whose defaults the line leaves out (--for): llama-server, llama-cli
    n_cpu_moe: int | None = None  # a mixture of experts: the answer's --n-cpu-moe (else None)
    # the layer split fit chose over several devices (layers per device: -ts); None: llama.cpp's
    # default (by memory) or the one given
    tensor_split: tuple[float, ...] | None = None
    # with a draft (-md): the answer of the same search without it (what keeping it costs)
    without_draft: FitResult | None = None
    # what one more change of the options frees (fit/steps.py's Step), where the answer
    # leaves layers on the CPU, falls short of the context or nothing fits
    steps: list = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.ngl is not None


class Prober:
    """measure_model per placement (ngl, ctx, --n-cpu-moe, tensor split), each measured once,
    as FitBackend rows. `n_cpu_moe` and `split` are what a probe that names neither uses; a
    search that settles them hands on `fixed(...)`, a prober sharing the same measures, and
    never changes the one its caller holds.

    A placement whose pp graph alone already leaves a device short is not reserved further
    (the tg graph can only grow the buffers): whether the devices, or all backends, fit has its
    answer, no. Such rows are lower bounds: a device short there is short, one that fits may
    not (a question about one device completes the reserve: moe_split); good for guesses.
    `weights_decide`: not even the pp graph when the weights and KV alone leave a device short
    (rows without a compute buffer: only where the next guess does not need one).
    `complete=True` asks for the whole reserve (what is shown to the user)."""

    def __init__(self, model, backends, opts, margins, draft=None):
        self.model, self.backends, self.opts, self.margins = model, backends, opts, margins
        # (ngl, ctx, n_cpu_moe, split) -> rows and measure, in the order first measured
        self.seen: dict[tuple, tuple[list[FitBackend], ModelMeasure]] = {}
        # the draft model (-md): placed by its own -ngld, so measured once per context and
        # split (what its options follow of the target's) and added to every probe's rows
        self.draft = draft
        self.draft_seen: dict[tuple, ModelMeasure] = {}
        self.n_cpu_moe = opts.n_cpu_moe          # what (ngl, ctx) probes are measured with
        self.split = opts.tensor_split

    def fixed(self, n_cpu_moe: int | None = None, split=SAME) -> Prober:
        """This prober's measures, with probes that name neither measured at `n_cpu_moe`
        and `split` (None / SAME: as here)."""
        other = copy.copy(self)          # shallow: `seen` is shared
        other.n_cpu_moe = self.n_cpu_moe if n_cpu_moe is None else n_cpu_moe
        other.split = self.split if split is SAME else split
        return other

    def __call__(self, ngl: int, ctx: int, complete: bool = False) -> list[FitBackend]:
        return self.full(ngl, ctx, complete=complete)[0]

    def full(self, ngl: int, ctx: int, n_cpu_moe: int | None = None, split=SAME,
             complete: bool = False, weights_decide: bool = False):
        ncm = self.n_cpu_moe if n_cpu_moe is None else n_cpu_moe
        split = self.split if split is SAME else split
        key = (ngl, ctx, ncm, split)
        known = self.seen.get(key)
        if known is None or (complete and known[1].partial):
            draft = self._draft(ctx, split)
            both = (lambda figures: add_figures(figures, draft.backends)) if draft else \
                (lambda figures: figures)
            m = measure_model(self.model, self.backends,
                              replace(self.opts, ngl=ngl, ctx=ctx, n_cpu_moe=ncm,
                                      tensor_split=split),
                              enough=None if complete else
                              lambda figures, reserved: ((weights_decide or reserved != "none")
                                                         and self._a_device_short(both(figures))))
            m = with_draft(m, draft) if draft else m
            self.seen[key] = known = (self._rows(m.backends), m)
        return known

    def _draft(self, ctx: int, split) -> ModelMeasure | None:
        if self.draft is None:
            return None
        key = (ctx, split)
        if key not in self.draft_seen:
            opts = replace(self.opts, ctx=ctx, tensor_split=split)
            self.draft_seen[key] = measure_draft(self.draft, self.backends, opts,
                                                 self.model.hparams)
        return self.draft_seen[key]

    @property
    def order(self) -> list[tuple[int, int]]:
        """(ngl, ctx) of every placement measured, in order."""
        return [(ngl, ctx) for ngl, ctx, _, _ in self.seen]

    @property
    def order_moe(self) -> list[int]:
        return [ncm for _, _, ncm, _ in self.seen]

    @property
    def order_splits(self) -> list:
        return [split for _, _, _, split in self.seen]

    @property
    def order_reserved(self) -> list[str]:
        """How far each placement's reserve went (ModelMeasure.reserved)."""
        return [m.reserved for _, m in self.seen.values()]

    def _rows(self, figures) -> list[FitBackend]:
        return [FitBackend(**vars(f), margin_bytes=margin)
                for f, margin in zip(figures, self.margins)]

    def _a_device_short(self, figures) -> bool:
        return any(not r.fits for r in self._rows(figures) if r.kind != "cpu")


def find_edge(fits: Callable[[int], bool], fit_at: int, miss_at: int,
              guess: Callable[[int, int], int | None]) -> int:
    """The edge of a question that holds on one side of it (more layers miss, fewer experts on
    the CPU miss): the x that fits next to one that misses, both measured unless a bound of
    the range (a bound is never measured). Each round measures the guess (`guess(fit_at,
    miss_at)`, None or outside the bracket: the middle) and, when it fits, the x next to it on
    the miss side right away, since a good guess is usually the edge itself; a miss narrows
    the bracket. Exact whatever the guesses are worth."""
    step = 1 if miss_at > fit_at else -1          # from the fit side toward the miss side
    while abs(miss_at - fit_at) > 1:
        lo, hi = min(fit_at, miss_at), max(fit_at, miss_at)
        x = guess(fit_at, miss_at)
        if x is None or not lo < x < hi:
            x = (lo + hi) // 2
        for y in (x, x + step):
            if not min(fit_at, miss_at) < y < max(fit_at, miss_at):
                continue
            if fits(y):
                fit_at = y
            else:
                miss_at = y
                break
    return fit_at


def devices_fit(rows: list[FitBackend]) -> bool:
    return all(r.fits for r in rows if r.kind != "cpu")


def all_fit(rows: list[FitBackend]) -> bool:
    return all(r.fits for r in rows)


def device_room(rows: list[FitBackend]) -> float:
    """Bytes of layers the devices can still take (negative: must give back). Layers are
    shared among devices, so a device holding share s of them runs out after free / s bytes;
    the first to run out decides."""
    devices = [r for r in rows if r.kind != "cpu"]
    held = [r.weights_bytes + r.kv_bytes + r.state_bytes for r in devices]
    total = sum(held)
    if total == 0:
        return min((r.free_bytes * len(devices) for r in devices), default=0)
    room = [r.free_bytes / (h / total) for r, h in zip(devices, held) if h]
    short = [r.free_bytes for r, h in zip(devices, held) if not h and r.free_bytes < 0]
    return min(room + [f * len(devices) for f in short])


def ctx_top(n_ctx_train: int) -> int:
    return max(CTX_STEP, n_ctx_train // CTX_STEP * CTX_STEP) if n_ctx_train >= CTX_STEP \
        else n_ctx_train


def layer_costs(model: ModelFile) -> dict[int, int]:
    """Weight bytes per layer from the header (the output layer as layer n_layer): what the
    guess moves between the CPU and the devices."""
    from ggmlrun.core.ir.types import TYPES

    n_layer = model.hparams.n_layer_all
    sizes: dict[int, int] = {}
    for info in model.tensors.values():
        if info.name.startswith("blk."):
            layer = int(info.name.split(".")[1])
            if layer >= model.hparams.n_layer:
                continue                   # a NextN layer: never loaded
        elif info.name.startswith("output"):
            layer = n_layer
        else:
            continue
        sizes[layer] = sizes.get(layer, 0) + TYPES[info.dtype].row_bytes(math.prod(info.shape))
    return sizes


def expert_costs(model: ModelFile) -> dict[int, int]:
    """Bytes per layer of the tensors --n-cpu-moe moves (LLM_FFN_EXPS_REGEX); empty for a
    model without experts."""
    from ggmlrun.core.ir.types import TYPES
    from ggmlrun.models.options.params import LLM_FFN_EXPS_REGEX, compile_override

    rx = compile_override(LLM_FFN_EXPS_REGEX)
    sizes: dict[int, int] = {}
    for info in model.tensors.values():
        if info.name.startswith("blk.") and rx.search(info.name):
            layer = int(info.name.split(".")[1])
            sizes[layer] = sizes.get(layer, 0) + TYPES[info.dtype].row_bytes(math.prod(info.shape))
    return sizes
