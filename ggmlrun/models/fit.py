"""`fit`: the largest -ngl (and context) whose weights, KV cache and compute buffers fit.

Every answer is checked on llama.cpp's own figures (`measure_model`: the real graph, scheduled
and reserved as llama.cpp does it), but a reserve of an 80-layer graph is far too slow to try
every -ngl. So the search guesses first and measures only to confirm:

* device memory only grows with -ngl and the CPU's only shrinks, so the answer is the largest
  -ngl whose devices fit, provided the CPU fits there too (else nothing fits);
* weights per layer are known from the header, KV bytes per layer from one reserve, and the
  compute buffers barely move with -ngl, so a guess from the last reserve lands on or next to
  the answer;
* the guess is confirmed by measuring it and the -ngl above it (fits, does not fit), and a
  guess that misses narrows a bracket that bisection finishes, so the answer is exact whatever
  the guess was worth.

For a mixture of experts (a model with expert tensors) the devices first keep every layer and
give experts to the CPU: the smallest `--n-cpu-moe N` (the experts of layers 0..N-1 on the CPU,
llama.cpp's own rule) with which the devices fit at `-ngl all`, searched the same way (a guess
from the expert bytes per layer, confirmed by measuring N and N-1); only when even every expert
on the CPU is too much do layers leave the devices (-ngl, with every expert on the CPU).

With `--ctx auto` the context is searched the same way (KV and compute grow with it; a context
whose KV growth alone is too much is ruled out unmeasured), after -ngl: like llama.cpp's own `--fit`, layers come first down to a minimum context (4096), then
the context grows as far as it fits with those layers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.models.command_line import llama_cpp_line
from ggmlrun.models.modelfile import ModelFile
from ggmlrun.models.options import ModelOptions, kv_size, kv_streams
from ggmlrun.models.reserve import BackendFigures, ModelMeasure, measure_model

CTX_STEP = 256                    # llama.cpp pads the KV cache to 256 cells
MIN_CTX = 4096                    # llama.cpp's --fit-ctx default


@dataclass
class FitBackend(BackendFigures):
    """llama.cpp's figures for one backend, with the margin the fit keeps free on it."""
    margin_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_bytes + self.state_bytes + self.arena_bytes
                + self.output_bytes)

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
    seconds: float = 0.0
    advice: str = ""
    command: str = ""             # llama.cpp's options that reproduce the answer (command_line)
    n_cpu_moe: int | None = None  # a mixture of experts: the answer's --n-cpu-moe (else None)

    @property
    def fits(self) -> bool:
        return self.ngl is not None


class _Prober:
    """measure_model per (ngl, ctx), each measured once, as FitBackend rows."""

    def __init__(self, model, backends, opts, margins):
        self.model, self.backends, self.opts, self.margins = model, backends, opts, margins
        self.seen: dict[tuple[int, int, int], tuple[list[FitBackend], ModelMeasure]] = {}
        self.order: list[tuple[int, int]] = []
        self.order_moe: list[int] = []
        self.n_cpu_moe = opts.n_cpu_moe          # what (ngl, ctx) probes are measured with

    def __call__(self, ngl: int, ctx: int) -> list[FitBackend]:
        return self.full(ngl, ctx)[0]

    def full(self, ngl: int, ctx: int, n_cpu_moe: int | None = None):
        ncm = self.n_cpu_moe if n_cpu_moe is None else n_cpu_moe
        key = (ngl, ctx, ncm)
        if key not in self.seen:
            m = measure_model(self.model, self.backends,
                              replace(self.opts, ngl=ngl, ctx=ctx, n_cpu_moe=ncm))
            rows = [FitBackend(**vars(f), margin_bytes=margin)
                    for f, margin in zip(m.backends, self.margins)]
            self.seen[key] = (rows, m)
            self.order.append((ngl, ctx))
            self.order_moe.append(ncm)
        return self.seen[key]


def _devices_fit(rows: list[FitBackend]) -> bool:
    return all(r.fits for r in rows if r.kind != "cpu")


def _all_fit(rows: list[FitBackend]) -> bool:
    return all(r.fits for r in rows)


def _device_room(rows: list[FitBackend]) -> float:
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


