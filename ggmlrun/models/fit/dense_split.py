"""-ngl over several devices without a -ts: the split of the layers is searched, as for a
mixture of experts (moe_split.py), and -ngl with it.

llama.cpp splits the offloaded layers by each device's memory, which leaves room unused on a
device whose fixed part (compute buffer, output layer) differs from the others': Llama-3-70B on
24 + 12 GiB holds 62 layers split 24:12, with 2 GiB of the first device free, while 66 fit
with a split of their own. The answer is the most layers some split holds, found with
moe_split's search: for a given -ngl a split that fits exists exactly when the greedy one fits
(each device, in order, the longest run of the offloaded layers it holds; the last the rest),
measured, and holding more layers only gets harder, so -ngl is bracketed between llama.cpp's
own answer (which fits with its split) and the first -ngl no split holds. The guesses come
from the bytes per layer, so a split that fits costs one reserve and a proof that none does
about two per device; after a few guesses the bracket is bisected, so the rounds stay
logarithmic whatever the model is worth. When no split holds more than llama.cpp's, its split
stays (no -ts).
"""

from __future__ import annotations

from dataclasses import replace

from ggmlrun.models.fit.core import Prober
from ggmlrun.models.fit.moe_split import _Search, _SplitModel, split_of

GUESSES = 3                       # model guesses of -ngl before the bracket is bisected


def dense_split_fit(probe: Prober, ctx: int, n_max: int, costs: dict[int, int],
                    fit_ngl: int) -> tuple[int, tuple[float, ...]] | None:
    """The most layers (more than `fit_ngl`, which llama.cpp's split holds) that some split
    holds at `ctx`, and that split (-ts, layers per device); None when none holds more."""
    from ggmlrun.models.memory.placement import place

    if fit_ngl >= n_max:
        return None
    devices = [i for i, b in enumerate(probe.backends) if b.kind != "cpu"]
    model = _SplitModel(costs, {}, n_max, devices)
    n = probe.n_cpu_moe
    # calibrate on llama.cpp's own split one layer past its answer (measured by its search)
    ngl = fit_ngl + 1
    placed = place(probe.model.hparams, probe.model.tensors, probe.backends,
                   replace(probe.opts, ngl=ngl, ctx=ctx, n_cpu_moe=n, tensor_split=None))
    layers = placed.layer + [placed.output]
    model.start = n_max - ngl
    ends = tuple(model.start + sum(1 for b in layers[model.start:] if b in devices[:d + 1])
                 for d in range(len(devices) - 1))
    model.learn(probe.full(ngl, ctx, n, None, complete=True)[0], ends, n)
    search = _Search(probe, ctx, n_max, model)
    fit_lo, miss_hi, answer, rounds = fit_ngl, n_max + 1, None, 0
    while miss_hi - fit_lo > 1:
        rounds += 1
        guess = fit_lo + 1 if rounds <= GUESSES else (fit_lo + miss_hi) // 2
        for g in range(miss_hi - 1, fit_lo, -1) if rounds <= GUESSES else ():
            model.start = n_max - g                   # the most layers the model says fit
            if model.greedy(n)[1]:
                guess = g
                break
        model.start = n_max - guess
        found = search.split(n)
        if found is not None:
            fit_lo, answer = guess, split_of(found, n_max, model.start)
        else:
            miss_hi = guess
    return None if answer is None else (fit_lo, answer)


def longest_split_ctx(probe: Prober, ngl: int, lo: int, top: int, n_max: int,
                      costs: dict[int, int]) -> tuple[int, tuple[float, ...]] | None:
    """With --ctx auto, the longest context (a multiple of 256 in (lo, top]) at which some
    split still holds `ngl` layers, and that split; None when none is longer than `lo`. The
    greedy split that holds the most layers fills the first device to the brim, so the
    context is searched with the split, not after it: whether a split holds them only gets
    harder as the context grows (every device's KV and compute buffer grow with it), so the
    edge is bisected over the multiples of 256, each step one split search."""
    from ggmlrun.models.fit.core import CTX_STEP, all_fit

    devices = [i for i, b in enumerate(probe.backends) if b.kind != "cpu"]
    n = probe.n_cpu_moe
    fit_lo, miss_hi, answer = lo, top + CTX_STEP, None
    while miss_hi - fit_lo > CTX_STEP:
        mid = (fit_lo + miss_hi) // 2 // CTX_STEP * CTX_STEP
        model = _SplitModel(costs, {}, n_max, devices)
        model.start = n_max - ngl
        placed = probe.full(ngl, fit_lo, n, probe.split, complete=True)[0]
        ends, acc = [], model.start
        for part in probe.split[:-1]:
            acc += int(part)
            ends.append(acc)
        model.learn(placed, tuple(ends), n)
        found = _Search(probe, mid, n_max, model).split(n)
        split = None if found is None else split_of(found, n_max, model.start)
        if split is not None and all_fit(probe.full(ngl, mid, n, split, complete=True)[0]):
            fit_lo, answer = mid, split
            probe = probe.fixed(split=split)
        else:
            miss_hi = mid
    return None if answer is None else (fit_lo, answer)
