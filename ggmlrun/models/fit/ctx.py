"""The context search (`--ctx auto`): the largest multiple of 256 that fits with the layers
chosen; a context whose KV growth alone is too much is ruled out unmeasured."""

from __future__ import annotations

from ggmlrun.models.fit.core import CTX_STEP, FitBackend, Prober, all_fit


def largest_ctx(probe: Prober, ngl: int, lo: int, top: int) -> int:
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
        miss_hi = min(miss_hi, kv_bound(low_rows, fit_lo, miss_hi) + CTX_STEP)
        if miss_hi - fit_lo <= CTX_STEP:
            return fit_lo
        if len(points) <= 3:
            guess = ctx_guess(points[-2:])
        else:
            guess = (fit_lo + miss_hi) // 2
        guess = min(max(guess // CTX_STEP * CTX_STEP, fit_lo + CTX_STEP), miss_hi - CTX_STEP)
        here = probe(ngl, guess)
        points.append((guess, here))
        if all_fit(here):
            fit_lo, low_rows = guess, here
        else:
            miss_hi = guess


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


def ctx_guess(points: list[tuple[int, list[FitBackend]]]) -> int:
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
