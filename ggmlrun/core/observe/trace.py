"""A run as a Chrome/Perfetto trace (the Trace Event Format's JSON Object form), as a dict.

Open the written file in https://ui.perfetto.dev or chrome://tracing. What it holds:

- one process (pid 1) named after the graph, one thread track per backend (tid = backend
  index + 1, named by `M` metadata events, sorted in backend priority order);
- an `X` (complete) event per compute and per copy of every run, on the track of the backend
  that runs it (a copy runs on its destination, as in ggml), ts/dur in microseconds since the
  first run started; args: kind, op, shape, source names and shapes, dtype, bytes, FLOPs,
  arena buffer and offset, backend, cause, split, run;
- a counter (`C`) per arena, "arena BACKEND", of the bytes live while each step runs (the
  memory plan's slot lives on the step order, core/occupancy.py; never above the arena);
- flow arrows (`s` then `f`, bp "e", one id per arrow) from the op that produced a copied
  tensor to its copy, and from the copy to every op that reads it. A leaf's copy (an input or
  a weight) has no producer arrow. Each flow event sits at the exact ts, pid, tid and category
  of the slice it binds to, which is what both Perfetto and Chrome DevTools bind by.

No file I/O here: the CLI writes the dict (atomically) as JSON.
"""

from __future__ import annotations

from ggmlrun.core.memory.alloc import MemoryPlan
from ggmlrun.core.util.fmt import microseconds
from ggmlrun.core.run.exec import RunResult
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.observe.occupancy import live_bytes
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.sched.schedule import COPY, Schedule, Step

PID = 1
CATEGORY = "ggmlrun"       # one category: flow events must share it with the slices they bind


def _location(sched: Schedule, plan: MemoryPlan, tensor: Tensor) -> tuple[str, int | None]:
    """(buffer, offset) of a tensor's first byte: 'BACKEND arena' or 'BACKEND weights'."""
    root = tensor.view_src or tensor
    extra = tensor.view_offset if tensor.is_view else 0
    if root in plan.slot_of:
        buffer, offset = plan.offset(root)
        return f"{sched.backends[buffer].name} arena", offset + extra
    if root.role == "weight":
        return f"{sched.backend_name(root)} weights", None
    return "", None


def _step_args(sched: Schedule, plan: MemoryPlan, step: Step, run: int) -> dict:
    tensor = step.tensor
    buffer, offset = _location(sched, plan, tensor)
    args = {"kind": step.kind, "run": run, "split": step.split,
            "backend": sched.backends[step.backend].name, "shape": list(tensor.shape),
            "dtype": tensor.dtype, "bytes": tensor.nbytes, "buffer": buffer, "offset": offset,
            "cause": sched.cause.get(tensor, "")}
    if step.kind == COPY:
        source = sched.copy_source[tensor]
        args.update(op="copy", source=source.name, **{"from": sched.backend_name(source),
                                                      "to": sched.backends[step.backend].name})
        src_buffer, src_offset = _location(sched, plan, source)
        args.update(source_buffer=src_buffer, source_offset=src_offset)
    else:
        srcs = sched.srcs_of[tensor]
        args.update(op=tensor.op, srcs=[s.name for s in srcs],
                    src_shapes=[list(s.shape) for s in srcs],
                    flops=get_op(tensor.op).count_flops(tensor, tensor.src))
        if tensor.params:
            args["params"] = {k: v for k, v in tensor.params.items()}
    return args


def _producer(tensor: Tensor) -> Tensor | None:
    """The node whose compute wrote a tensor's bytes (through views); None for a leaf's."""
    while tensor.op is not None and get_op(tensor.op).view_op:
        if not tensor.src:
            return None
        tensor = tensor.src[0]
    return tensor if tensor.op is not None else None


