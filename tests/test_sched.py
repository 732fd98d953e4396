"""The scheduler on small graphs whose right answer is worked out by hand from ggml's passes."""

import numpy as np
import pytest

from ggmlrun.core import engine
from ggmlrun.core.backends.spec import default_cpu, default_sim
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.run.reference import evaluate
from ggmlrun.core.ir.ops import make_node
from tests.executed import copy_problems
from tests.randgraph import leaf_values, random_backends, random_graph


def backends(*unsupported, min_batch=32):
    sim = default_sim()
    sim.unsupported = frozenset(unsupported)
    sim.offload_min_batch = min_batch
    return [sim, default_cpu()]


def placed(sched):
    return {n.name: (sched.backend_name(n), sched.cause[n]) for n in sched.graph.nodes}


def split_summary(sched):
    return [(sched.backends[s.backend].name, [n.name for n in s.nodes], [i.name for i in s.inputs])
            for s in sched.splits]


def run_matches_reference(sched, seed=0):
    rng = np.random.default_rng(seed)
    values = leaf_values(sched.graph, rng)
    plan, _ = engine.plan_memory(sched)
    result = engine.execute(sched, plan, dict(values))
    want = evaluate(sched.graph, dict(values))
    for name, arr in result.outputs.items():
        np.testing.assert_allclose(arr, want[name], rtol=1e-5, atol=1e-6)
    return result


def mlp_graph(where="SIM0", pin_last=True):
    x = Tensor("x", (32, 64), role="input")
    w1 = Tensor("w1", (128, 64), role="weight", backend=where)
    w2 = Tensor("w2", (64, 128), role="weight", backend=where)
    h = make_node("h", "mul_mat", [w1, x])
    a = make_node("a", "gelu", [h])
    y0 = make_node("y0", "mul_mat", [w2, a])
    y = make_node("y", "add", [y0, x], backend="CPU" if pin_last else None)
    y.is_output = True
    return Graph("mlp", [x, w1, w2], [h, a, y0, y], [y])


def test_full_offload_with_a_user_pin():
    sched = engine.schedule(mlp_graph(), backends())
    assert placed(sched) == {"h": ("SIM0", "1.wgt0"), "a": ("SIM0", "2.sup"),
                             "y0": ("SIM0", "1.wgt0"), "y": ("CPU", "usr")}
    assert sched.cause[sched.graph.tensor("x")] == "1.inp"
    assert split_summary(sched) == [("SIM0", ["h", "a", "y0"], ["x"]), ("CPU", ["y"], ["y0"])]
    assert sched.copy_count == 2 and sched.copy_bytes == 2 * 32 * 64 * 4
    result = run_matches_reference(sched)
    assert copy_problems(sched, result) == []


def test_without_the_pin_the_residual_add_spreads_to_the_device():
    sched = engine.schedule(mlp_graph(pin_last=False), backends())
    assert placed(sched)["y"] == ("SIM0", "2.sup")
    assert split_summary(sched) == [("SIM0", ["h", "a", "y0", "y"], ["x"])]


def test_weights_on_cpu_stay_on_cpu_below_the_offload_batch():
    sched = engine.schedule(mlp_graph(where=None, pin_last=False), backends(min_batch=33))
    assert placed(sched) == {"h": ("CPU", "1.wgt0"), "a": ("CPU", "2.sup"),
                             "y0": ("CPU", "1.wgt0"), "y": ("CPU", "2.sup")}
    assert len(sched.splits) == 1 and sched.copy_count == 0


def test_op_offload_at_exactly_the_batch_threshold():
    """32 rows of x reach offload_min_batch=32: both matmuls move to SIM0 (1.off) and the
    gelu between them follows (2.sup); the weights are copied to the device every compute.
    A second CPU weight starts a new split on the same backend (ggml does this so the memory
    of the first offloaded weight's copy can be reused)."""
    sched = engine.schedule(mlp_graph(where=None, pin_last=False), backends(min_batch=32))
    assert placed(sched) == {"h": ("SIM0", "1.off"), "a": ("SIM0", "2.sup"),
                             "y0": ("SIM0", "1.off"), "y": ("SIM0", "2.sup")}
    assert split_summary(sched) == [("SIM0", ["h", "a"], ["w1", "x"]), ("SIM0", ["y0", "y"], ["w2"])]
    run_matches_reference(sched)


