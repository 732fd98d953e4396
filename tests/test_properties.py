"""Differential property tests: random graphs over the whole op set, random backend sets.

For every drawn graph and backend set: the arena-backed run equals the plain NumPy reference,
no two live tensors overlap in any arena (ggml's planner and the offline one), arenas are at
least the lower bound, and the bytes `plan` says will be copied are the bytes `run` moved.
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ggmlrun.core import engine
from ggmlrun.core.backends.spec import default_cpu, default_sim
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import make_node
from ggmlrun.core.run.reference import evaluate
from ggmlrun.core.run.exec import Executor
from ggmlrun.core.run.results import relative_error
from tests.executed import copy_problems, lifetime_problems

R, C = 4, 8
UNARY = ["neg", "abs", "sqr", "relu", "silu", "sigmoid", "tanh", "gelu", "exp"]


class Builder:
    def __init__(self, draw):
        self.draw = draw
        self.leafs: list[Tensor] = []
        self.nodes: list[Tensor] = []
        self.values: dict[Tensor, np.ndarray] = {}
        self.rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def leaf(self, name, shape, dtype="f32", role="weight", values=None, device=False):
        t = Tensor(name, shape, dtype=dtype, role=role, backend="SIM0" if device else None)
        self.leafs.append(t)
        v = values if values is not None else self.rng.standard_normal(shape)
        self.values[t] = np.asarray(v).astype(t.np_dtype)
        return t

    def node(self, op, srcs, **params):
        n = make_node(f"n{len(self.nodes)}", op, srcs, params)
        self.nodes.append(n)
        return n

    def pick(self, seq):
        return seq[self.draw(st.integers(0, len(seq) - 1))]


def step(b: Builder, pool: list[Tensor], w: dict) -> Tensor:
    a = b.pick(pool)
    if a.strides[-1] != a.itemsize:      # ggml's ops read packed rows: a transpose is cont'ed
        a = b.node("cont", [a])
    kind = b.draw(st.sampled_from([
        "unary", "binary", "tile", "div", "sqrt_log", "scale_clamp", "reduce", "argmax_rows",
        "norm", "softmax", "mask", "matmul", "batched", "transpose", "reshape", "permute",
        "window", "concat", "rope", "cache"]))
    if kind == "unary":
        return b.node(b.pick(UNARY), [a])
    if kind == "binary":
        return b.node(b.pick(["add", "sub", "mul"]), [a, b.pick(pool)])
    if kind == "tile":
        return b.node(b.pick(["add", "mul"]), [a, b.pick([w["row"], w["col"]])])
    if kind == "div":
        return b.node("div", [a, w["positive"]])
    if kind == "sqrt_log":
        return b.node(b.pick(["sqrt", "log"]), [b.node("abs", [a])])
    if kind == "scale_clamp":
        if b.draw(st.booleans()):
            return b.node("scale", [a], s=b.draw(st.floats(-2, 2, allow_nan=False)))
        return b.node("clamp", [a], min=-1.0, max=1.0)
    if kind == "reduce":
        r = b.node(b.pick(["sum_rows", "mean", "sum"]), [a])
        return b.node("sub", [a, r])
    if kind == "argmax_rows":
        idx = b.node("argmax", [a])                       # i32 [R], values in 0..C-1
        return b.node("get_rows", [w["table"], idx])      # [R, C]
    if kind == "norm":
        return b.node(b.pick(["norm", "rms_norm"]), [a])
    if kind == "softmax":
        srcs = [a, w["mask"]] if b.draw(st.booleans()) else [a]
        return b.node("soft_max", srcs, scale=0.5)
    if kind == "mask":
        return b.node("soft_max", [b.node("diag_mask_inf", [a], n_past=b.draw(st.integers(0, 2)))])
    if kind == "matmul":
        return b.node("mul_mat", [b.pick([w["sq"], w["sq16"]]), a])
    if kind == "batched":
        a3 = b.node("reshape", [b.node("cont", [a]) if not a.is_contiguous else a], shape=[2, R // 2, C])
        m = b.node("mul_mat", [w["sq3"], a3])             # a batch 1, b batch 2
        return b.node("reshape", [m], shape=[R, C])
    if kind == "transpose":
        return b.node("transpose", [b.node("cont", [b.node("transpose", [a])])])
    if kind == "reshape":
        src = a if a.is_contiguous else b.node("cont", [a])
        v = b.node("reshape", [src], shape=[C, R])
        u = b.node(b.pick(["relu", "cont", "sqr"]), [v])
        return b.node("reshape", [u], shape=[R, C])
    if kind == "permute":
        src = a if a.is_contiguous else b.node("cont", [a])
        p = b.node("permute", [b.node("reshape", [src], shape=[2, 2, C])], axes=[1, 0, 2])
        return b.node("reshape", [b.node("cont", [p])], shape=[R, C])
    if kind == "window":
        src = a if a.is_contiguous else b.node("cont", [a])
        half = b.node("view", [src], shape=[R // 2, C], offset=b.draw(st.integers(0, 1)) * (R // 2) * C * 4)
        return b.node("repeat", [half], shape=[R, C])
    if kind == "concat":
        src = a if a.is_contiguous else b.node("cont", [a])
        top = b.node("view", [src], shape=[R // 2, C])
        return b.node("concat", [top, b.node("view", [src], shape=[R // 2, C], offset=(R // 2) * C * 4)], axis=0)
    if kind == "rope":
        src = a if a.is_contiguous else b.node("cont", [a])
        r = b.node("rope", [b.node("reshape", [src], shape=[R, 2, C // 2]), w["positions"]],
                   mode=b.pick([0, 2]))
        return b.node("reshape", [r], shape=[R, C])
    # cache: write a into one half of a cache, then read that half back through a view
    off = b.draw(st.integers(0, 1)) * R * C * 4
    slot = b.node("view", [w["cache"]], shape=[R, C], offset=off)
    b.node("cpy", [a, slot])
    return b.node("add", [b.node("view", [w["cache"]], shape=[R, C], offset=off), a])


@st.composite
def graphs_and_backends(draw):
    b = Builder(draw)
    device = lambda: draw(st.booleans())  # noqa: E731 - a weight's home, drawn per weight
    w = {
        "row": b.leaf("row", (C,), device=device()),
        "col": b.leaf("col", (R, 1), device=device()),
        "positive": b.leaf("positive", (R, C), values=b.rng.uniform(1, 2, (R, C)), device=device()),
        "table": b.leaf("table", (C, C), device=device()),
        "mask": b.leaf("mask", (R, C), values=np.where(b.rng.random((R, C)) < 0.2, -np.inf, 0.0)),
        "sq": b.leaf("sq", (C, C), device=device()),
        "sq16": b.leaf("sq16", (C, C), dtype="f16", device=device()),
        "sq3": b.leaf("sq3", (1, C, C), device=device()),
        "cache": b.leaf("cache", (2 * R, C)),
    }
    w["positions"] = b.leaf("pos", (R,), dtype="i32", role="input", values=np.arange(R) * 3)
    x = b.leaf("x", (R, C), role="input")
    pool = [x]
    for _ in range(draw(st.integers(1, 10))):
        pool.append(step(b, pool, w))
    outputs = [b.nodes[-1]] + [n for n in b.nodes[:-1] if draw(st.integers(0, 9)) == 0]
    for n in outputs:
        n.is_output = True
    graph = Graph("prop", b.leafs, b.nodes, outputs)
    # 1 to 3 backends: sims with random unsupported ops (never the ops writing a device weight)
    n_sims = draw(st.integers(0, 2))
    used = sorted({n.op for n in b.nodes})
    backends = []
    for i in range(n_sims):
        sim = default_sim(f"SIM{i}")
        sim.unsupported = frozenset(draw(st.lists(st.sampled_from(used), max_size=3)))
        sim.offload_min_batch = draw(st.sampled_from([1, 2, 32]))
        backends.append(sim)
    backends.append(default_cpu())
    for t in graph.weights:
        if t.backend == "SIM0" and not n_sims:
            t.backend = None
    for node in b.nodes:
        if node.view_src is None and draw(st.integers(0, 9)) == 0:
            node.backend = draw(st.sampled_from([s.name for s in backends if s.supports_op(node.op)]))
    return graph, backends, b.values


def check(graph, backends, values, policy, planner):
    sched = engine.schedule(graph, backends, policy)
    plan, memory = engine.plan_memory(sched, planner)
    assert plan.overlaps() == []
    for m in memory:
        assert m.lower_bound_bytes <= m.arena_bytes <= m.ggml_arena_bytes
    executor = Executor(sched, plan, dict(values))
    result = executor.run({t: values[t] for t in graph.inputs})
    assert copy_problems(sched, result) == []
    assert lifetime_problems(executor) == []
    want = evaluate(graph, dict(values))
    for name, arr in result.outputs.items():
        assert relative_error(arr, want[name]) <= 1e-6, name


@given(graphs_and_backends())
def test_ggml_policy_and_planner_match_the_reference(case):
    graph, backends, values = case
    check(graph, backends, values, "ggml", "ggml")


@given(graphs_and_backends())
def test_cost_policy_and_best_planner_match_the_reference(case):
    graph, backends, values = case
    check(graph, backends, values, "cost", "best")
