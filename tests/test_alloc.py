"""The graph allocator: ggml's free-block rules, and the properties every plan must keep."""

import numpy as np
import pytest

from ggmlrun.core import engine
from ggmlrun.core.memory.alloc import FreeBlocks, GraphAllocator
from ggmlrun.core.memory.sequence import AllocationSequence
from ggmlrun.core.backends.spec import default_cpu
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import get_op, make_node
from ggmlrun.core.run.reference import evaluate
from tests.randgraph import leaf_values, random_graph


def cpu_only(alignment=32):
    cpu = default_cpu()
    cpu.alignment = alignment
    return [cpu]


def plan_of(graph, backends=None):
    sched = engine.schedule(graph, backends or cpu_only())
    plan, memory = engine.plan_memory(sched)
    return sched, plan, memory


# --- the free-block allocator -----------------------------------------------------------------
def test_best_fit_prefers_the_smallest_block_that_fits_and_later_on_ties():
    fb = FreeBlocks(alignment=1)
    offs = [fb.alloc(s) for s in (100, 10, 50, 10, 30)]
    assert offs == [0, 100, 110, 160, 170]
    fb.free(100, 10)          # a 10-byte hole at 100
    fb.free(160, 10)          # another at 160
    assert fb.alloc(10) == 160   # equal fits: ggml takes the later block (<=)
    assert fb.alloc(10) == 100
    assert fb.alloc(5) == 200    # no hole left but the tail


def test_tail_block_is_last_resort_and_merges_on_free():
    fb = FreeBlocks(alignment=16)
    a, b, c = fb.alloc(20), fb.alloc(40), fb.alloc(8)
    assert (a, b, c) == (0, 32, 80)
    fb.free(a, 20)
    fb.free(b, 40)            # merges with the hole at 0: one 80-byte block
    assert fb.blocks[0] == [0, 80]
    assert fb.alloc(64) == 0  # best fit reuses it
    assert fb.high_water == 96


# --- hand-made cases, worked out by hand --------------------------------------------------------
def chain_graph():
    x = Tensor("x", (4, 8), role="input")
    a = make_node("a", "relu", [x])        # x has one consumer, is an input: in place allowed
    b = make_node("b", "scale", [a], {"s": 2.0})
    c = make_node("c", "sum_rows", [b])    # not an in-place op
    d = make_node("d", "add", [b, c])      # b has two consumers (c, d): d can reuse b at d's turn
    d.is_output = True
    return Graph("chain", [x], [a, b, c, d], [d])


def test_inplace_chain_by_hand():
    g = chain_graph()
    _, plan, memory = plan_of(g)
    pairs = [(n.name, p.name) for n, p in plan.inplace]
    # a takes x's slot, b takes a's; c is not in-place; d takes b's slot (c was b's other consumer
    # and has run before d, so b's only remaining child is d)
    assert pairs == [("a", "x"), ("b", "a"), ("d", "b")]
    # two slots: x/a/b/d (128 B) and c (16 B -> 32 aligned)
    assert memory[0].arena_bytes == 128 + 32
    assert plan.overlaps() == []


def test_view_parent_is_never_reused_in_place():
    """ggml 0.15.3: a view never counts as 'own' memory, so its consumer gets a fresh slot."""
    x = Tensor("x", (4, 8), role="input")
    h = make_node("h", "sqr", [x])
    v = make_node("v", "reshape", [h], {"shape": [32]})
    r = make_node("r", "relu", [v])
    r.is_output = True
    _, plan, _ = plan_of(Graph("g", [x], [h, v, r], [r]))
    assert [(n.name, p.name) for n, p in plan.inplace] == [("h", "x")]


def test_outputs_are_never_reused_nor_freed():
    x = Tensor("x", (4, 8), role="input")
    a = make_node("a", "exp", [x])
    b = make_node("b", "neg", [a])
    a.is_output = b.is_output = True
    _, plan, _ = plan_of(Graph("g", [x], [a, b], [a, b]))
    assert [(n.name, p.name) for n, p in plan.inplace] == [("a", "x")]
    assert plan.slot_of[a].died is None and plan.slot_of[b].died is None


def test_output_view_keeps_its_source_alive():
    """Unlike ggml 0.15.3, which frees the source and loses such an output."""
    x = Tensor("x", (4, 8), role="input")
    h = make_node("h", "sqr", [x])
    v = make_node("v", "transpose", [h])
    z = make_node("z", "exp", [x])          # would otherwise land on h's freed bytes
    v.is_output = True
    z.is_output = True
    g = Graph("g", [x], [h, v, z], [v, z])
    sched, plan, _ = plan_of(g)
    assert plan.slot_of[h].died is None
    values = {x: np.arange(32, dtype=np.float32).reshape(4, 8)}
    out = engine.execute(sched, plan, values).outputs
    np.testing.assert_array_equal(out["v"], (values[x] ** 2).T)


