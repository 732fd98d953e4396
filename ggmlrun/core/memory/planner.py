"""The offline planner (`--planner best`): ggml's lifetimes, better offsets.

ggml's allocator places each tensor the moment it is created and never looks ahead. Here the
very same slots (same schedule, same frees, same in-place reuse) are handed to the offset
planner of `pack.py`, which sees every lifetime at once; per arena the smaller of the two
plans is kept, so `best` is never worse than `ggml`.
"""

from __future__ import annotations

from dataclasses import replace

from ggmlrun.core.memory.alloc import MemoryPlan, Slot
from ggmlrun.core.memory.pack import FALLBACK_PREFIX, Buffer, plan_offsets
from ggmlrun.core.util.notes import note

SEARCH_MAX_SLOTS = 2000   # above this, the greedy orderings alone (the search would not pay)


def best_plan(plan: MemoryPlan, time_limit: float = 0.5) -> MemoryPlan:
    moved: dict[Slot, Slot] = {}
    arena = list(plan.arena_bytes)
    end = plan.n_events + 1
    for buffer, alignment in enumerate(plan.alignments):
        slots = [s for s in plan.slots if s.buffer == buffer]
        if len(slots) < 2:
            continue
        requests = [Buffer(str(i), s.born, end if s.died is None else s.died, s.size)
                    for i, s in enumerate(slots)]
        result = plan_offsets(requests, time_limit=time_limit, alignment=alignment,
                              search=len(slots) <= SEARCH_MAX_SLOTS)
        for text in result.notes:
            if text.startswith(FALLBACK_PREFIX):
                note(f"--planner best: {text}")
        if result.peak < arena[buffer]:
            arena[buffer] = result.peak
            for i, slot in enumerate(slots):
                moved[slot] = replace(slot, offset=result.offsets[str(i)])
    if not moved:
        return plan
    return MemoryPlan(arena_bytes=arena, alignments=plan.alignments,
                      slots=[moved.get(s, s) for s in plan.slots],
                      slot_of={t: moved.get(s, s) for t, s in plan.slot_of.items()},
                      inplace=plan.inplace, n_events=plan.n_events)
