"""Arena occupancy over the schedule: which bytes of each arena are live at each step.

The memory plan records every slot's life in allocator events (ggml's walk over its graph copy:
dependency entries, copies, nodes). Here those lives are mapped onto the steps the executor
really runs, the copies and the computes in order (view ops compute nothing and are no step):

- a slot is live from the step that creates it (its first tensor's copy or compute); graph
  inputs, placed before anything else, from the first step;
- to the last step that reads any tensor in it, directly or through a view (the allocator frees
  a slot right after that step); a slot the allocator never frees (outputs, tensors nobody
  reads) lives to the end.

So the bytes live while a step runs are the bytes that step may touch, and the most bytes live
at any step is exactly the plan's lower bound (`MemoryPlan.lower_bound`). `occupancy()` turns
that into an address-by-time grid per arena for the terminal picture of `measure`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggmlrun.core.memory.alloc import MemoryPlan, Slot
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.sched.schedule import COPY, Schedule, Step

def reads_of(sched: Schedule, step: Step) -> list[Tensor]:
    """The tensors a step reads: a copy its source, a compute its sources (copies substituted)."""
    if step.kind == COPY:
        return [sched.copy_source[step.tensor]]
    return list(sched.srcs_of[step.tensor])


@dataclass(frozen=True)
class Lifetime:
    slot: Slot
    first: int                     # first step during which the slot is live
    last: int                      # last one (inclusive)


def slot_lifetimes(sched: Schedule, plan: MemoryPlan, steps: list[Step] | None = None
                   ) -> list[Lifetime]:
    """Every slot of the plan with the steps it is live over (see the module docstring)."""
    steps = sched.execution_steps() if steps is None else steps
    step_of = {s.tensor: s.index for s in steps}
    last_read: dict[Slot, int] = {}
    for step in steps:
        for tensor in reads_of(sched, step):
            slot = plan.slot_of.get(tensor.view_src or tensor)
            if slot is not None:
                last_read[slot] = step.index
    end = max(len(steps) - 1, 0)
    lives = []
    for slot in plan.slots:
        first = step_of.get(slot.tensors[0], 0)
        last = end if slot.died is None else max(first, last_read.get(slot, first))
        lives.append(Lifetime(slot, first, last))
    return lives


def live_bytes(sched: Schedule, plan: MemoryPlan, steps: list[Step] | None = None) -> np.ndarray:
    """[step, buffer]: aligned bytes live in each arena while each step runs."""
    steps = sched.execution_steps() if steps is None else steps
    n_buffers = len(plan.arena_bytes)
    delta = np.zeros((len(steps) + 1, n_buffers), dtype=np.int64)
    for life in slot_lifetimes(sched, plan, steps):
        delta[life.first, life.slot.buffer] += life.slot.size
        delta[life.last + 1, life.slot.buffer] -= life.slot.size
    return np.cumsum(delta, axis=0)[:len(steps)]


@dataclass
class ArenaPicture:
    """One arena as a grid: rows are address buckets (row 0 the lowest addresses), columns are
    runs of steps; a cell is the share of its bytes x steps that live slots occupy."""

    buffer: int
    name: str
    arena_bytes: int               # the peak: what the plan reserves
    lower_bound: int               # most bytes live at once
    cells: np.ndarray              # [rows, cols] in [0, 1]
    live: np.ndarray               # [cols] most bytes live during the column's steps
    columns: list[tuple[int, int]]  # each column's steps, [first, last]
    lower_bound_row: int           # the row holding the lower bound's last byte; -1 when 0
    peak_step: int                 # first step with `lower_bound` bytes live; -1 with no steps
    peak_tensor: str               # what that step copies or computes
    n_steps: int

    @property
    def rows(self) -> int:
        return self.cells.shape[0]

    def row_range(self, row: int) -> tuple[float, float]:
        """Bytes [low, high) of the arena a row covers."""
        return (row * self.arena_bytes / self.rows, (row + 1) * self.arena_bytes / self.rows)


def step_columns(n_steps: int, width: int) -> list[tuple[int, int]]:
    """`width` columns over `n_steps` steps: buckets when steps are many, repeats when few."""
    if n_steps == 0:
        return []
    cols = []
    for c in range(width):
        lo = c * n_steps // width
        hi = max((c + 1) * n_steps // width, lo + 1)
        cols.append((lo, hi - 1))
    return cols


def occupancy(sched: Schedule, plan: MemoryPlan, width: int = 64, height: int = 10
              ) -> list[ArenaPicture]:
    """A picture per arena with bytes in it (arenas of 0 bytes are left out)."""
    steps = sched.execution_steps()
    lives = slot_lifetimes(sched, plan, steps)
    live = live_bytes(sched, plan, steps)
    columns = step_columns(len(steps), width)
    pictures = []
    for b, arena in enumerate(plan.arena_bytes):
        if arena <= 0:
            continue
        edges = np.arange(height + 1, dtype=np.float64) * arena / height
        # per row and step, bytes occupied: a difference array over steps, one add per slot
        delta = np.zeros((height, len(steps) + 1))
        for life in lives:
            slot = life.slot
            if slot.buffer != b or slot.size == 0:
                continue
            lo, hi = slot.offset, slot.offset + slot.size
            overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
            delta[:, life.first] += overlap
            delta[:, life.last + 1] -= overlap
        per_step = np.cumsum(delta, axis=1)[:, :len(steps)]
        row_bytes = arena / height
        cells = np.zeros((height, len(columns)))
        col_live = np.zeros(len(columns), dtype=np.int64)
        for c, (first, last) in enumerate(columns):
            cells[:, c] = per_step[:, first:last + 1].mean(axis=1) / row_bytes
            col_live[c] = live[first:last + 1, b].max()
        bound = plan.lower_bound(b)
        lb_row = -1 if bound <= 0 else min((bound - 1) * height // arena, height - 1)
        hits = np.flatnonzero(live[:, b] == bound) if len(steps) else np.array([], dtype=int)
        peak = int(hits[0]) if len(hits) else -1
        pictures.append(ArenaPicture(
            buffer=b, name=sched.backends[b].name, arena_bytes=arena, lower_bound=bound,
            cells=cells, live=col_live, columns=columns, lower_bound_row=int(lb_row),
            peak_step=peak, peak_tensor=steps[peak].tensor.name if peak >= 0 else "",
            n_steps=len(steps)))
    return pictures
