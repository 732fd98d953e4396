"""The --n-cpu-moe search: every layer on the devices and the fewest expert layers on the CPU
(llama.cpp's rule: the experts of layers 0..N-1), a guess from the expert bytes per layer
confirmed by measuring N and N - 1; with every expert on the CPU still too much, -ngl. Over
several devices (and no -ts given) the split is searched with N (moe_split.py)."""

from __future__ import annotations

from ggmlrun.models.fit.core import FitBackend, Prober, devices_fit, find_edge
from ggmlrun.models.fit.moe_split import moe_split_fit
from ggmlrun.models.fit.ngl import device_ngl

GUESSES = 4                       # model guesses before the bracket is bisected


def moe_device_fit(probe: Prober, ctx: int, n_max: int, costs: dict[int, int],
                    experts: dict[int, int]) -> tuple[int | None, Prober]:
    """Every layer on the devices and the fewest expert layers on the CPU, with the prober
    that measures with that N (and split) from then on: the smallest N in [given, n_layer] whose devices fit at -ngl all. The devices
    only lose bytes as N grows (from N = 1 on: the first expert layer on the CPU may bring the
    op-offload copies of its experts into a device's compute buffer, which then stays), so a
    guess from the expert bytes per layer is confirmed by measuring N and N - 1, and a miss
    narrows a bracket. When every expert on the CPU is still too much, -ngl is searched with
    every expert on the CPU."""
    n_layer = n_max - 1
    lo = probe.n_cpu_moe
    several = probe.split is None and sum(b.kind != "cpu" for b in probe.backends) > 1
    # one device: when its weights alone are too much, the guess needs no compute buffer (an
    # expert layer moves more bytes than the buffer changes); the split search calibrates on it
    rows = probe.full(n_max, ctx, lo, weights_decide=not several)[0]
    if devices_fit(rows):
        return n_max, probe
    if several:
        found = moe_split_fit(probe, ctx, n_max, costs, experts, lo, rows)
        if found is not None:
            return n_max, probe.fixed(n_cpu_moe=found[0], split=found[1])
        probe = probe.fixed(n_cpu_moe=n_layer)    # every expert on the CPU, and fewer layers
        return device_ngl(probe, ctx, n_max, without_experts(costs, experts)), probe
    holder = layer_devices(probe, n_max, lo)
    last, guesses = (lo, rows), 0
    nothing = n_layer + 1                 # a bound: no N fits (every expert on the CPU misses)

    def fits(n: int) -> bool:
        nonlocal last
        last = (n, probe.full(n_max, ctx, n)[0])
        return devices_fit(last[1])

    def guess(fit_hi: int, _miss_lo: int) -> int | None:
        nonlocal guesses
        guesses += 1
        if guesses > GUESSES:
            return None                   # bisect
        n = moe_guess(*last, experts, holder)
        # the model puts the edge at the fit we have: the N below it
        return fit_hi - 1 if fit_hi != nothing and n >= fit_hi else n

    fit_hi = find_edge(fits, nothing, lo, guess)
    if fit_hi != nothing:
        return n_max, probe.fixed(n_cpu_moe=fit_hi)
    probe = probe.fixed(n_cpu_moe=n_layer)        # every expert on the CPU, and fewer layers
    return device_ngl(probe, ctx, n_max, without_experts(costs, experts)), probe


def without_experts(costs: dict[int, int], experts: dict[int, int]) -> dict[int, int]:
    """What a layer moves once its experts are on the CPU anyway: the -ngl guess moving whole
    layers' bytes (DeepSeek-V3: 6 GB of experts a layer) stepped one layer a reserve (37
    reserves at 8 GiB)."""
    return {il: c - experts.get(il, 0) for il, c in costs.items()}


def layer_devices(probe: Prober, n_max: int, n_cpu_moe: int) -> list[int]:
    """The backend holding each layer at -ngl all with the prober's split: an expert layer
    moved to the CPU frees bytes on that device only."""
    from dataclasses import replace

    from ggmlrun.models.memory.placement import place

    opts = replace(probe.opts, ngl=n_max, n_cpu_moe=n_cpu_moe, tensor_split=probe.split)
    return place(probe.model.hparams, probe.model.tensors, probe.backends, opts).layer


def moe_guess(n: int, rows: list[FitBackend], experts: dict[int, int],
              holder: list[int]) -> int:
    """The smallest N the expert bytes per layer say fits, from the rows measured at N = n,
    layer by layer on the device that holds it: with devices short, the experts of layers n,
    n+1, ... go to the CPU until each is covered (at least n + 1; with a split given, the first
    layers' experts free the first device only, so a short last device waits for its own
    layers); with every device fitting, layers n-1, n-2, ... take theirs back while each
    still has room."""
    free = {i: r.free_bytes for i, r in enumerate(rows) if r.kind != "cpu"}
    need = {d: -f for d, f in free.items() if f < 0}
    if not need:
        while n > 1 and holder[n - 1] in free and free[holder[n - 1]] >= experts.get(n - 1, 0):
            free[holder[n - 1]] -= experts.get(n - 1, 0)
            n -= 1
        return n
    while need and n < len(holder):
        d = holder[n]
        if d in need:
            need[d] -= experts.get(n, 0)
            if need[d] <= 0:
                del need[d]
        n += 1
    return max(n, 1)
