"""Offline offset planning for buffers with known lifetimes ("dynamic storage allocation").

Every buffer lives over a half-open time interval [lower, upper) and needs `size` bytes. Two
buffers whose lifetimes overlap must not overlap in address space; the goal is the smallest
peak, max(offset + size). The planner runs cheap greedy placements first (good enough for the
arena planner's easy graphs, and an upper bound for everything else), then, when asked, a
MiniMalloc-style exact search (see `pack_search`) that tries to close the gap to the lower
bound within a time limit.

This module has no dependency on the rest of ggmlrun except the error class used for CSV
input, so it can be tested and benchmarked on its own.
"""

from __future__ import annotations

import csv
import io
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ggmlrun.core.util.atomic import write_atomic
from ggmlrun.core.util.fmt import clip
from ggmlrun.core.util.inputs import read_text
from ggmlrun.core.util.numbers import MAX_BYTES, checked_int
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.fmt import align_up
from ggmlrun.core.memory.intervals import (columns, count_pairs, neighbours, online_plan,
                                           overlap_pairs, sweep_conflicts)
from ggmlrun.core.memory.pack_search import minimise_peak

# The exact search keeps per-section state in memory and costs O(n) numpy work per node; past
# this many buffers it is not worth starting (the arena planner's graphs only use greedy).
SEARCH_MAX_BUFFERS = 20_000
MAX_TOTAL_BYTES = 1 << 62
# past this many lifetime-overlapping pairs the greedy passes (which list every pair) would
# take minutes and gigabytes: 50k buffers live at once are 1.25e9 pairs
MAX_PAIRS = 1_000_000
FALLBACK_PREFIX = "size bound: "


@dataclass(frozen=True)
class Buffer:
    """One allocation request: `size` bytes needed over time [lower, upper)."""

    id: str
    lower: int
    upper: int
    size: int

    def __post_init__(self):
        if self.size < 0:
            raise ValueError(f"buffer {self.id!r}: size {self.size} is negative")
        if self.upper < self.lower:
            raise ValueError(f"buffer {self.id!r}: upper {self.upper} < lower {self.lower}")


@dataclass
class PackResult:
    """The chosen offsets and how good they are: `peak == lower_bound` proves optimality."""

    offsets: dict[str, int]
    peak: int
    lower_bound: int
    method: str
    seconds: float
    greedy_peak: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def optimal(self) -> bool:
        return self.peak == self.lower_bound


# --------------------------------------------------------------------------- bounds


def lower_bound(buffers) -> int:
    """The most bytes live at any one instant: no placement can have a smaller peak.

    Ends sort before starts at the same time because lifetimes are half-open, so a buffer
    freed at t and one allocated at t are never counted together.
    """
    if not buffers:
        return 0
    lower, upper, size, active = columns(buffers)
    lower, upper, size = lower[active], upper[active], size[active]
    if size.size == 0:
        return 0
    times = np.concatenate([upper, lower])
    deltas = np.concatenate([-size, size])
    order = np.lexsort((deltas, times))  # by time, then negative deltas (ends) first
    return int(max(0, np.cumsum(deltas[order]).max()))


# --------------------------------------------------------------------------- verification


def verify(buffers, offsets, *, capacity=None, alignment=1, chunk_pairs=4_000_000) -> list[str]:
    """Every broken rule, as readable lines; an empty list means the placement is valid.

    Pairs are enumerated in chunks so that a dense instance (everything live at once) costs
    time but not quadratic memory.
    """
    problems = []
    missing = [b.id for b in buffers if b.id not in offsets]
    if missing:
        problems.append(f"no offset for {len(missing)} buffer(s): {', '.join(missing[:5])}")
        return problems
    off = np.fromiter((offsets[b.id] for b in buffers), dtype=np.int64, count=len(buffers))
    lower, upper, size, active = columns(buffers)
    for i in np.flatnonzero(off < 0)[:20]:
        problems.append(f"buffer {buffers[i].id!r}: negative offset {int(off[i])}")
    if alignment > 1:
        for i in np.flatnonzero(off % alignment)[:20]:
            problems.append(f"buffer {buffers[i].id!r}: offset {int(off[i])} "
                            f"is not a multiple of {alignment}")
    if capacity is not None:
        for i in np.flatnonzero(off + size > capacity)[:20]:
            problems.append(f"buffer {buffers[i].id!r}: ends at {int(off[i] + size[i])} "
                            f"> capacity {capacity}")
    if count_pairs(lower, upper, active) > MAX_PAIRS:
        offs = off.tolist()
        problems.extend(f"buffers {buffers[i].id!r} and {buffers[j].id!r} overlap in time and "
                        "in space" for i, j in sweep_conflicts(lower, upper, size, active, offs))
    else:
        problems.extend(_space_conflicts(buffers, off, lower, upper, size, active, chunk_pairs))
    return problems


def _space_conflicts(buffers, off, lower, upper, size, active, chunk_pairs):
    """Time-overlapping pairs that also overlap in address space (first 20 reported)."""
    idx = np.flatnonzero(active)
    order = idx[np.argsort(lower[idx], kind="stable")]
    starts = lower[order]
    end = np.searchsorted(starts, upper[order], side="left")
    counts = np.maximum(end - np.arange(order.size) - 1, 0)
    found = []
    lo = 0
    while lo < order.size and len(found) < 20:
        cum = np.cumsum(counts[lo:])
        hi = lo + max(1, int(np.searchsorted(cum, chunk_pairs, side="right")))
        c = counts[lo:hi]
        first = np.repeat(np.arange(lo, hi), c)
        second = first + 1 + (np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c))
        a, b = order[first], order[second]
        bad = (off[a] < off[b] + size[b]) & (off[b] < off[a] + size[a])
        for i, j in zip(a[bad][:20].tolist(), b[bad][:20].tolist()):
            found.append(f"buffers {buffers[i].id!r} [{off[i]}, {off[i] + size[i]}) and "
                         f"{buffers[j].id!r} [{off[j]}, {off[j] + size[j]}) overlap in time "
                         f"and space")
        lo = hi
    return found[:20]