def test_unsupported_op_in_the_middle_of_a_device_run():
    """gelu unsupported on SIM0: expansion leaves it unassigned, pass 3 gives it to the CPU,
    the only backend that supports it (3.best), and the device run is cut in two."""
    sched = engine.schedule(mlp_graph(pin_last=False), backends("gelu"))
    assert placed(sched) == {"h": ("SIM0", "1.wgt0"), "a": ("CPU", "3.best"),
                             "y0": ("SIM0", "1.wgt0"), "y": ("SIM0", "2.sup")}
    assert split_summary(sched) == [("SIM0", ["h"], ["x"]), ("CPU", ["a"], ["h"]),
                                    ("SIM0", ["y0", "y"], ["a"])]
    # x was copied to SIM0 in split 0; split 2 reuses that copy (one copy per tensor and backend)
    assert [c.name for c in sched.splits[2].copies] == ["SIM0#a"]
    assert sched.srcs_of[sched.graph.tensor("y")][1].name == "SIM0#x"
    result = run_matches_reference(sched)
    assert result.copied_count == 3


def test_view_of_a_weight_and_an_input():
    """A view of a device weight is pre-allocated there (1.dst: the buffer is its source's);
    the add using it has no weight source, so pass 3 picks the backend holding most sources
    (a tie, 1 each, goes to the higher priority SIM0); the input is copied in."""
    x = Tensor("x", (4, 8), role="input")
    cache = Tensor("cache", (8, 8), role="weight", backend="SIM0")
    v = make_node("v", "view", [cache], {"shape": [4, 8], "offset": 4 * 8 * 4})
    s = make_node("s", "add", [v, x])
    s.is_output = True
    sched = engine.schedule(Graph("g", [x, cache], [v, s], [s]), backends())
    assert placed(sched) == {"v": ("SIM0", "1.dst"), "s": ("SIM0", "3.best")}
    assert split_summary(sched) == [("SIM0", ["v", "s"], ["x"])]
    run_matches_reference(sched)


def test_expansion_goes_up_from_a_device_op():
    x = Tensor("x", (32, 64), role="input")
    w = Tensor("w", (64, 64), role="weight", backend="SIM0")
    r = make_node("r", "relu", [x])
    h = make_node("h", "mul_mat", [w, r])
    h.is_output = True
    sched = engine.schedule(Graph("g", [x, w], [r, h], [h]), backends())
    assert placed(sched) == {"r": ("SIM0", "2.sup"), "h": ("SIM0", "1.wgt0")}


def test_views_of_intermediates_follow_their_source():
    x = Tensor("x", (4, 8), role="input")
    h = make_node("h", "relu", [x])
    t = make_node("t", "transpose", [h])
    c = make_node("c", "cont", [t])
    c.is_output = True
    sched = engine.schedule(Graph("g", [x], [h, t, c], [c]), [default_cpu()])
    # nothing pins h or c: pass 3 gives them the CPU; the view takes its source's in pass 4
    assert placed(sched) == {"h": ("CPU", "3.best"), "t": ("CPU", "4.vsrc"), "c": ("CPU", "3.best")}


def test_cpy_into_a_device_cache():
    x = Tensor("x", (1, 8), role="input")
    cache = Tensor("cache", (4, 8), role="weight", backend="SIM0")
    slot = make_node("slot", "view", [cache], {"shape": [1, 8], "offset": 2 * 8 * 4})
    store = make_node("store", "cpy", [x, slot])
    read = make_node("read", "view", [cache], {"shape": [4, 8]})
    out = make_node("out", "sum_rows", [read])
    out.is_output = True
    sched = engine.schedule(Graph("g", [x, cache], [slot, store, read, out], [out]), backends())
    assert placed(sched)["store"] == ("SIM0", "1.dst")
    result = run_matches_reference(sched)
    assert result.outputs["out"].shape == (4, 1)


def test_pin_to_a_backend_without_the_op_is_an_input_error():
    g = mlp_graph()
    g.tensor("a").backend = "SIM0"
    with pytest.raises(InputError, match="does not support op 'gelu'"):
        engine.schedule(g, backends("gelu"))


