"""When nothing fits: who is short at the nearest miss, by how much, and the largest context
at which some -ngl would fit instead."""

from __future__ import annotations

import math

from ggmlrun.core.util.fmt import human_bytes
from ggmlrun.models.fit.core import CTX_STEP, FitBackend, Prober, all_fit
from ggmlrun.models.fit.ngl import device_ngl
from ggmlrun.models.modelfile import ModelFile


def advice(probe: Prober, ctx: int, dev_ngl: int | None, n_max: int, costs) -> str:
    """Who is short at the nearest miss, by how much, and what would fit instead."""
    ngl = dev_ngl or 0
    short = [r for r in probe(ngl, ctx, complete=True) if not r.fits]
    where = (f"with -ngl {ngl}, the most the devices hold," if dev_ngl is not None
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
             + f" + compute {human_bytes(r.arena_bytes)}"
             + (f" + projector {human_bytes(r.mmproj_bytes)}" if r.mmproj_bytes else "")
             + ") but "
             f"{has(r)}" for r in short]
    message = f"nothing fits: {where} " + "; ".join(parts)
    top = (ctx - 1) // CTX_STEP * CTX_STEP        # contexts below the one asked, 256 apart
    top = min(top, ctx_ceiling(probe.model, probe(ngl, ctx), ctx))
    if top >= CTX_STEP:
        best = largest_fitting_ctx(probe, n_max, costs, top)
        if best is not None:
            best_ctx, best_ngl = best
            return (message + f"; the largest context that fits is --ctx {best_ctx}, with "
                    f"-ngl {best_ngl} (the most layers at that context)")
    need = ", ".join(f"{human_bytes(-r.free_bytes)} more on {r.name}" for r in short)
    # a smaller margin helps only where one is kept (the host keeps none by default)
    margin = " (or a smaller --margin)" if any(r.margin_bytes > 0 for r in short) else ""
    return message + f"; it needs {need}{margin}"


def pinned_advice(probe: Prober, ctx: int, ngl: int, n_max: int, costs) -> str:
    """-ngl given (a llama.cpp command's, which llama.cpp's --fit leaves alone) and short:
    who is short and by how much, and the most layers that fit at this context instead."""
    short = [r for r in probe(ngl, ctx, complete=True) if not r.fits]
    parts = [f"{human_bytes(-r.free_bytes)} more on {r.name}" for r in short]
    message = f"-ngl {ngl} does not fit at -c {ctx}: it needs " + ", ".join(parts)
    best = ngl_that_fits(probe, ctx, n_max, costs)
    if best is not None and best != ngl:
        return message + f"; -ngl {best} fits (the most layers at that context)"
    return message


def ctx_ceiling(model: ModelFile, rows: list[FitBackend], ctx: int) -> int:
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


def ngl_that_fits(probe: Prober, ctx: int, n_max: int, costs, known=None) -> int | None:
    """The most layers with which everything fits at `ctx`, or None. The devices' largest
    -ngl is the only candidate: below it the CPU only holds more (so if the CPU is short
    there, it is short at every smaller -ngl). `known`: context -> the devices' largest -ngl
    found there, shared across calls: the devices only fill up as the context grows, so the
    nearest smaller context's answer + 1 is a miss here and the nearest larger one's a fit,
    and near the edge the search is a probe or two instead of one over every -ngl."""
    hint = {}
    if known:
        below = [c for c in known if c < ctx]
        above = [c for c in known if c > ctx and known[c] is not None]
        if below and known[max(below)] is not None:
            hint["miss_at"] = known[max(below)] + 1 if known[max(below)] < n_max else None
        if above:
            hint["fit_at"] = known[min(above)]
    if hint.get("miss_at") is None:
        hint.pop("miss_at", None)
    ngl = device_ngl(probe, ctx, n_max, costs, bisect=known is not None, **hint)
    if known is not None:
        known[ctx] = ngl
    return ngl if ngl is not None and all_fit(probe(ngl, ctx)) else None


def largest_fitting_ctx(probe: Prober, n_max: int, costs, top: int) -> tuple[int, int] | None:
    """The largest context (a multiple of 256, at most `top`) at which some -ngl fits, and the
    most layers there. Whether anything fits only gets harder as the context grows (every
    total grows with it), so the edge is bisected over the multiples of 256."""
    lo = CTX_STEP
    known: dict[int, int | None] = {}
    lo_ngl = ngl_that_fits(probe, lo, n_max, costs, known)
    if lo_ngl is None:
        return None
    hi = top + CTX_STEP                     # known (or taken) not to fit
    ngl_at_top = ngl_that_fits(probe, top, n_max, costs, known) if top > lo else lo_ngl
    if ngl_at_top is not None:
        return top, ngl_at_top
    hi = top
    while hi - lo > CTX_STEP:
        mid = (lo + hi) // 2 // CTX_STEP * CTX_STEP
        ngl = ngl_that_fits(probe, mid, n_max, costs, known)
        if ngl is None:
            hi = mid
        else:
            lo, lo_ngl = mid, ngl
    return lo, lo_ngl
