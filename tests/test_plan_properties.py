"""Properties of schedules, plans and runs over many small random cases (the way tinygrad's
memory-planner tests and ggml's test-backend-ops check: a rule stated once, drawn over graphs).

- Placement never changes the numbers: a graph run on the CPU alone, on random device sets with
  random pins, under ggml's policy or the cost policy, gives the same bits. This is what lets
  tests/test_llamacpp_figures.py run a tiny model once per distinct outcome rather than once per
  placement.
- A schedule and its memory plan are a function of the graph and the backends, not of the
  process: every tensor's backend and cause, the splits and their copies, each slot's offset,
  size and life, and the arenas come out the same in a second interpreter with another hash
  seed (they are compared as names, never as ids).
- A tensor has one row number: scheduling a second graph that shares tensors renumbers them, and
  the first schedule must notice.

Plan validity itself (no two live tensors share bytes, arenas between their lower bound and the
no-reuse size, ggml's in-place rules, the copies a run moves) is tests/test_alloc.py's,
tests/test_sched.py's and tests/test_executed.py's, over their own random cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ggmlrun.core import engine
from ggmlrun.core.backends.spec import default_backends, default_cpu
from ggmlrun.core.run.exec import Executor
from tests.randgraph import leaf_values, random_backends, random_graph

ROOT = Path(__file__).resolve().parents[1]
SEEDS = range(120)
PROCESS_SEEDS = range(60)        # each costs two plans, one in another interpreter
# policy, planner and ggml's rules vary with the seed, as every combination has its own code
SETTINGS = [("ggml", "ggml", "0.25"), ("ggml", "best", "0.15"), ("cost", "best", "0.25"),
            ("ggml", "best", "0.25"), ("cost", "ggml", "0.15")]


def case(seed: int, placed: bool):
    """Seed's graph and leaf values; `placed`: on random devices with random pins, else on the
    CPU alone (every pin and weight backend dropped)."""
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, n_nodes=int(rng.integers(3, 24)), device_names=("SIM0", "SIM1"))
    values = leaf_values(graph, np.random.default_rng(10**6 + seed))
    if placed:
        backends = random_backends(rng, graph)
    else:
        for t in (*graph.leafs, *graph.nodes):
            t.backend = None
        backends = [default_cpu()]
    return graph, backends, values


def outputs(graph, backends, values, setting) -> tuple[dict[str, bytes], int]:
    policy, planner, ggml = setting
    sched = engine.schedule(graph, backends, policy, ggml)
    plan, _ = engine.plan_memory(sched, planner)
    result = Executor(sched, plan, values).run({t: values[t] for t in graph.inputs})
    return {name: arr.tobytes() for name, arr in result.outputs.items()}, result.copied_count


def test_placement_never_changes_the_numbers():
    copied = 0
    for seed in SEEDS:
        setting = SETTINGS[seed % len(SETTINGS)]
        alone, _ = outputs(*case(seed, placed=False), SETTINGS[0])
        spread, n = outputs(*case(seed, placed=True), setting)
        assert spread == alone, (seed, setting)
        copied += n
    assert copied > 100          # the cases do cross backends


def fingerprint(sched, plan, memory) -> list[str]:
    """The whole outcome as names: the same in every process if nothing depends on ids."""
    lines = [f"backend_of {t.name} {b} {sched.cause.get(t, '')}" for t, b in sched.backend_of.items()]
    for k, split in enumerate(sched.splits):
        lines.append(f"split {k} {split.backend} {[n.name for n in split.nodes]} "
                     f"{[(s.name, c.name) for s, c in split.copy_of.items()]}")
    lines += [f"srcs {n.name} {[s.name for s in srcs]}" for n, srcs in sched.srcs_of.items()]
    lines += [f"slot {s.buffer} {s.offset} {s.size} {s.born} {s.died} {[t.name for t in s.tensors]}"
              for s in plan.slots]
    lines += [f"inplace {a.name} {b.name}" for a, b in plan.inplace]
    lines.append(f"arena {plan.arena_bytes} events {plan.n_events} weights {plan.weights.bytes}")
    lines += [f"weight {t.name} {o}" for t, o in plan.weights.offsets.items()]
    lines += [f"memory {m}" for m in memory]
    return lines


def fingerprints() -> dict[str, list[str]]:
    """Every seed's schedule and plan, and four llama-shaped graphs' (benchmarks/bench_scale.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_scale import build

    out = {}
    for seed in PROCESS_SEEDS:
        policy, planner, ggml = SETTINGS[seed % len(SETTINGS)]
        graph, backends, _ = case(seed, placed=True)
        sched = engine.schedule(graph, backends, policy, ggml)
        out[f"random-{seed}"] = fingerprint(sched, *engine.plan_memory(sched, planner))
    for layers, offload in ((1, 0), (2, 1), (3, 3), (5, 2)):
        for ggml in ("0.25", "0.15"):
            sched = engine.schedule(build(layers, offload), default_backends(), "ggml", ggml)
            out[f"llama-{layers}-{offload}-{ggml}"] = fingerprint(sched, *engine.plan_memory(sched, "best"))
    return out


def test_schedules_and_plans_do_not_depend_on_the_process():
    here = fingerprints()
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    there = subprocess.run(
        [sys.executable, "-c", "import json; from tests.test_plan_properties import fingerprints; "
                               "print(json.dumps(fingerprints()))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(there.stdout) == here


def test_graphs_sharing_tensors_keep_their_own_plans():
    """A tensor has one row number: scheduling a second graph that shares tensors renumbers
    them, and the first schedule (or an allocation sequence built from it) must notice and
    renumber its own rows rather than read the other graph's."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_scale import build

    from ggmlrun.core.ir.graph import Graph
    from ggmlrun.core.memory.alloc import GraphAllocator
    from ggmlrun.core.memory.sequence import allocation_sequence

    backends = default_backends()
    first = build(3, 2)
    # the leafs in another order and only the first layer's nodes: every row number differs
    second = Graph(name="part", leafs=list(reversed(first.leafs)), nodes=first.nodes[:32],
                   outputs=[first.nodes[31]])

    def alone(graph):
        sched = engine.schedule(graph, backends)
        return fingerprint(sched, *engine.plan_memory(sched))

    expected_first, expected_second = alone(first), alone(second)
    sched_first = engine.schedule(first, backends)
    sched_second = engine.schedule(second, backends)           # renumbers the shared tensors
    assert fingerprint(sched_first, *engine.plan_memory(sched_first)) == expected_first
    assert fingerprint(sched_second, *engine.plan_memory(sched_second)) == expected_second

    plan_first, _ = engine.plan_memory(sched_first)
    leafs, sequence = allocation_sequence(sched_first)
    engine.schedule(second, backends)                          # between building and planning
    allocator = GraphAllocator([b.alignment for b in backends], ggml=sched_first.ggml)
    plan = allocator.plan(leafs, sequence)
    assert plan.arena_bytes == plan_first.arena_bytes
    assert ([(s.offset, s.born, s.died, [t.name for t in s.tensors]) for s in plan.slots]
            == [(s.offset, s.born, s.died, [t.name for t in s.tensors]) for s in plan_first.slots])
