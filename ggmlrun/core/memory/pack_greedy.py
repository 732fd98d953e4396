"""The greedy placements of the offline planner: buffers placed one by one, in several
orderings, each in the first (or tightest) gap among the neighbours already placed. Cheap
(O(n * live)), good enough for the arena planner's easy graphs, and the upper bound that the
exact search (pack_search) starts from.
"""

from __future__ import annotations

import numpy as np

from ggmlrun.core.memory.intervals import columns, neighbours
from ggmlrun.core.util.fmt import align_up


def greedy_pass(order, size, nbrs, alignment=1, best_fit=False):
    """Place buffers one by one in `order`, each in a free gap among its placed neighbours.

    Cost is O(sum of neighbour counts * log), i.e. O(n * live) for the arena planner's graphs;
    the loop is written flat because it is the whole cost of the greedy-only path.
    """
    n = len(size)
    off = [-1] * n
    top = [0] * n
    peak = 0
    for i in order:
        s = size[i]
        spans = [(off[j], top[j]) for j in nbrs[i] if off[j] >= 0]
        o = 0
        if spans:
            spans.sort()
            o = _first_fit(spans, s, alignment) if not best_fit else _best_fit(spans, s, alignment)
        off[i] = o
        top[i] = o + s
        peak = max(peak, o + s)
    return off, peak


def _first_fit(spans, size, alignment):
    """Lowest aligned offset with `size` free bytes below the next occupied span."""
    cursor = 0
    for start, stop in spans:
        if start - cursor >= size:
            return cursor
        if stop > cursor:
            cursor = stop if alignment == 1 else align_up(stop, alignment)
    return cursor


def _best_fit(spans, size, alignment):
    """The gap that fits `size` most tightly (least slack), else the top of the pile."""
    cursor = 0
    best, best_slack = -1, -1
    for start, stop in spans:
        slack = start - cursor - size
        if slack >= 0 and (best < 0 or slack < best_slack):
            best, best_slack = cursor, slack
        if stop > cursor:
            cursor = stop if alignment == 1 else align_up(stop, alignment)
    return cursor if best < 0 else best


def peak_load(lower, upper, size, active):
    """For each buffer, the most bytes live at any instant of its lifetime.

    Buffers living through the busiest instants have the least freedom, which is why
    MiniMalloc's preorders lead with this ("T"); it is cheap: one sweep and one range max.
    """
    times = np.unique(np.concatenate([lower[active], upper[active]]))
    if times.size == 0:
        return np.zeros_like(size)
    delta = np.zeros(times.size + 1, dtype=np.int64)
    np.add.at(delta, np.searchsorted(times, lower[active]), size[active])
    np.add.at(delta, np.searchsorted(times, upper[active]), -size[active])
    load = np.cumsum(delta)  # load[k]: bytes live over [times[k], times[k+1])
    a = np.searchsorted(times, lower)
    b = np.searchsorted(times, upper)
    pairs = np.empty(2 * lower.size, dtype=np.int64)
    pairs[0::2] = np.minimum(a, load.size - 1)
    pairs[1::2] = np.minimum(np.maximum(b, a + 1), load.size - 1)
    out = np.maximum.reduceat(load, pairs)[0::2]
    return np.where(active, out, 0)


def greedy_orderings(lower, upper, size, active):
    """Orderings worth trying, best on typical graphs first; instances differ, so try several.

    Big-first orderings (size, area) leave small buffers to fill gaps; busiest-first places
    the buffers that live through the peak before anything can fragment it; start-time order
    is the online allocator's order and wins on chain-like graphs.
    """
    length = upper - lower
    area = length * size
    load = peak_load(lower, upper, size, active)
    idx = np.arange(lower.size)
    keys = {
        "size": (idx, lower, -size),
        "start": (idx, -size, lower),
        "load": (idx, -area, -load),
        "area": (idx, -size, -area),
        "length": (idx, -size, -length),
        "load+size": (idx, -length, -size, -load),
    }
    for name, key in keys.items():
        order = np.lexsort(key)
        yield name, order[active[order]].tolist()


def plan_greedy(buffers, alignment=1, max_passes=None):
    """Best placement over the greedy orderings and both gap rules: (offsets, peak, name).

    `max_passes` caps the work for huge graphs; the first passes are the ones that most often
    win (size-first first-fit is the classic; start order first-fit is the online one).
    """
    lower, upper, size, active = columns(buffers)
    nbrs = neighbours(lower, upper, active)
    sizes = size.tolist()
    best = None
    passes = 0
    for name, order in greedy_orderings(lower, upper, size, active):
        for best_fit in (False, True):
            if max_passes is not None and passes >= max_passes:
                break
            if max_passes is not None and max_passes <= 2 and best_fit:
                continue
            passes += 1
            off, peak = greedy_pass(order, sizes, nbrs, alignment, best_fit)
            if best is None or peak < best[1]:
                best = (off, peak, f"greedy:{name}/{'best' if best_fit else 'first'}-fit")
    if best is None:
        return [0] * len(buffers), 0, "trivial"
    return [max(o, 0) for o in best[0]], best[1], best[2]
