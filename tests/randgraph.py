"""Small random graphs for property tests: every op family, views, cpy into a cache, pins."""

from __future__ import annotations

import numpy as np

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import make_node

R, C = 4, 8
UNARY = ["neg", "abs", "sqr", "relu", "silu", "sigmoid", "tanh", "gelu", "exp"]
BINARY = ["add", "sub", "mul"]


def random_graph(rng: np.random.Generator, n_nodes: int = 12, device_names=("SIM0",)) -> Graph:
    """A graph of main-shape [R, C] tensors mixing in-place ops, views, reductions and copies."""
    x = Tensor("x", (R, C), role="input")
    x2 = Tensor("x2", (R, C), role="input")
    leafs = [x, x2]
    pool = [x, x2]
    weights = []
    for i in range(3):
        where = rng.choice([None, *device_names]) if device_names else None
        w = Tensor(f"w{i}", (C, C) if i < 2 else (R, C), role="weight",
                   backend=None if where is None else str(where))
        weights.append(w)
    cache = Tensor("cache", (2 * R, C), role="weight")
    leafs += weights + [cache]
    nodes: list[Tensor] = []

    def add(name, op, srcs, **params):
        node = make_node(name, op, srcs, params)
        nodes.append(node)
        return node

    for i in range(n_nodes):
        kind = rng.integers(0, 9)
        a = pool[rng.integers(len(pool))]
        name = f"n{i}"
        if kind == 0:
            node = add(name, str(rng.choice(BINARY)), [a, pool[rng.integers(len(pool))]])
        elif kind == 1:
            node = add(name, str(rng.choice(UNARY)), [a])
        elif kind == 2:
            node = add(name, "scale", [a], s=float(rng.uniform(-2, 2)))
        elif kind == 3:
            node = add(name, "mul_mat", [weights[rng.integers(2)], a])
        elif kind == 4:   # a view chain that comes back to the main shape
            v = add(name + "_v", "reshape", [a], shape=[R * 2, C // 2])
            u = add(name + "_u", str(rng.choice(["relu", "sqr", "cont"])), [v])
            node = add(name, "reshape", [u], shape=[R, C])
        elif kind == 5:
            t = add(name + "_t", "transpose", [a])
            c = add(name + "_c", "cont", [t])
            node = add(name, "transpose", [c])
            node = add(name + "_back", "cont", [node])
        elif kind == 6:   # broadcast add of a row vector and a reduction
            r = add(name + "_r", "sum_rows", [a])
            node = add(name, "sub", [a, r if rng.integers(2) else weights[2]])
        elif kind == 7:   # norm family
            node = add(name, str(rng.choice(["rms_norm", "norm", "soft_max"])), [a])
        else:             # write into half of the cache, read it back through a view
            off = int(rng.integers(2)) * R * C * 4
            slot = add(name + "_slot", "view", [cache], shape=[R, C], offset=off)
            add(name + "_store", "cpy", [a, slot])
            node = add(name, "view", [cache], shape=[R, C], offset=off)
            node = add(name + "_read", "add", [node, a])
        pool.append(node)
    outputs = [nodes[-1]]
    for node in nodes[:-1]:
        if rng.random() < 0.15 and node not in outputs:
            outputs.append(node)
    for node in outputs:
        node.is_output = True
    return Graph("random", leafs, nodes, outputs)


def random_backends(rng: np.random.Generator, graph: Graph) -> list[BackendSpec]:
    """1 to 3 backends: sims with random unsupported ops, then the CPU; random pins on nodes."""
    from ggmlrun.core.backends.spec import default_cpu, default_sim

    n_sims = int(rng.integers(0, 3))
    sims = []
    ops = sorted({n.op for n in graph.nodes})
    for i in range(n_sims):
        sim = default_sim(f"SIM{i}")
        sim.unsupported = frozenset(str(o) for o in rng.choice(ops, size=int(rng.integers(0, 3))))
        sim.offload_min_batch = int(rng.choice([1, 4, 32]))
        sims.append(sim)
    backends = sims + [default_cpu()]
    names = {b.name for b in backends}
    for leaf in graph.weights:
        if leaf.backend is not None and leaf.backend not in names:
            leaf.backend = None
    for leaf in graph.weights:   # a weight's backend must be able to run whatever writes to it
        if leaf.backend is not None:
            writer_ops = {n.op for n in graph.nodes if n.view_src is leaf}
            spec = next(b for b in backends if b.name == leaf.backend)
            if any(not spec.supports_op(op) for op in writer_ops):
                leaf.backend = None
    for node in graph.nodes:
        if node.view_src is None and rng.random() < 0.1:
            options = [b.name for b in backends if b.supports_op(node.op)]
            node.backend = str(rng.choice(options))
    return backends


def leaf_values(graph: Graph, rng: np.random.Generator) -> dict[Tensor, np.ndarray]:
    return {t: rng.standard_normal(t.shape).astype(t.np_dtype) for t in graph.leafs}


def fan_out(n: int) -> str:
    """A graph file with n tensors live at once: n negations of x, then summed in a chain (the
    planner's worst case: every pair of the first n lifetimes overlaps)."""
    lines = ["name: fan", "tensors:", "  x: {shape: [4], role: input}", "nodes:"]
    lines += [f"  - {{name: a{i}, op: neg, src: [x]}}" for i in range(n)]
    lines.append("  - {name: s1, op: add, src: [a0, a1]}")
    lines += [f"  - {{name: s{i}, op: add, src: [s{i - 1}, a{i}]}}" for i in range(2, n)]
    return "\n".join(lines) + "\n"
