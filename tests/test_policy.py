"""Cost-aware placement and the offline planner: never worse than ggml, and exact where checkable."""

import itertools
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.backends import costs
from ggmlrun.core import engine
from ggmlrun.core.backends.spec import default_cpu, default_sim
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.frontend.loader import load_graph
from ggmlrun.core.ir.ops import get_op, make_node
from ggmlrun.core.sched.policy import CostPolicy, owner
from ggmlrun.core.run.reference import evaluate
from ggmlrun.core.sched.scheduler import Scheduler
from tests.randgraph import leaf_values, random_graph

GRAPHS = sorted((Path(__file__).resolve().parents[1] / "graphs").glob("*.yaml"))


def f32_sum_tolerance(want) -> float:
    """f32 sums come out in another order when BLAS is called on other shapes (the panel
    product): an element that cancels to near zero may differ by a few ulps of its row's
    largest terms, and a later mul_mat that rounds its input to f16 (f16 weights) may then
    round an element the other way (one f16 ulp, 5e-4 relative). So the absolute tolerance
    scales with the output's magnitude; a wrong kernel is off by far more."""
    return 1e-5 * max(1.0, float(np.abs(want).max()))


def total(sched):
    return sum(costs.modeled_time(sched))


def bias_graph():
    """A device run with a tiny CPU weight in the middle (16 rows: below the offload batch)."""
    x = Tensor("x", (16, 512), role="input")
    w1 = Tensor("w1", (2048, 512), role="weight", backend="SIM0")
    bias = Tensor("bias", (2048,), role="weight")
    w2 = Tensor("w2", (512, 2048), role="weight", backend="SIM0")
    h = make_node("h", "mul_mat", [w1, x])
    hb = make_node("hb", "mul", [h, bias])
    y = make_node("y", "mul_mat", [w2, hb])
    y.is_output = True
    return Graph("bias", [x, w1, bias, w2], [h, hb, y], [y])


def test_cost_policy_keeps_a_cheap_op_on_the_device_to_avoid_two_copies():
    backends = [default_sim(), default_cpu()]
    g = bias_graph()
    ggml = engine.schedule(g, backends, "ggml")
    # ggml: the bias is a CPU weight, so `hb` runs on the CPU (1.wgt1): h goes down, hb comes back
    assert ggml.backend_name(g.tensor("hb")) == "CPU" and ggml.cause[g.tensor("hb")] == "1.wgt1"
    assert [i.name for s in ggml.splits for i in s.inputs] == ["x", "h", "hb"]
    cost = engine.schedule(g, backends, "cost")
    assert cost.backend_name(g.tensor("hb")) == "SIM0" and cost.cause[g.tensor("hb")] == "cost"
    assert "hb" in {n.name for n in cost.reasons}
    # all on the device; x and the 8 KiB bias are copied instead of two 128 KiB activations
    # (the CPU weight still opens a new split on the same device, as ggml's rule says)
    assert [(cost.backends[s.backend].name, [i.name for i in s.inputs]) for s in cost.splits] == [
        ("SIM0", ["x"]), ("SIM0", ["bias"])]
    assert cost.copy_bytes == 16 * 512 * 4 + 2048 * 4 < ggml.copy_bytes
    assert total(cost) < total(ggml)
    # ggml's placement by hand: the two mul_mats are bound by reading a 4 MiB weight at 1 TB/s,
    # the CPU's mul by 256 KiB + 8 KiB at 20 GB/s; three copies cross the 25 GB/s link
    mat = (2048 * 512 * 4 + 16 * 2048 * 4 + 16 * 512 * 4) / 1e12
    mul = (2 * 16 * 2048 * 4 + 2048 * 4) / 20e9
    link = 3 * 10e-6 + (16 * 512 * 4 + 2 * 16 * 2048 * 4) / 25e9
    assert cost.policy.ggml_time == pytest.approx((2 * mat + mul, link))
    assert cost.policy.kept == "cost"
    rng = np.random.default_rng(0)
    values = leaf_values(g, rng)
    plan, _ = engine.plan_memory(cost)
    got = engine.execute(cost, plan, dict(values)).outputs["y"]
    want = evaluate(g, dict(values))["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=f32_sum_tolerance(want))


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.stem)
def test_on_bundled_graphs_cost_is_never_worse_and_outputs_equal_the_reference(path):
    g = load_graph(path)
    backends = engine.resolve_backends(g, None)
    ggml = engine.schedule(g, backends, "ggml")
    cost = engine.schedule(g, backends, "cost")
    assert total(cost) <= total(ggml) + 1e-15
    values = engine.leaf_values(g)
    plan, _ = engine.plan_memory(cost, "best")
    got = engine.execute(cost, plan, dict(values)).outputs
    want = evaluate(g, dict(values))
    for name, arr in got.items():
        np.testing.assert_allclose(arr, want[name], rtol=1e-5, atol=f32_sum_tolerance(want[name]))


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: p.stem)
def test_best_planner_is_never_worse_than_ggml_and_never_overlaps(path):
    g = load_graph(path)
    sched = engine.schedule(g, engine.resolve_backends(g, None))
    plan, memory = engine.plan_memory(sched, "best")
    assert plan.overlaps() == []
    for m in memory:
        assert m.lower_bound_bytes <= m.arena_bytes <= m.ggml_arena_bytes


