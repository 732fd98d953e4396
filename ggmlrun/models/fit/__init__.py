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
on the CPU is too much do layers leave the devices (-ngl, with every expert on the CPU). Over
several devices without a -ts, the split of the layers is searched with N (moe_split.py): the
first N layers' experts are the first device's, so llama.cpp's split by memory can leave it
nearly empty while the last device decides N.

With `--ctx auto` the context is searched the same way (guesses from a model of the bytes: KV
exactly linear, the compute buffer flat and then growing; the edge always measured, fit/ctx.py),
after -ngl: like llama.cpp's own
`--fit`, layers come first down to a minimum context (4096), then the context grows as far as it
fits with those layers.

The searches live in their own modules: core (the figures, one reserve per placement, whether it
fits), ngl, moe, ctx, and advice (what to say when nothing fits).
"""

from __future__ import annotations

import time
from dataclasses import replace

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.models.options.command_line import llama_cpp_line, program
from ggmlrun.models.fit.advice import advice as nothing_fits_advice, pinned_advice
from ggmlrun.models.fit.core import (CTX_STEP, MIN_CTX, FitBackend, FitResult, Prober,
                                     all_fit, ctx_top, expert_costs, layer_costs)
from ggmlrun.models.fit.ctx import kv_bound, largest_ctx
from ggmlrun.models.fit.dense_split import dense_split_fit, longest_split_ctx
from ggmlrun.models.fit.moe import moe_device_fit
from ggmlrun.models.fit.ngl import device_ngl
from ggmlrun.models.fit.steps import one_more_step, steps_text
from ggmlrun.models.modelfile import ModelFile
from ggmlrun.models.options.params import ModelOptions, kv_size, kv_streams

__all__ = ["CTX_STEP", "MIN_CTX", "FitBackend", "FitResult", "Prober", "all_fit", "fit_model",
           "kv_bound", "layer_costs"]


def fit_model(model: ModelFile, backends: list[BackendSpec], opts: ModelOptions,
              margin_device: int, margin_cpu: int, ctx_auto: bool, *,
              min_ctx: int = MIN_CTX, margins: dict[str, int] | None = None,
              draft: ModelFile | None = None, ngl: int | None = None) -> FitResult:
    """`margins`: per backend name, over the device / CPU defaults (--margin GPU0=1GiB,...).
    `draft`: the draft model (-md), placed by -ngld and measured at each context beside the
    target, whose search then fits around it (every probe's rows hold both models).
    `ngl`: layers the user pinned (a llama.cpp command's -ngl, which llama.cpp's --fit leaves
    alone): no layer, expert or split search; whether it fits, and with `ctx_auto` the
    longest context it fits."""
    start = time.perf_counter()
    hp = model.hparams
    n_max = hp.n_layer_all + 1         # NextN layers count for -ngl
    margins = [(margins or {}).get(b.name, margin_cpu if b.kind == "cpu" else margin_device)
               for b in backends]
    probe = Prober(model, backends, opts, margins, draft)
    costs = layer_costs(model)
    top = ctx_top(hp.n_ctx_train)
    if ctx_auto:
        ctx = min(top, max(CTX_STEP, min_ctx // CTX_STEP * CTX_STEP))
    else:
        ctx = opts.ctx if opts.ctx is not None else min(hp.n_ctx_train, 4096)
    experts = expert_costs(model) if not opts.cpu_moe and ngl is None else {}
    pinned = ngl is not None
    if pinned:
        dev_ngl = min(ngl, n_max)
    elif experts:
        dev_ngl, probe = moe_device_fit(probe, ctx, n_max, costs, experts)
    else:
        dev_ngl = device_ngl(probe, ctx, n_max, costs)
        several = probe.split is None and sum(b.kind != "cpu" for b in backends) > 1
        if several and dev_ngl is not None:
            found = dense_split_fit(probe, ctx, n_max, costs, dev_ngl)
            if found is not None:
                dev_ngl, probe = found[0], probe.fixed(split=found[1])
    ngl = dev_ngl if dev_ngl is not None and all_fit(probe(dev_ngl, ctx)) else None
    if ngl is not None and ctx_auto:
        ctx = largest_ctx(probe, ngl, ctx, top)
        if probe.split is not None and probe.split != opts.tensor_split and not experts:
            longer = longest_split_ctx(probe, ngl, ctx, top, n_max, costs)
            if longer is not None:
                ctx, probe = longer[0], probe.fixed(split=longer[1])
        streams = kv_streams(opts)
        if streams > 1:
            # a KV stream per sequence: every context up to streams x its per-stream cells
            # has the same cache and graph, so the largest of them fits as this one does
            ctx = max(ctx, min(top, streams * kv_size(replace(opts, ctx=ctx), hp.n_ctx_train)))
    shown = ngl if ngl is not None else dev_ngl or 0
    if ngl is not None:
        advice = ""
    elif pinned:
        advice = pinned_advice(probe, ctx, dev_ngl, n_max, costs)
    else:
        advice = nothing_fits_advice(probe, ctx, dev_ngl, n_max, costs)
    rows, m = probe.full(shown, ctx, complete=True)
    short_of = (ngl is None or ngl < n_max or (probe.n_cpu_moe or 0) > opts.n_cpu_moe
                or (ctx_auto and ctx < top))
    steps = one_more_step(probe, shown, ctx) if short_of else []
    if advice and steps:
        advice += "; " + steps_text(steps)
    answer = replace(opts, n_cpu_moe=probe.n_cpu_moe, tensor_split=probe.split)
    command = llama_cpp_line(answer, backends, ngl=ngl, ctx=ctx) if ngl is not None else ""
    return FitResult(ngl=ngl, ctx=ctx, n_layer=hp.n_layer_all, shown_ngl=shown, backends=rows,
                     measure=m, probes=list(probe.order), advice=advice,
                     seconds=time.perf_counter() - start, command=command,
                     program=program(opts),
                     probe_moe=list(probe.order_moe),
                     probe_reserved=probe.order_reserved, probe_splits=probe.order_splits,
                     n_cpu_moe=probe.n_cpu_moe if experts or opts.n_cpu_moe else None,
                     steps=steps,
                     tensor_split=probe.split if probe.split != opts.tensor_split else None)
