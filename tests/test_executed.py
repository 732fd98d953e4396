"""What the executor did, checked against the graph: copies moved and bytes never shared.

Both checks (tests/executed.py) are computed from the executed steps and the bound arrays, so
each is shown to fail on a deliberately broken run before it is trusted on good ones.
"""

from dataclasses import replace

import numpy as np
import pytest

from ggmlrun.core import engine
from ggmlrun.core.run.exec import Executor
from ggmlrun.core.run.reference import evaluate
from ggmlrun.core.sched.schedule import COPY
from ggmlrun.core.util.errors import RunError
from tests.executed import copy_problems, lifetime_problems, step_lifetimes
from tests.randgraph import leaf_values, random_backends, random_graph

SEEDS = range(300)


def random_case(seed: int, policy="ggml"):
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, n_nodes=int(rng.integers(3, 16)), device_names=("SIM0", "SIM1"))
    backends = random_backends(rng, graph)
    return engine.schedule(graph, backends, policy), leaf_values(graph, rng)


def run(sched, plan, values, repeat=1):
    executor = Executor(sched, plan, values)
    result = executor.run({t: values[t] for t in sched.graph.inputs}, repeat=repeat)
    return executor, result


@pytest.mark.parametrize("policy,planner", [("ggml", "ggml"), ("cost", "best")])
def test_random_graphs_move_exactly_the_needed_copies_and_never_share_live_bytes(policy, planner):
    copies_seen = 0
    for seed in SEEDS:
        sched, values = random_case(seed, policy)
        plan, _ = engine.plan_memory(sched, planner)
        executor, result = run(sched, plan, values, repeat=2)
        assert copy_problems(sched, result) == [], seed
        assert lifetime_problems(executor) == [], seed
        want = evaluate(sched.graph, dict(values))
        for name, arr in result.outputs.items():
            np.testing.assert_allclose(arr, want[name], rtol=1e-5, atol=1e-6)
        copies_seen += result.copied_count
    assert copies_seen > 0          # the cases do cross backends


def test_a_skipped_copy_is_caught():
    for seed in SEEDS:
        sched, values = random_case(seed)
        if sched.copy_count:
            break
    plan, _ = engine.plan_memory(sched)
    executor = Executor(sched, plan, values)
    compiled = executor._compile()
    first_copy = next(i for i, s in enumerate(compiled) if s.planned.kind == COPY)
    executor.steps = compiled[:first_copy] + compiled[first_copy + 1:]
    result = executor.run({t: values[t] for t in sched.graph.inputs})
    assert copy_problems(sched, result) != []


def _overlapping_pair(executor, plan):
    """Two tensors of one arena live at the same step, the second small enough to be moved
    onto the first's bytes."""
    span = step_lifetimes(executor)
    roots = [t for t in span if t in plan.slot_of]
    for a in roots:
        for b in roots:
            sa, sb = plan.slot_of[a], plan.slot_of[b]
            (a0, a1), (b0, b1) = span[a], span[b]
            if (sa is not sb and sa.buffer == sb.buffer and max(a0, b0) < min(a1, b1)
                    and sa.offset + b.nbytes <= plan.arena_bytes[sa.buffer]):
                return a, b
    return None


def test_a_slot_reused_while_live_is_caught():
    for seed in SEEDS:
        sched, values = random_case(seed)
        plan, _ = engine.plan_memory(sched)
        executor, _ = run(sched, plan, values)
        pair = _overlapping_pair(executor, plan)
        if pair:
            break
    a, b = pair
    wrong = replace(plan.slot_of[b], offset=plan.slot_of[a].offset)
    broken = replace(plan, slot_of={t: wrong if s is plan.slot_of[b] else s
                                    for t, s in plan.slot_of.items()})
    executor, _ = run(sched, broken, values)
    assert any(f"'{a.name}'" in p and f"'{b.name}'" in p for p in lifetime_problems(executor))


def test_a_failing_kernel_is_reported_with_its_node():
    sched, values = random_case(3)
    plan, _ = engine.plan_memory(sched)
    executor = Executor(sched, plan, values)
    steps = executor._compile()
    at = next(i for i, s in enumerate(steps) if s.planned.kind != COPY)
    victim = steps[at]

    def broken(*args):
        raise ValueError("boom")
    steps[at] = replace(victim, fn=broken)
    executor.steps = steps
    message = (rf"while executing node '{victim.planned.tensor.name}' "
               rf"\({victim.planned.tensor.op}\) on \w+: ValueError: boom")
    with pytest.raises(RunError, match=message):
        executor.run({t: values[t] for t in sched.graph.inputs})
    with pytest.raises(RunError, match=message):
        executor.run_node(steps[at])