def brute_force_best(graph, backends):
    """Every labeling of the free nodes (2 backends), scheduled and costed exactly."""
    policy = CostPolicy(backends)
    base = Scheduler(backends).schedule(graph)
    fixed = policy._fixed(graph, base)
    free = [n for n in graph.nodes if n is owner(n) and n not in fixed and not get_op(n.op).view_op]
    best = total(base)
    for labels in itertools.product(range(len(backends)), repeat=len(free)):
        if any(not backends[b].supports_op(n.op) for n, b in zip(free, labels)):
            continue
        decided = {}
        for node in graph.nodes:
            if owner(node) in free and not get_op(node.op).view_op:
                b = labels[free.index(owner(node))]
                if not backends[b].supports_op(node.op):
                    break
                decided[node] = (b, "cost")
        else:
            best = min(best, total(Scheduler(backends).schedule(graph, decided)))
    return best, len(free)


@pytest.mark.parametrize("seed", range(25))
def test_min_cut_finds_the_optimum_of_the_model_on_small_graphs(seed):
    rng = np.random.default_rng(900 + seed)
    g = random_graph(rng, n_nodes=int(rng.integers(2, 7)), device_names=("SIM0",))
    sim = default_sim()
    sim.unsupported = frozenset(str(o) for o in rng.choice(["relu", "exp", "soft_max", "add"],
                                                            size=int(rng.integers(0, 2))))
    sim.link_bw = float(rng.choice([1e9, 25e9]))
    sim.flops = float(rng.choice([1e9, 50e12]))
    backends = [sim, default_cpu()]
    for w in g.weights:
        if w.backend is not None and any(n.view_src is w and not sim.supports_op(n.op) for n in g.nodes):
            w.backend = None
    want, n_free = brute_force_best(g, backends)
    if n_free > 10:
        pytest.skip("too many free nodes to enumerate")
    got = engine.schedule(g, backends, "cost")
    assert total(got) == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_cost_policy_never_places_a_node_where_its_source_types_are_refused():
    """The device runs `mul` by name but not on an f16 operand: the min-cut must ask per node,
    with the source types, as the scheduler does, or it would move `hb` there."""
    g = bias_graph()
    backends = [default_sim(), default_cpu()]
    assert engine.schedule(g, backends, "cost").backend_name(g.tensor("hb")) == "SIM0"
    backends[0].unsupported_types = {"mul": frozenset({"f32"})}
    cost = engine.schedule(g, backends, "cost")
    assert cost.backend_name(g.tensor("hb")) == "CPU"
