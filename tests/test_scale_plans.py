"""Schedules and memory plans stay exactly what they were before the scheduler and allocator
moved to integer-indexed tables (issue 11, planning cost linear in the graph size).

Every case's full result (each tensor's backend and cause in insertion order, the splits with
their copies, each node's sources, every slot with its life and tensors, in-place pairs, arena
sizes, bounds, weight offsets) is reduced to a digest; `tests/data/scale_plans.json` holds the
digests the dict-based code produced. The CPU backend's default `memory` is the host's RAM and
is part of each digest, so the cases run on a fixed simulated host (RECORDED_HOST_RAM, the RAM of
the machine that recorded them, through core/util/host.py): the digests hold on any machine.
Re-record only for an intended change of results:

    python3 tests/test_scale_plans.py --record
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

from ggmlrun.core import engine  # noqa: E402
from ggmlrun.core.backends.spec import default_backends  # noqa: E402
from tests.randgraph import random_backends, random_graph  # noqa: E402

GOLDEN = ROOT / "tests" / "data" / "scale_plans.json"
RANDOM_SEEDS = range(120)
RECORDED_HOST_RAM = "25276063744"      # bytes: the RAM the digests were recorded with


@pytest.fixture(autouse=True)
def recorded_host(monkeypatch):
    monkeypatch.setenv("GGMLRUN_HOST_RAM", RECORDED_HOST_RAM)


def fingerprint(sched, plan, memory) -> str:
    """The whole outcome as text: names only, so it is the same in every process."""
    lines = [f"backend_of {t.name} {b} {sched.cause.get(t, '')}" for t, b in sched.backend_of.items()]
    lines += [f"cause-only {t.name} {c}" for t, c in sched.cause.items() if t not in sched.backend_of]
    for k, split in enumerate(sched.splits):
        lines.append(f"split {k} {split.backend} {[n.name for n in split.nodes]} "
                     f"{[(s.name, c.name) for s, c in split.copy_of.items()]}")
    lines += [f"srcs {n.name} {[s.name for s in srcs]}" for n, srcs in sched.srcs_of.items()]
    index = {id(s): i for i, s in enumerate(plan.slots)}
    lines += [f"slot {s.buffer} {s.offset} {s.size} {s.born} {s.died} {[t.name for t in s.tensors]}"
              for s in plan.slots]
    lines += [f"slot_of {t.name} {index[id(s)]}" for t, s in plan.slot_of.items()]
    lines += [f"inplace {a.name} {b.name}" for a, b in plan.inplace]
    lines.append(f"arena {plan.arena_bytes} events {plan.n_events} weights {plan.weights.bytes}")
    lines += [f"weight {t.name} {o}" for t, o in plan.weights.offsets.items()]
    lines += [f"memory {m}" for m in memory]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def llama_graph(layers: int, offload: int):
    from bench_scale import build

    return build(layers, offload)


def cases():
    """(name, graph factory, backends factory, policy, planner, ggml)."""
    out = []
    for seed in RANDOM_SEEDS:
        policy, planner = ("cost", "best") if seed % 4 == 3 else ("ggml", "ggml" if seed % 2 else "best")
        ggml = "0.15" if seed % 3 == 0 else "0.25"

        def make(seed=seed):
            rng = np.random.default_rng(seed)
            graph = random_graph(rng, n_nodes=int(rng.integers(4, 40)),
                                 device_names=("SIM0", "SIM1"))
            return graph, random_backends(rng, graph)

        out.append((f"random-{seed}", make, policy, planner, ggml))
    for layers, offload in ((1, 0), (2, 1), (3, 3), (5, 2)):
        for ggml in ("0.25", "0.15"):
            out.append((f"llama-{layers}-{offload}-{ggml}",
                        lambda layers=layers, offload=offload: (llama_graph(layers, offload),
                                                                default_backends()),
                        "ggml", "best", ggml))
    return out


def outcome(make, policy, planner, ggml) -> str:
    graph, backends = make()
    sched = engine.schedule(graph, backends, policy, ggml)
    plan, memory = engine.plan_memory(sched, planner)
    return fingerprint(sched, plan, memory)


CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan_is_unchanged(case):
    name, make, policy, planner, ggml = case
    golden = json.loads(GOLDEN.read_text())
    assert outcome(make, policy, planner, ggml) == golden[name]


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(__doc__)
    os.environ["GGMLRUN_HOST_RAM"] = RECORDED_HOST_RAM
    GOLDEN.write_text(json.dumps({c[0]: outcome(*c[1:]) for c in CASES}, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({len(CASES)} cases)")


def test_graphs_sharing_tensors_keep_their_own_plans():
    """A tensor has one row number: scheduling a second graph that shares tensors renumbers
    them, and the first schedule (or an allocation sequence built from it) must notice and
    renumber its own rows rather than read the other graph's."""
    from ggmlrun.core.ir.graph import Graph
    from ggmlrun.core.memory.alloc import GraphAllocator
    from ggmlrun.core.memory.sequence import allocation_sequence

    backends = default_backends()
    first = llama_graph(3, 2)
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
