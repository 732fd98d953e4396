"""Planning cost vs graph size: schedule + measure (engine.schedule + engine.plan_memory).

Llama-style stacks (the structure of `ggmlrun gen llama`: rms_norm, q/k/v, rope, causal
attention, swiglu FFN, residuals; about 32 nodes a layer) at tiny dims, so only the node count
grows, with the default backends (SIM0 + CPU) and partial offload: the last half of the layers
keep their weights on SIM0. Graphs are built in memory with `make_node`; loading the same
graph from its generated YAML is timed separately.

    python benchmarks/bench_scale.py            # 1k, 10k, 100k nodes; targets below
    python benchmarks/bench_scale.py --quick    # 1k and 10k only (CI smoke)
"""

from __future__ import annotations

import argparse
import gc
import math
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (sys.path)
from _common import machine, table, verdict

from ggmlrun.core import engine
from ggmlrun.core.backends.spec import default_backends
from ggmlrun.core.frontend.gen import LlamaShape, llama
from ggmlrun.core.ir.graph import Graph, LeafData, Tensor
from ggmlrun.core.frontend.loader import load_graph
from ggmlrun.core.ir.ops import make_node

PER_NODE_TARGET = 1.5      # per-node time at 100k <= 1.5x that at 1k
TOTAL_TARGET_S = 5.0       # 100k nodes planned in <= 5 s
DIM, HEADS, FFN, BATCH = 64, 4, 172, 8   # batch < 32: no op offload, a real partial split


def nodes_per_layer() -> int:
    return len(build(1).nodes)


def build(layers: int, offload: int | None = None, device: str = "SIM0") -> Graph:
    """gen.llama's graph, built directly (same names, shapes, order and placement)."""
    offload = layers // 2 if offload is None else offload
    hd = DIM // HEADS
    leafs: list[Tensor] = []
    nodes: list[Tensor] = []

    def leaf(name, shape, **keys):
        t = Tensor(name=name, shape=tuple(shape), dtype=keys.pop("dtype", "f32"),
                   role=keys.pop("role", "weight"), backend=keys.pop("backend", None),
                   data=LeafData(init=keys.pop("init"), keys=keys))
        leafs.append(t)
        return t

    def node(name, op, *srcs, **params):
        n = make_node(name, op, list(srcs), params)
        nodes.append(n)
        return n

    x = leaf("x", [BATCH, DIM], role="input", init="randn", mean=0.0, scale=1.0)
    pos = leaf("pos", [BATCH], dtype="i32", role="input", init="arange", start=0, step=1)
    wscale = 1.0 / math.sqrt(DIM)
    for layer in range(layers):
        p = f"l{layer}."
        where = {"backend": device} if layer >= layers - offload else {}
        w = {}
        for key, shp in (("attn_norm", [DIM]), ("wq", [DIM, DIM]), ("wk", [DIM, DIM]),
                         ("wv", [DIM, DIM]), ("wo", [DIM, DIM]), ("ffn_norm", [DIM]),
                         ("ffn_gate", [FFN, DIM]), ("ffn_up", [FFN, DIM]),
                         ("ffn_down", [DIM, FFN])):
            init = {"init": "ones"} if len(shp) == 1 else {"init": "randn", "mean": 0.0,
                                                            "scale": wscale}
            w[key] = leaf(p + key, shp, **where, **init)
        n = node(p + "attn_rms", "rms_norm", x)
        n = node(p + "attn_in", "mul", n, w["attn_norm"])
        heads = {}
        for key in ("q", "k", "v"):
            m = node(p + key, "mul_mat", w["w" + key], n)
            heads[key] = node(p + key + "3", "reshape", m, shape=[BATCH, HEADS, hd])
        q = node(p + "q_rope", "rope", heads["q"], pos)
        k = node(p + "k_rope", "rope", heads["k"], pos)
        qp = node(p + "q_heads", "permute", q, axes=[1, 0, 2])
        kp = node(p + "k_heads", "permute", k, axes=[1, 0, 2])
        kq = node(p + "kq", "mul_mat", kp, qp)
        kq = node(p + "kq_scaled", "scale", kq, s=1.0 / math.sqrt(hd))
        kq = node(p + "kq_masked", "diag_mask_inf", kq)
        kq = node(p + "kq_soft", "soft_max", kq)
        vt = node(p + "v_heads_t", "permute", heads["v"], axes=[1, 2, 0])
        vt = node(p + "v_cont", "cont", vt)
        kqv = node(p + "kqv", "mul_mat", vt, kq)
        kqv = node(p + "kqv_tokens", "permute", kqv, axes=[1, 0, 2])
        kqv = node(p + "kqv_cont", "cont", kqv)
        kqv = node(p + "kqv_flat", "reshape", kqv, shape=[BATCH, DIM])
        o = node(p + "attn_out", "mul_mat", w["wo"], kqv)
        h = node(p + "attn_res", "add", o, x)
        n = node(p + "ffn_rms", "rms_norm", h)
        n = node(p + "ffn_in", "mul", n, w["ffn_norm"])
        gate = node(p + "gate", "mul_mat", w["ffn_gate"], n)
        gate = node(p + "gate_silu", "silu", gate)
        up = node(p + "up", "mul_mat", w["ffn_up"], n)
        gu = node(p + "gate_up", "mul", gate, up)
        down = node(p + "down", "mul_mat", w["ffn_down"], gu)
        x = node(p + "out", "add", down, h)
    x.is_output = True
    return Graph(name="llama", leafs=leafs, nodes=nodes, outputs=[x])


