"""The context search (`--ctx auto`): the largest multiple of 256 that fits with the layers
chosen: it fits, and 256 more cells were measured not to (or are past the training context).

Each guess is read off a model of every backend's bytes against the context, rebuilt from all
the reserves so far: the cells of the full caches are exactly linear in the context (their
bytes per cell are known from any reserve), and the rest (the compute buffer, an SWA cache up to
its window, a hybrid model's recurrent state) is taken not to shrink with it. The compute
buffer usually stays flat while the context is short and then grows with the attention scores
(n_kv x n_ubatch per head), so the rest is modelled as flat from the largest context known to
fit and, below a context known to miss, as a line down from it (its slope: backend_model);
without flash attention never below one layer's scores, which a backend holding KV makes
whole (attention_scores). The first guess is therefore the KV bound itself, or less where the
scores outgrow the buffer measured: when it fits it is the answer in one reserve. Guesses only narrow a bracket (the
largest context measured to fit, the smallest measured to miss), and after a few the bracket
is bisected, so the answer stays exact whatever the model is worth.

The KV bound is only a guess, never a proof that a context misses: the compute buffer does not
always grow with the context (llama-3-70b, -fa, -ngl 20: 339 MiB at 6144 cells, 315 MiB at
7680), and a bound taken from 6144 once ruled out 8192, which fits."""

from __future__ import annotations

from ggmlrun.models.fit.core import CTX_STEP, FitBackend, Prober, all_fit

GUESSES = 4                       # model guesses before the bracket is bisected


def largest_ctx(probe: Prober, ngl: int, lo: int, top: int) -> int:
    """The largest context (a multiple of 256) in [lo, top] that fits with `ngl`; lo fits."""
    fit_lo, miss_hi = lo, top + CTX_STEP
    points = {lo: probe(ngl, lo)}
    scores = attention_scores(probe)
    guesses = 0
    while miss_hi - fit_lo > CTX_STEP:
        if guesses < GUESSES:     # never past where the KV growth alone is too much
            guess = min(ctx_guess(points, fit_lo, miss_hi, scores),
                        kv_bound(points[fit_lo], fit_lo, miss_hi))
        else:
            guess = (fit_lo + miss_hi) // 2 // CTX_STEP * CTX_STEP
        guesses += 1
        guess = min(max(guess, fit_lo + CTX_STEP), miss_hi - CTX_STEP)
        here = points[guess] = probe(ngl, guess)
        if all_fit(here):
            fit_lo = guess
        else:
            miss_hi = guess
    return fit_lo


def kv_bound(rows: list[FitBackend], ctx: int, below: int) -> int:
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


def attention_scores(probe: Prober):
    """Bytes of one layer's attention scores at a context, without flash attention: KQ is
    n_kv x n_ubatch x n_head floats, made whole on the backend that holds the layer's KV, so
    that backend's compute buffer is at least that large. Past the context where the scores
    outgrow the rest of the buffer (the knee), the buffer grows with them:
    Qwen3-235B-A22B at 24 GiB, -ngl all, 83 expert layers on the CPU: 744 MiB flat up to about
    6,000 cells (the op-offloaded experts' copies), then 128 KiB a cell (64 heads x 512 tokens x
    4 bytes). None with flash attention (no KQ is made; -fa auto counted as on) or a KV
    stream per sequence."""
    from ggmlrun.models.options.params import kv_streams

    opts = probe.opts
    if opts.flash_attn is not False or kv_streams(opts) > 1:   # auto: FA where it can
        return None
    n_head = probe.model.hparams.n_head
    return lambda ctx: n_head * min(opts.ubatch, ctx) * ctx * 4


def ctx_guess(points: dict[int, list[FitBackend]], fit_lo: int, miss_hi: int,
              scores=None) -> int:
    """The largest context strictly inside the bracket that the model says fits (fit_lo +
    CTX_STEP when none does): the predicted free bytes only fall with the context, so the
    edge is bisected on the model, which costs no reserve."""
    lo, hi = fit_lo // CTX_STEP, (miss_hi - 1) // CTX_STEP
    n_backends = len(points[fit_lo])
    models = [backend_model(points, i, fit_lo, scores) for i in range(n_backends)]
    while hi > lo:
        mid = (lo + hi + 1) // 2
        if all(m(mid * CTX_STEP) for m in models):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_STEP


def backend_model(points: dict[int, list[FitBackend]], i: int, fit_lo: int, scores=None):
    """Whether backend i is predicted to fit at a context: linear KV exactly, the rest flat
    from fit_lo, or on a line down from the nearest miss above; never a compute buffer below
    one layer's attention scores (`scores(ctx)`, attention_scores) on a backend that holds
    KV. The line's slope: between two misses that both grew, their chord (the growth the
    scores give); from a fit that already grew past the smallest context, the chord to it;
    else the larger of that chord and the miss's compute buffer in proportion to its context
    (the chord from a flat fit is too shallow: the buffer grew only past some knee between
    them)."""
    base = points[fit_lo][i]
    per_cell = base.kv_linear / fit_lo
    room = base.memory_bytes - base.margin_bytes
    rest = {c: rows[i].total_bytes - rows[i].kv_linear for c, rows in points.items()}
    ctxs = sorted(points)
    first = ctxs[0]

    def slope_below(m: int) -> float:
        higher = [x for x in ctxs if x > m and rest[x] > rest[m]]
        if higher:
            return (rest[higher[0]] - rest[m]) / (higher[0] - m)
        chord = (rest[m] - rest[fit_lo]) / (m - fit_lo)
        if rest[fit_lo] > rest[first]:
            return chord
        return max(chord, points[m][i].arena_bytes / m)

    def fits(c: int) -> bool:
        above = [x for x in ctxs if x >= c]
        guess = rest[fit_lo]                           # flat from the largest fit
        if above and rest[above[0]] > rest[fit_lo]:
            m = above[0]
            guess = max(guess, rest[m] - slope_below(m) * (m - c))
        elif not above and len(ctxs) > 1:              # past every measurement: the last slope
            a, b = ctxs[-2], ctxs[-1]
            guess = max(guess, rest[b] + (rest[b] - rest[a]) / (b - a) * (c - b))
        if scores is not None and base.kv_linear:      # the buffer holds one KQ at least
            guess = max(guess, rest[fit_lo] - base.arena_bytes + scores(c))
        return guess + per_cell * c <= room
    return fits