def fit_model(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions,
              margin_device: int, margin_cpu: int, ctx_auto: bool, *,
              min_ctx: int = MIN_CTX, margins: dict[str, int] | None = None) -> FitResult:
    """`margins`: per backend name, over the device / CPU defaults (--margin GPU0=1GiB,...)."""
    start = time.perf_counter()
    hp = model.hparams
    n_max = hp.n_layer_all + 1         # NextN layers count for -ngl
    margins = [(margins or {}).get(b.name, margin_cpu if b.kind == "cpu" else margin_device)
               for b in backends]
    probe = _Prober(model, backends, opts, margins)
    costs = _layer_costs(model)
    ctx_top = _ctx_top(hp.n_ctx_train)
    if ctx_auto:
        ctx = min(ctx_top, max(CTX_STEP, min_ctx // CTX_STEP * CTX_STEP))
    else:
        ctx = opts.ctx if opts.ctx is not None else min(hp.n_ctx_train, 4096)
    experts = _expert_costs(model) if not opts.cpu_moe else {}
    if experts:
        device_ngl = _moe_device_fit(probe, ctx, n_max, costs, experts)
    else:
        device_ngl = _device_ngl(probe, ctx, n_max, costs)
    ngl = device_ngl if device_ngl is not None and _all_fit(probe(device_ngl, ctx)) else None
    if ngl is not None and ctx_auto:
        ctx = _largest_ctx(probe, ngl, ctx, ctx_top)
        streams = kv_streams(opts)
        if streams > 1:
            # a KV stream per sequence: every context up to streams x its per-stream cells
            # has the same cache and graph, so the largest of them fits as this one does
            from dataclasses import replace as _replace

            ctx = max(ctx, min(ctx_top, streams * kv_size(_replace(opts, ctx=ctx),
                                                          hp.n_ctx_train)))
    shown = ngl if ngl is not None else device_ngl or 0
    advice = "" if ngl is not None else _advice(probe, ctx, device_ngl, n_max, costs)
    rows, m = probe.full(shown, ctx)
    answer = replace(opts, n_cpu_moe=probe.n_cpu_moe)
    command = llama_cpp_line(answer, backends, ngl=ngl, ctx=ctx) if ngl is not None else ""
    return FitResult(ngl=ngl, ctx=ctx, n_layer=hp.n_layer_all, shown_ngl=shown, backends=rows,
                     measure=m, probes=list(probe.order), advice=advice,
                     seconds=time.perf_counter() - start, command=command,
                     probe_moe=list(probe.order_moe),
                     n_cpu_moe=probe.n_cpu_moe if experts or opts.n_cpu_moe else None)


def _expert_costs(model: ModelFile) -> dict[int, int]:
    """Bytes per layer of the tensors --n-cpu-moe moves (LLM_FFN_EXPS_REGEX); empty for a
    model without experts."""
    from ggmlrun.core.ir.types import TYPES
    from ggmlrun.models.options import LLM_FFN_EXPS_REGEX, compile_override

    rx = compile_override(LLM_FFN_EXPS_REGEX)
    sizes: dict[int, int] = {}
    for info in model.tensors.values():
        if info.name.startswith("blk.") and rx.search(info.name):
            layer = int(info.name.split(".")[1])
            sizes[layer] = sizes.get(layer, 0) + TYPES[info.dtype].row_bytes(math.prod(info.shape))
    return sizes


def _moe_device_fit(probe: _Prober, ctx: int, n_max: int, costs: dict[int, int],
                    experts: dict[int, int]) -> int | None:
    """Every layer on the devices and the fewest expert layers on the CPU (probe.n_cpu_moe
    set to it): the smallest N in [given, n_layer] whose devices fit at -ngl all. The devices
    only lose bytes as N grows (from N = 1 on: the first expert layer on the CPU may bring the
    op-offload copies of its experts into a device's compute buffer, which then stays), so a
    guess from the expert bytes per layer is confirmed by measuring N and N - 1, and a miss
    narrows a bracket. When every expert on the CPU is still too much, -ngl is searched with
    every expert on the CPU."""
    n_layer = n_max - 1
    lo = probe.n_cpu_moe
    rows = probe.full(n_max, ctx, lo)[0]
    if _devices_fit(rows):
        return n_max
    miss_lo, fit_hi = lo, None            # devices miss at miss_lo; fit at fit_hi (None: unknown)
    last = (lo, rows)
    while not (fit_hi is not None and fit_hi - miss_lo <= 1) and miss_lo < n_layer:
        top = fit_hi if fit_hi is not None else n_layer + 1     # no N at or past it to try
        guess = _moe_guess(*last, experts, n_layer)
        if not miss_lo < guess < top:
            guess = (miss_lo + top) // 2
        for n in (guess, guess - 1):
            if not miss_lo < n < (fit_hi if fit_hi is not None else n_layer + 1):
                continue
            rows = probe.full(n_max, ctx, n)[0]
            last = (n, rows)
            if _devices_fit(rows):
                fit_hi = n       # and confirm the edge below right away: usually the guess is it
            else:
                miss_lo = n
                break
    if fit_hi is not None:
        probe.n_cpu_moe = fit_hi
        return n_max
    probe.n_cpu_moe = n_layer            # every expert on the CPU, and fewer layers
    return _device_ngl(probe, ctx, n_max, costs)


def _moe_guess(n: int, rows: list[FitBackend], experts: dict[int, int], n_layer: int) -> int:
    """The N whose expert layers n, n+1, ... moved to the CPU cover what the devices lack at N
    = n (at least n + 1)."""
    room = _device_room(rows)
    while room < 0 and n < n_layer:
        room += experts.get(n, 0)
        n += 1
    return max(n, 1)


def _ctx_top(n_ctx_train: int) -> int:
    return max(CTX_STEP, n_ctx_train // CTX_STEP * CTX_STEP) if n_ctx_train >= CTX_STEP \
        else n_ctx_train


def _layer_costs(model: ModelFile) -> dict[int, int]:
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


def _device_ngl(probe: _Prober, ctx: int, n_max: int, costs: dict[int, int]) -> int | None:
    """The largest ngl in [0, n_max] whose devices fit (the CPU is the caller's to check)."""
    rows = probe(n_max, ctx)
    if _devices_fit(rows):
        return n_max
    kv = sum(r.kv_bytes + r.state_bytes for r in rows) / max(1, n_max - 1)
    fit_lo, miss_hi = -1, n_max          # devices fit at fit_lo (-1: none known), not at miss_hi
    last = (n_max, rows)
    while miss_hi - fit_lo > 1:
        guess = _guess(*last, costs, kv, n_max)
        if not fit_lo < guess < miss_hi:
            guess = (fit_lo + miss_hi) // 2
        for ngl in (guess, guess + 1 if guess > fit_lo and guess + 1 < miss_hi else None):
            if ngl is None or not fit_lo < ngl < miss_hi:
                continue
            rows = probe(ngl, ctx)
            last = (ngl, rows)
            if _devices_fit(rows):
                fit_lo = ngl     # and confirm the edge above right away: the guess is usually it
            else:
                miss_hi = ngl
                break
    return _above_the_edge(probe, ctx, n_max, fit_lo) if fit_lo >= 0 else None


def _above_the_edge(probe: _Prober, ctx: int, n_max: int, fit_lo: int) -> int:
    """The search assumes a device's total grows with -ngl. A hybrid model's layers differ (a
    delta-net layer: weights and a fixed state; an attention layer: a KV cache), so over two
    devices or more the split can hand one device a heavier layer at N than at N + 1, and an
    -ngl above the edge found may fit again. Those are tried from the top, each first against
    a bound that needs no reserve (a device's weights alone, placed as llama.cpp places them,
    already past its room rule it out), so the answer stays exact."""
    from ggmlrun.models.arch import get_arch
    from ggmlrun.models.placement import place
    from ggmlrun.models.reserve import weights_bytes

    model, backends = probe.model, probe.backends
    devices = [i for i, b in enumerate(backends) if b.kind != "cpu"]
    if len(devices) < 2 or not get_arch(model.arch).hybrid:
        return fit_lo
    for ngl in range(n_max - 1, fit_lo + 1, -1):
        if (ngl, ctx) in probe.seen:
            if _devices_fit(probe(ngl, ctx)):
                return ngl
            continue
        opts = replace(probe.opts, ngl=ngl, ctx=ctx)
        sizes = weights_bytes(model, place(model.hparams, model.tensors, backends, opts),
                              backends, no_mmap=opts.no_mmap).sizes
        if any(sizes[i] > backends[i].memory - probe.margins[i] for i in devices):
            continue
        if _devices_fit(probe(ngl, ctx)):
            return ngl
    return fit_lo


def _guess(ngl: int, rows: list[FitBackend], costs: dict[int, int], kv: float, n_max: int) -> int:
    """Move layers onto (or off) the devices until the room measured at `ngl` is used up.
    Going from ngl to ngl + 1 moves layer n_layer - ngl (layer n_layer is the output layer)."""
    n_layer = n_max - 1
    room = _device_room(rows)

    def cost(il: int) -> float:
        return costs.get(il, 0) + (kv if il < n_layer else 0)

    while room >= 0 and ngl < n_max and room - cost(n_layer - ngl) >= 0:
        room -= cost(n_layer - ngl)
        ngl += 1
    while room < 0 and ngl > 0:
        room += cost(n_layer - ngl + 1)
        ngl -= 1
    return ngl


def _largest_ctx(probe: _Prober, ngl: int, lo: int, top: int) -> int:
    """The largest context (a multiple of 256) in [lo, top] that fits with `ngl`; lo fits.

    A context is known to miss without a reserve when even its KV cache (exactly linear) on
    top of a smaller context's compute buffer (which only grows with the context) is too much.
    Otherwise the guess extrapolates the last two measurements linearly (with one, the compute
    buffer is taken as proportional to the context, which it nearly is), and after three
    guesses the bracket is bisected."""
    fit_lo, miss_hi = lo, top + CTX_STEP
    points = [(lo, probe(ngl, lo))]
    low_rows = points[0][1]
    while True:
        miss_hi = min(miss_hi, _kv_bound(low_rows, fit_lo, miss_hi) + CTX_STEP)
        if miss_hi - fit_lo <= CTX_STEP:
            return fit_lo
        if len(points) <= 3:
            guess = _ctx_guess(points[-2:])
        else:
            guess = (fit_lo + miss_hi) // 2
        guess = min(max(guess // CTX_STEP * CTX_STEP, fit_lo + CTX_STEP), miss_hi - CTX_STEP)
        here = probe(ngl, guess)
        points.append((guess, here))
        if _all_fit(here):
            fit_lo, low_rows = guess, here
        else:
            miss_hi = guess


def _kv_bound(rows: list[FitBackend], ctx: int, below: int) -> int:
    """The largest context ctx + k * CTX_STEP (k >= 0) under `below` that the KV growth alone
    from `ctx` leaves possible: for every backend, total + kv * (c - ctx) // ctx must stay
    within its memory less the margin. KV bytes are linear in the cells, so the edge is
    solved, not walked (a walk in steps of 256 up to a context of 2**32 is 16 million steps):
    floor(kv * d / ctx) <= room  <=>  kv * d <= (room + 1) * ctx - 1, for d = c - ctx."""
    steps = (below - 1 - ctx) // CTX_STEP          # the most steps that stay under `below`
    for r in rows:
        room = r.memory_bytes - r.margin_bytes - r.total_bytes
        if room < 0:
            return ctx
        if r.kv_linear > 0:   # an SWA cache grows less than in proportion: left out
            steps = min(steps, ((room + 1) * ctx - 1) // r.kv_linear // CTX_STEP)
    return ctx + max(steps, 0) * CTX_STEP


def _ctx_guess(points: list[tuple[int, list[FitBackend]]]) -> int:
    """Where the first backend runs out, extrapolating its total linearly in the context."""
    c1, rows1 = points[-1]
    reach = float("inf")
    for i, r1 in enumerate(rows1):
        if len(points) > 1:
            c0, r0 = points[-2][0], points[-2][1][i]
            slope = (r1.total_bytes - r0.total_bytes) / (c1 - c0)
        else:
            slope = (r1.kv_bytes + r1.arena_bytes) / c1
        if slope > 0:
            reach = min(reach, c1 + r1.free_bytes / slope)
    return int(min(reach, 2**40))


def _advice(probe: _Prober, ctx: int, device_ngl: int | None, n_max: int, costs) -> str:
    """Who is short at the nearest miss, by how much, and what would fit instead."""
    ngl = device_ngl or 0
    short = [r for r in probe(ngl, ctx) if not r.fits]
    where = (f"with -ngl {ngl}, the most the devices hold," if device_ngl is not None
             else "even with -ngl 0,")
    def has(r: FitBackend) -> str:
        left = r.memory_bytes - r.margin_bytes
        if left < 0:
            return (f"its memory, {human_bytes(r.memory_bytes)}, is less than the margin of "
                    f"{human_bytes(r.margin_bytes)}")
        return f"has {human_bytes(left)} after the margin"

    parts = [f"{r.name} needs {human_bytes(r.total_bytes)} (weights {human_bytes(r.weights_bytes)}"
             f" + KV {human_bytes(r.kv_bytes)}"
             + (f" + state {human_bytes(r.state_bytes)}" if r.state_bytes else "")
             + f" + compute {human_bytes(r.arena_bytes)}) but "
             f"{has(r)}" for r in short]
    message = f"nothing fits: {where} " + "; ".join(parts)
    top = (ctx - 1) // CTX_STEP * CTX_STEP        # contexts below the one asked, 256 apart
    top = min(top, _ctx_ceiling(probe.model, probe(ngl, ctx), ctx))
    if top >= CTX_STEP:
        best = _largest_fitting_ctx(probe, n_max, costs, top)
        if best is not None:
            best_ctx, best_ngl = best
            return (message + f"; the largest context that fits is --ctx {best_ctx}, with "
                    f"-ngl {best_ngl} (the most layers at that context)")
    need = ", ".join(f"{human_bytes(-r.free_bytes)} more on {r.name}" for r in short)
    return message + f"; it needs {need} (or a smaller --margin)"


def _ctx_ceiling(model: ModelFile, rows: list[FitBackend], ctx: int) -> int:
    """A context no -ngl can fit past: every weight is somewhere (the backends' weights add
    up to at least the header's tensor bytes), the KV cache is the same bytes per cell
    wherever it lives, and compute buffers are not negative; so the cells are at most the
    memory left over all backends after the weights and any recurrent state (its bytes do not
    depend on the context), over the KV bytes per cell."""
    from ggmlrun.core.ir.types import TYPES

    weights = sum(TYPES[t.dtype].row_bytes(math.prod(t.shape)) for t in model.tensors.values())
    cells = (ctx + CTX_STEP - 1) // CTX_STEP * CTX_STEP
    kv = sum(r.kv_linear for r in rows)   # an SWA cache stops growing: only the full ones
    room = (sum(r.memory_bytes - r.margin_bytes for r in rows) - weights
            - sum(r.state_bytes for r in rows))      # a recurrent state does not grow either
    if kv <= 0:
        return 2**63
    return max(0, room) * cells // kv // CTX_STEP * CTX_STEP


def _ngl_that_fits(probe: _Prober, ctx: int, n_max: int, costs) -> int | None:
    """The most layers with which everything fits at `ctx`, or None. The devices' largest
    -ngl is the only candidate: below it the CPU only holds more (so if the CPU is short
    there, it is short at every smaller -ngl)."""
    ngl = _device_ngl(probe, ctx, n_max, costs)
    return ngl if ngl is not None and _all_fit(probe(ngl, ctx)) else None


def _largest_fitting_ctx(probe: _Prober, n_max: int, costs, top: int) -> tuple[int, int] | None:
    """The largest context (a multiple of 256, at most `top`) at which some -ngl fits, and the
    most layers there. Whether anything fits only gets harder as the context grows (every
    total grows with it), so the edge is bisected over the multiples of 256."""
    lo = CTX_STEP
    lo_ngl = _ngl_that_fits(probe, lo, n_max, costs)
    if lo_ngl is None:
        return None
    hi = top + CTX_STEP                     # known (or taken) not to fit
    ngl_at_top = _ngl_that_fits(probe, top, n_max, costs) if top > lo else lo_ngl
    if ngl_at_top is not None:
        return top, ngl_at_top
    hi = top
    while hi - lo > CTX_STEP:
        mid = (lo + hi) // 2 // CTX_STEP * CTX_STEP
        ngl = _ngl_that_fits(probe, mid, n_max, costs)
        if ngl is None:
            hi = mid
        else:
            lo, lo_ngl = mid, ngl
    return lo, lo_ngl