def plan(graph: Graph):
    """The timed work: ggml's scheduler passes, then the measure pass (with its bounds)."""
    sched = engine.schedule(graph, default_backends())
    _, memory = engine.plan_memory(sched)
    return sched, memory


def timed_plan(graph: Graph, trials: int):
    best, out = float("inf"), None
    for _ in range(trials):
        gc.collect()
        t0 = time.perf_counter()
        out = plan(graph)
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1k and 10k nodes only (CI smoke)")
    ap.add_argument("--yaml-nodes", type=int, default=None,
                    help="size of the YAML load figure (default: the largest size; 1,000 with "
                         "--quick; 0 skips it)")
    args = ap.parse_args()
    per_layer = nodes_per_layer()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    yaml_nodes = args.yaml_nodes if args.yaml_nodes is not None else (
        sizes[0] if args.quick else sizes[-1])

    print(f"bench_scale: llama-style stack, dim {DIM}, {per_layer} nodes a layer, SIM0 + CPU, "
          f"last half of the layers' weights on SIM0 ({machine()})")
    rows, per_node, yaml_rows = [], {}, []
    for target in sizes:
        layers = max(1, round(target / per_layer))
        t0 = time.perf_counter()
        graph = build(layers)
        t_build = time.perf_counter() - t0
        n = len(graph.nodes)
        trials = 3 if n <= 20_000 else 2
        t_plan, (sched, memory) = timed_plan(graph, trials)
        per_node[target] = t_plan / n
        arenas = ", ".join(f"{m.name} {m.arena_bytes / 2**20:.2f}" for m in memory)
        rows.append([f"{n:,}", f"{layers:,}", f"{len(sched.splits):,}", f"{sched.copy_count:,}",
                     f"{t_build:.2f}", f"{t_plan:.3f}", f"{t_plan / n * 1e6:.2f}",
                     f"{per_node[target] / per_node[sizes[0]]:.2f}x", arenas])
        if yaml_nodes and target == yaml_nodes:
            text = llama(LlamaShape(layers=layers, dim=DIM, heads=HEADS, ffn=FFN, batch=BATCH,
                                    offload=layers // 2))
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "llama.yaml"
                path.write_text(text)
                t0 = time.perf_counter()
                loaded = load_graph(path)
                t_load = time.perf_counter() - t0
            _, mem_loaded = plan(loaded)
            same = [m.arena_bytes for m in mem_loaded] == [m.arena_bytes for m in memory]
            yaml_rows.append([f"{len(loaded.nodes):,}", f"{len(text) / 2**20:.1f}",
                              f"{t_load:.2f}", f"{t_load / len(loaded.nodes) * 1e6:.1f}",
                              "same" if same else "DIFFERENT"])
            del loaded, text
        del graph, sched, memory
    print(table(["nodes", "layers", "splits", "copies", "build s", "schedule+plan s",
                 "us per node", "per node vs 1k", "arena MiB"], rows))
    if yaml_rows:
        print("loading the same graph from its generated YAML (load_graph, separate from the "
              "above):")
        print(table(["nodes", "YAML MiB", "load s", "us per node", "arenas vs built"], yaml_rows))
    big = sizes[-1]
    ratio = per_node[big] / per_node[sizes[0]]
    total = per_node[big] * big
    print(f"target per-node time at {big:,} <= {PER_NODE_TARGET}x that at {sizes[0]:,}: "
          f"{verdict(ratio <= PER_NODE_TARGET)} ({ratio:.2f}x)")
    if big == 100_000:
        print(f"target 100k nodes in <= {TOTAL_TARGET_S:.0f} s: "
              f"{verdict(total <= TOTAL_TARGET_S)} ({total:.2f} s)")


if __name__ == "__main__":
    main()