def build_trace(sched: Schedule, plan: MemoryPlan, result: RunResult) -> dict:
    """The trace of a run made with `record_events=True` (no events: tracks and counters only)."""
    steps = sched.execution_steps()
    step_of = {s.tensor: s for s in steps}
    live = live_bytes(sched, plan, steps)
    tid = {b.name: i + 1 for i, b in enumerate(sched.backends)}
    events: list[dict] = [
        {"ph": "M", "pid": PID, "tid": 0, "name": "process_name",
         "args": {"name": f"ggmlrun: {sched.graph.name}"}},
    ]
    for i, backend in enumerate(sched.backends):
        events.append({"ph": "M", "pid": PID, "tid": i + 1, "name": "thread_name",
                       "args": {"name": f"{backend.name} ({backend.kind})"}})
        events.append({"ph": "M", "pid": PID, "tid": i + 1, "name": "thread_sort_index",
                       "args": {"sort_index": i}})

    # slices, and where each (run, tensor) slice starts, for the flows
    slices: list[dict] = []
    started: dict[tuple[int, Tensor], dict] = {}
    counters: list[dict] = []
    last_value: dict[int, int] = {}
    arenas = [b for b, size in enumerate(plan.arena_bytes) if size > 0]
    for event in result.events:
        step = step_of.get(event.tensor)
        if step is None:
            continue
        ts = microseconds(event.start)
        name = event.tensor.name
        slice_ = {"ph": "X", "pid": PID, "tid": tid[event.backend], "name": name,
                  "cat": CATEGORY, "ts": ts, "dur": max(microseconds(event.end - event.start), 0.0),
                  "args": _step_args(sched, plan, step, event.run)}
        slices.append(slice_)
        started[(event.run, event.tensor)] = slice_
        for b in arenas:
            value = int(live[step.index, b])
            if last_value.get(b) != value or step.index == 0:
                counters.append({"ph": "C", "pid": PID, "tid": 0, "ts": ts,
                                 "name": f"arena {sched.backends[b].name}",
                                 "args": {"live_bytes": value}})
                last_value[b] = value

    flows = _flows(sched, started, result)
    return {"traceEvents": events + slices + flows + counters, "displayTimeUnit": "ms",
            "otherData": {"tool": "ggmlrun", "graph": sched.graph.name, "repeat": result.repeat,
                          "backends": [b.name for b in sched.backends],
                          "arena_bytes": {sched.backends[b].name: plan.arena_bytes[b]
                                          for b in range(len(sched.backends))}}}


def _flows(sched: Schedule, started: dict[tuple[int, Tensor], dict], result: RunResult) -> list[dict]:
    """Arrows producer -> copy and copy -> each consumer, per run; each an (s, f) pair."""
    readers: dict[Tensor, list[Tensor]] = {}
    for split in sched.splits:
        for node in split.nodes:
            for src in sched.srcs_of[node]:
                if src in sched.copy_source and node not in readers.get(src, []):
                    readers.setdefault(src, []).append(node)
    pairs: list[tuple[Tensor, Tensor, str]] = []
    for copy, source in sched.copy_source.items():
        producer = _producer(source)
        if producer is not None:
            pairs.append((producer, copy, f"{source.name} -> {copy.name}"))
        for reader in readers.get(copy, []):
            pairs.append((copy, reader, f"{copy.name} -> {reader.name}"))
    flows: list[dict] = []
    next_id = 1
    for run in range(result.repeat):
        for start, end, name in pairs:
            a, b = started.get((run, start)), started.get((run, end))
            if a is None or b is None:
                continue      # a view-only reader, or no events recorded
            flows.append({"ph": "s", "id": next_id, "pid": PID, "tid": a["tid"], "ts": a["ts"],
                          "name": name, "cat": CATEGORY})
            flows.append({"ph": "f", "bp": "e", "id": next_id, "pid": PID, "tid": b["tid"],
                          "ts": b["ts"], "name": name, "cat": CATEGORY})
            next_id += 1
    return flows