# --------------------------------------------------------------------------- greedy


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


# --------------------------------------------------------------------------- the planner


def plan_offsets(buffers, capacity=None, time_limit=5.0, *, search=True, alignment=1,
                 max_passes=None) -> PackResult:
    """Offsets for every buffer, as low a peak as the time limit allows.

    Greedy always runs. The search runs only when `search` is true, `time_limit > 0`, and the
    greedy peak is above the target: `capacity` when given (then any fitting placement is
    accepted), otherwise the lower bound (then it bisects on the peak between the lower bound
    and the best found so far).
    """
    t0 = time.perf_counter()
    buffers = list(buffers)
    _check_ids(buffers)
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    if max_passes is None and len(buffers) > 20_000:
        max_passes = 2  # keep the greedy-only path of huge graphs to a couple of passes
    lower, upper, size, active = columns(buffers)
    pairs = count_pairs(lower, upper, active)
    notes = []
    if pairs > MAX_PAIRS:     # the greedy passes' neighbour lists would be quadratic
        offs, peak = online_plan(lower, upper, size, active, alignment)
        method = "online best-fit"
        notes.append(f"{FALLBACK_PREFIX}{pairs:,} overlapping lifetimes > {MAX_PAIRS:,}, so "
                     "ggml's online best-fit instead of the greedy passes and the search")
        search = False
    else:
        offs, peak, method = plan_greedy(buffers, alignment, max_passes)
    lb = lower_bound(buffers)
    greedy_peak = peak
    target = lb if capacity is None else capacity
    if search and len(buffers) > SEARCH_MAX_BUFFERS:
        notes.append(f"search skipped: {len(buffers)} buffers > {SEARCH_MAX_BUFFERS}")
        search = False
    if search and time_limit and time_limit > 0 and peak > max(target, lb):

        found = minimise_peak(buffers, lb, peak, capacity, alignment,
                              deadline=t0 + time_limit)
        notes.extend(found.notes)
        if found.offsets is not None and found.peak < peak:
            offs, peak, method = found.offsets, found.peak, found.method
    offsets = {b.id: int(o) for b, o in zip(buffers, offs)}
    return PackResult(offsets, int(peak), int(lb), method, time.perf_counter() - t0,
                      greedy_peak=int(greedy_peak), notes=notes)


def _check_ids(buffers):
    seen = set()
    for b in buffers:
        if b.id in seen:
            raise ValueError(f"duplicate buffer id {b.id!r}")
        seen.add(b.id)


# --------------------------------------------------------------------------- CSV


_COLUMNS = ("id", "lower", "upper", "size")


def read_csv(path) -> list[Buffer]:
    """Buffers from MiniMalloc's CSV format; errors name the file and the line."""
    path = os.fspath(path)
    text = read_text(path, "CSV file")
    try:
        return _read_rows(io.StringIO(text, newline=""), path)
    except csv.Error as err:     # a field past csv's limit, a NUL byte, a broken quote
        raise InputError(f"malformed CSV: {clip(err)}", file=path) from None


def _read_rows(handle, path) -> list[Buffer]:
    reader = csv.reader(handle)
    header = next(reader, None)
    if header is None:
        raise InputError("empty file; expected a header 'id,lower,upper,size'", file=path,
                         line=1)
    header = [h.strip() for h in header]
    missing = [c for c in _COLUMNS if c not in header]
    if missing:
        raise InputError(f"header lacks column(s) {', '.join(missing)}; "
                         f"expected 'id,lower,upper,size'", file=path, line=1)
    cols = [header.index(c) for c in _COLUMNS]
    buffers, seen, total = [], {}, 0
    for row in reader:
        line = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        buf = _parse_row(row, cols, path, line)
        if buf.id in seen:
            raise InputError(f"buffer id {buf.id!r} repeats the one on line {seen[buf.id]}",
                             file=path, line=line)
        seen[buf.id] = line
        buffers.append(buf)
        total += buf.size
    if total > MAX_TOTAL_BYTES:     # keeps every offset and peak exact in int64 arithmetic
        raise InputError(f"the sizes add up to {total} bytes, more than 2**62; no memory is "
                         "that large", file=path)
    return buffers


def _parse_row(row, cols, path, line):
    if len(row) <= max(cols):
        raise InputError(f"expected at least {max(cols) + 1} fields, got {len(row)}",
                         file=path, line=line)
    ident = row[cols[0]].strip()
    if not ident:
        raise InputError("empty id", file=path, line=line)
    values = []
    shown = clip(ident)
    for name, c in zip(_COLUMNS[1:], cols[1:]):
        try:
            values.append(checked_int(row[c], f"buffer '{shown}': {name}", 0, MAX_BYTES))
        except ValueError as err:
            raise InputError(str(err), file=path, line=line) from None
    try:
        return Buffer(ident, *values)
    except ValueError as e:
        raise InputError(str(e), file=path, line=line) from None


def write_csv(path, buffers, offsets) -> None:
    """The rows back with an `offset` column; atomic, so a crash never leaves half a file."""
    rows = io.StringIO(newline="")
    writer = csv.writer(rows)
    writer.writerow([*_COLUMNS, "offset"])
    for b in buffers:
        writer.writerow([b.id, b.lower, b.upper, b.size, offsets[b.id]])
    write_atomic(path, lambda handle: handle.write(rows.getvalue().encode()))