def test_weights_are_never_in_the_arena():
    x = Tensor("x", (4, 8), role="input")
    w = Tensor("w", (8, 8), role="weight")
    h = make_node("h", "mul_mat", [w, x])
    h.is_output = True
    _, plan, memory = plan_of(Graph("g", [x, w], [h], [h]))
    assert w not in plan.slot_of
    assert memory[0].weights_bytes == 256
    assert memory[0].arena_bytes == 128 + 128


# --- properties over many random graphs ----------------------------------------------------------
def expected_inplace_candidates(graph: Graph, plan) -> None:
    """Check each in-place decision against ggml's conditions, computed from the graph itself."""
    consumers: dict[Tensor, list[int]] = {}
    for i, node in enumerate(graph.nodes):
        for src in node.src:
            consumers.setdefault(src, []).append(i)
    views: dict[Tensor, list[Tensor]] = {}
    for n in graph.nodes:
        if n.view_src is not None:
            views.setdefault(n.view_src, []).append(n)
    order = {n: i for i, n in enumerate(graph.nodes)}
    pinned = {o for o in graph.outputs} | {o.view_src for o in graph.outputs if o.view_src}
    taken = set()
    decided = {node: parent for node, parent in plan.inplace}
    for node in graph.nodes:
        if not get_op(node.op).inplace:
            assert node not in decided
            continue
        i = order[node]
        allowed = []
        for parent in node.src:
            remaining = [j for j in consumers[parent] if j >= i]
            ok = (not parent.is_view and parent.role != "weight" and parent not in pinned
                  and parent not in taken and node.same_layout(parent)
                  and len(remaining) == 1
                  and all(consumers.get(v) and max(consumers[v]) < i for v in views.get(parent, []))
                  and all(j < i for j in consumers[parent] if j != i) and
                  consumers[parent].count(i) == 1)
            if ok:
                allowed.append(parent)
        if allowed:
            assert decided.get(node) is allowed[0], (node, allowed, decided.get(node))
            taken.add(allowed[0])
        else:
            assert node not in decided, node


@pytest.mark.parametrize("seed", range(150))
def test_random_plans_never_overlap_and_follow_ggml_inplace_rules(seed):
    rng = np.random.default_rng(seed)
    g = random_graph(rng, n_nodes=int(rng.integers(3, 16)), device_names=())
    for alignment in (1, 32, 64):
        _, plan, memory = plan_of(g, cpu_only(alignment))
        assert plan.overlaps() == []
        assert memory[0].arena_bytes >= memory[0].lower_bound_bytes
        assert memory[0].no_reuse_bytes >= memory[0].arena_bytes
        for slot in plan.slots:
            assert slot.offset % alignment == 0
    expected_inplace_candidates(g, plan)


@pytest.mark.parametrize("seed", range(60))
def test_random_planned_runs_equal_the_reference(seed):
    rng = np.random.default_rng(1000 + seed)
    g = random_graph(rng, n_nodes=int(rng.integers(3, 16)), device_names=())
    values = leaf_values(g, rng)
    sched, plan, _ = plan_of(g, cpu_only(64))
    got = engine.execute(sched, plan, dict(values)).outputs
    want = evaluate(g, dict(values))
    for name, arr in got.items():
        np.testing.assert_allclose(arr, want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_wrong_plan_gives_wrong_numbers():
    """The arena is real: put two live tensors on the same bytes and the result changes."""
    g = chain_graph()
    sched, plan, _ = plan_of(g)
    x = g.inputs[0]
    values = {x: np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)}
    good = engine.execute(sched, plan, values).outputs["d"]
    c, b = g.tensor("c"), g.tensor("b")
    plan.slot_of[c].offset = plan.slot_of[b].offset     # c now overwrites b before d reads it
    bad = engine.execute(sched, plan, values).outputs["d"]
    assert not np.allclose(good, bad)


def test_allocator_entries_api_direct():
    """The allocator takes any sequence: a dependency entry keeps a source alive until it."""
    x = Tensor("x", (16,), role="input")
    a = make_node("a", "relu", [x])
    b = make_node("b", "cont", [x])
    alloc = GraphAllocator([1])
    sequence = AllocationSequence()
    sequence.add(a, [x], 0)
    sequence.add(x, [x], 0, dependency=True)
    sequence.add(b, [a], 0)
    plan = alloc.plan([(x, 0)], sequence)
    # x has two consumers (a and the dependency): a cannot take x's slot
    assert plan.inplace == []
    assert plan.slot_of[x].died is not None
