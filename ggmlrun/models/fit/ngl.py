"""The -ngl search: the largest -ngl whose devices fit at a context (device memory only grows
with -ngl), a guess from the weight and KV bytes per layer confirmed by measuring it and the
-ngl above it, a miss narrowing a bracket that bisection finishes."""

from __future__ import annotations

from dataclasses import replace

from ggmlrun.models.fit.core import FitBackend, Prober, device_room, devices_fit, find_edge


def device_ngl(probe: Prober, ctx: int, n_max: int, costs: dict[int, int], *,
               fit_at: int = -1, miss_at: int | None = None,
               bisect: bool = False) -> int | None:
    """The largest ngl in [0, n_max] whose devices fit (the CPU is the caller's to check).
    `fit_at` / `miss_at`: an ngl known to fit / to miss on the devices at this context (a
    search over contexts knows them from its neighbours: devices only fill up as the context
    grows), which narrow the search; by default none and n_max, measured. `bisect`: halve the
    bracket each round instead of guessing from the bytes per layer, which mislead where the
    compute buffer, not the layers, decides (a context search's edge)."""
    if miss_at is None:
        rows = probe(n_max, ctx)
        if devices_fit(rows):
            return n_max
        miss_at, last = n_max, (n_max, rows)
    else:
        if miss_at - fit_at <= 1:
            return fit_at if fit_at >= 0 else None
        last = (miss_at, probe(miss_at, ctx)) if miss_at <= n_max else None
        if last is not None and devices_fit(last[1]):     # a hint that was not a miss here
            return device_ngl(probe, ctx, n_max, costs, bisect=bisect)
        if last is None:
            last = (n_max, probe(n_max, ctx))
    rows = last[1]
    kv = sum(r.kv_bytes + r.state_bytes for r in rows) / max(1, n_max - 1)

    def fits(ngl: int) -> bool:
        nonlocal last
        last = (ngl, probe(ngl, ctx))
        return devices_fit(last[1])

    # devices fit at fit_at (-1: a bound, none known) and miss at miss_at
    fit_lo = find_edge(fits, fit_at, miss_at,
                       (lambda _fit, _miss: None) if bisect else
                       (lambda _fit, _miss: ngl_guess(*last, costs, kv, n_max)))
    return above_the_edge(probe, ctx, n_max, fit_lo) if fit_lo >= 0 else None


def above_the_edge(probe: Prober, ctx: int, n_max: int, fit_lo: int) -> int:
    """The search assumes a device's total grows with -ngl. A hybrid model's layers differ (a
    delta-net layer: weights and a fixed state; an attention layer: a KV cache), so over two
    devices or more the split can hand one device a heavier layer at N than at N + 1, and an
    -ngl above the edge found may fit again. Those are tried from the top, each first against
    a bound that needs no reserve (a device's weights alone, placed as llama.cpp places them,
    already past its room rule it out), so the answer stays exact."""
    from ggmlrun.models.arch import get_arch
    from ggmlrun.models.memory.placement import place
    from ggmlrun.models.memory.buffers import weights_bytes

    model, backends = probe.model, probe.backends
    devices = [i for i, b in enumerate(backends) if b.kind != "cpu"]
    if len(devices) < 2 or not get_arch(model.arch).hybrid:
        return fit_lo
    for ngl in range(n_max - 1, fit_lo + 1, -1):
        if (ngl, ctx, probe.n_cpu_moe, probe.split) in probe.seen:
            if devices_fit(probe(ngl, ctx)):
                return ngl
            continue
        opts = replace(probe.opts, ngl=ngl, ctx=ctx)
        sizes = weights_bytes(model.tensors, place(model.hparams, model.tensors, backends, opts),
                              backends, no_mmap=opts.no_mmap).sizes
        if any(sizes[i] > backends[i].memory - probe.margins[i] for i in devices):
            continue
        if devices_fit(probe(ngl, ctx)):
            return ngl
    return fit_lo


def ngl_guess(ngl: int, rows: list[FitBackend], costs: dict[int, int], kv: float,
              n_max: int) -> int:
    """Move layers onto (or off) the devices until the room measured at `ngl` is used up.
    Going from ngl to ngl + 1 moves layer n_layer - ngl (layer n_layer is the output layer)."""
    n_layer = n_max - 1
    room = device_room(rows)

    def cost(il: int) -> float:
        return costs.get(il, 0) + (kv if il < n_layer else 0)

    while room >= 0 and ngl < n_max and room - cost(n_layer - ngl) >= 0:
        room -= cost(n_layer - ngl)
        ngl += 1
    while room < 0 and ngl > 0:
        room += cost(n_layer - ngl + 1)
        ngl -= 1
    return ngl