def test_writing_into_a_weight_whose_backend_lacks_the_op_is_an_input_error():
    x = Tensor("x", (1, 8), role="input")
    cache = Tensor("cache", (4, 8), role="weight", backend="SIM0")
    slot = make_node("slot", "view", [cache], {"shape": [1, 8]})
    store = make_node("store", "cpy", [x, slot])
    with pytest.raises(InputError, match="lives on SIM0"):
        engine.schedule(Graph("g", [x, cache], [slot, store], [store]), backends("cpy"))


def test_unknown_backend_names_the_alternatives():
    g = mlp_graph(where="GPU7")
    with pytest.raises(InputError, match="unknown backend 'GPU7'.*known: "):
        engine.schedule(g, backends())


@pytest.mark.parametrize("seed", range(80))
def test_random_graphs_and_backend_sets_match_the_reference(seed):
    rng = np.random.default_rng(5000 + seed)
    g = random_graph(rng, n_nodes=int(rng.integers(3, 14)), device_names=("SIM0", "SIM1"))
    bk = random_backends(rng, g)
    sched = engine.schedule(g, bk)
    for node in g.nodes:
        b = sched.backends[sched.backend_of[node]]
        assert b.supports_op(node.op), (node, b.name)
        if node.backend is not None:
            assert b.name == node.backend and sched.cause[node] == "usr"
    plan, memory = engine.plan_memory(sched)
    assert plan.overlaps() == []
    for m in memory:
        assert m.arena_bytes >= m.lower_bound_bytes
    result = run_matches_reference(sched, seed)
    assert copy_problems(sched, result) == []


def test_support_is_asked_per_op_and_source_types():
    """A device that runs mul_mat on f32 but not on f16: the f16 product stays on the CPU
    (its CPU weight's backend, 1.wgt0, since no device may take it), the f32 one offloads."""
    x = Tensor("x", (32, 64), role="input")
    w32 = Tensor("w32", (64, 64), role="weight")
    w16 = Tensor("w16", (64, 64), dtype="f16", role="weight")
    a = make_node("a", "mul_mat", [w32, x])
    b = make_node("b", "mul_mat", [w16, a])
    b.is_output = True
    graph = Graph("types", [x, w32, w16], [a, b], [b])
    bk = backends()
    bk[0].unsupported_types = {"mul_mat": frozenset({"f16"})}
    assert bk[0].supports_op("mul_mat", ("f32", "f32"))
    assert not bk[0].supports_op("mul_mat", ("f16", "f32"))
    assert bk[0].supports_op("mul_mat")              # by name alone: some types are fine
    sched = engine.schedule(graph, bk)
    assert placed(sched) == {"a": ("SIM0", "1.off"), "b": ("CPU", "1.wgt0")}
    bk[0].unsupported_types = {}
    assert placed(engine.schedule(graph, bk))["b"] == ("SIM0", "1.off")
    run_matches_reference(sched)


def test_a_pin_refused_for_a_source_type_says_so():
    x = Tensor("x", (32, 64), role="input")
    w16 = Tensor("w16", (64, 64), dtype="f16", role="weight")
    b = make_node("b", "mul_mat", [w16, x], backend="SIM0")
    b.is_output = True
    bk = backends()
    bk[0].unsupported_types = {"mul_mat": frozenset({"f16"})}
    with pytest.raises(InputError, match="does not support op 'mul_mat' on sources of type f16, f32"):
        engine.schedule(Graph("pin", [x, w16], [b], [b]), bk)


def test_every_cause_the_scheduler_gives_has_a_legend():
    """plan's legend explains every cause code: over random graphs and backend sets, under
    ggml's rules and the cost policy, no node gets a code the legend lacks."""
    import numpy as np

    from ggmlrun.core.sched.policy import CostPolicy
    from ggmlrun.core.sched.schedule import cause_meaning
    from ggmlrun.core.sched.scheduler import Scheduler
    from tests.randgraph import random_backends, random_graph

    rng = np.random.default_rng(7)
    for _ in range(60):
        graph = random_graph(rng, n_nodes=int(rng.integers(4, 20)))
        backends = random_backends(rng, graph)
        schedules = [Scheduler(backends).schedule(graph)]
        schedules.append(CostPolicy(backends).place(graph).schedule)
        for sched in schedules:
            missing = {c for c in sched.cause.values() if c and cause_meaning(c) is None}
            assert not missing, missing
