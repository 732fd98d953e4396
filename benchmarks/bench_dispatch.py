"""Per-node dispatch cost: ggmlrun's executor loop vs a plain NumPy loop, on tiny ops.

A graph of N tiny [4, 4] f32 elementwise nodes (binary add/sub/mul/div, unary tanh/neg/abs/
sqr/relu/exp, scale), built with `make_node`, scheduled on the CPU backend alone and planned
once. What is timed is `Executor.run(feed, repeat=R)`, the loop `engine.execute` runs after
binding, divided by R * N: the executor's compute loop with its per-node timing, amortised
over repeats (plan and bind excluded; they happen once, before). The baseline is the same
kernels written as a NumPy loop into preallocated outputs (`np.add(a, b, out=o)` ...).

    python benchmarks/bench_dispatch.py            # 2,000 nodes, target <= 1.5x
    python benchmarks/bench_dispatch.py --quick    # a seconds-long smoke run (CI)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import _common  # noqa: F401  (sys.path)
from _common import best_of, machine, table, us, verdict

from ggmlrun.core import engine
from ggmlrun.core.backends.spec import default_cpu
from ggmlrun.core.run.exec import Executor
from ggmlrun.core.ir.graph import Graph, LeafData, Tensor
from ggmlrun.core.ir.ops import make_node

TARGET = 1.5
SHAPE = (4, 4)
# (op, ufunc, extra args for the NumPy baseline, params)
BINARY = [("add", np.add), ("mul", np.multiply), ("sub", np.subtract), ("div", np.divide)]
UNARY = [("tanh", np.tanh, ()), ("neg", np.negative, ()), ("abs", np.abs, ()),
         ("sqr", np.square, ()), ("relu", np.maximum, (0,)), ("exp", np.exp, ())]


def build(n_nodes: int, n_inputs: int = 8):
    """The graph, and the same computation as (ufunc, sources, extra) for the NumPy loop.

    Every third node is unary, every seventh a scale; the others are binary ops on the
    previous node and an earlier one (or an input), so most nodes are used twice and the
    planner hands some of them their parent's memory in place.
    """
    leafs = [Tensor(name=f"x{i}", shape=SHAPE, role="input",
                    data=LeafData(init="uniform", keys={"low": 0.5, "high": 1.5}))
             for i in range(n_inputs)]
    nodes: list[Tensor] = []
    recipe: list[tuple] = []          # (ufunc, [source indices], extra scalar args)
    values = leafs[:]                 # everything a node may read, by index

    for i in range(n_nodes):
        prev = len(values) - 1
        if i % 7 == 6:
            node = make_node(f"n{i}", "scale", [values[prev]], {"s": 0.5})
            recipe.append((np.multiply, [prev], (np.float32(0.5),)))
        elif i % 3 == 2:
            op, fn, extra = UNARY[(i // 3) % len(UNARY)]
            node = make_node(f"n{i}", op, [values[prev]])
            recipe.append((fn, [prev], extra))
        else:
            op, fn = BINARY[i % len(BINARY)]
            other = prev - 4 if prev - 4 >= n_inputs else i % n_inputs
            node = make_node(f"n{i}", op, [values[prev], values[other]])
            recipe.append((fn, [prev, other], ()))
        nodes.append(node)
        values.append(node)
    nodes[-1].is_output = True
    graph = Graph(name="dispatch", leafs=leafs, nodes=nodes, outputs=[nodes[-1]])
    return graph, recipe


def numpy_loop(graph: Graph, recipe, leaf_values):
    """The baseline: preallocated arrays, one ufunc call per node, `out=` given."""
    arrays = [np.array(leaf_values[t]) for t in graph.leafs]
    arrays += [np.empty(SHAPE, np.float32) for _ in graph.nodes]
    base = len(graph.leafs)
    calls = [(fn, tuple(arrays[j] for j in srcs) + extra, arrays[base + k])
             for k, (fn, srcs, extra) in enumerate(recipe)]

    def run(repeat: int):
        with np.errstate(all="ignore"):
            for _ in range(repeat):
                for fn, args, out in calls:
                    fn(*args, out=out)
    return run, arrays[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--trials", type=int, default=None)
    args = ap.parse_args()
    n_nodes = args.nodes or (500 if args.quick else 2000)
    repeat = args.repeat or (20 if args.quick else 50)
    trials = args.trials or (3 if args.quick else 7)

    graph, recipe = build(n_nodes)
    backends = [default_cpu()]
    t0 = time.perf_counter()
    sched = engine.schedule(graph, backends)
    plan, _ = engine.plan_memory(sched)
    t_plan = time.perf_counter() - t0
    leaf_values = engine.leaf_values(graph)
    t0 = time.perf_counter()
    executor = Executor(sched, plan, leaf_values)
    t_bind = time.perf_counter() - t0
    feed = {t: leaf_values[t] for t in graph.inputs}

    run_numpy, numpy_out = numpy_loop(graph, recipe, leaf_values)
    # same answer, or the comparison means nothing
    result = executor.run(feed, repeat=1)
    run_numpy(1)
    np.testing.assert_allclose(result.outputs[graph.outputs[0].name], numpy_out, rtol=1e-5)

    t_exec = t_np = float("inf")
    for _ in range(trials):                # interleaved, so drift hits both sides alike
        t_exec = min(t_exec, best_of(lambda: executor.run(feed, repeat=repeat), 1))
        t_np = min(t_np, best_of(lambda: run_numpy(repeat), 1))
    t_engine = best_of(lambda: engine.execute(sched, plan, leaf_values, repeat=repeat), 1)
    per = repeat * n_nodes
    ratio = t_exec / t_np
    last = executor.run(feed, repeat=repeat)
    loop_s = sum(t.compute_s for t in last.timings) / repeat   # what the nodes' timings add up to

    print(f"bench_dispatch: {n_nodes} nodes of {list(SHAPE)} f32, CPU backend, repeat {repeat}, "
          f"best of {trials} ({machine()})")
    print(table(
        ["what", "per node (us)", "vs NumPy"],
        [["plain NumPy loop, out= preallocated", us(t_np / per), "1.00x"],
         ["ggmlrun Executor.run (compute loop)", us(t_exec / per), f"{ratio:.2f}x"],
         ["ggmlrun engine.execute (incl. bind)", us(t_engine / per), f"{t_engine / t_np:.2f}x"],
         ["  its per-node timings, summed", us(loop_s / n_nodes), ""]]))
    print(f"once per graph: schedule+plan {t_plan * 1e3:.1f} ms, bind {t_bind * 1e3:.1f} ms")
    print(f"target Executor.run <= {TARGET}x NumPy: {verdict(ratio <= TARGET)} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
