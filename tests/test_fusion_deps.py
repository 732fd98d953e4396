"""ggml-cuda's fusion dependencies where a fused top-k router ends its split (the "edge").

ggml_backend_cuda_graph_optimize keeps the router's tensors alive until the node after the
fused run, `cgraph->nodes[i + ops.size()]`; a split's graph is a view into the whole graph, so
when the run is the split's last node that is the next split's first node, and ggml's graph
copy puts the dependency after it there, behind the next split's input copies. None of the
recorded configurations has such a run (docs/models.md, CUDA section), so it is built here:
a router on CUDA0 ending its split, then a MUL_MAT_ID whose CPU experts op offload copies in
(a weight on the CPU starts a new split on the same backend).
"""

from __future__ import annotations

from pathlib import Path

from ggmlrun.core import engine
from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import make_node
from ggmlrun.core.memory.alloc import GraphAllocator
from ggmlrun.core.memory.sequence import allocation_sequence

BACKENDS = Path(__file__).resolve().parents[1] / "graphs" / "backends"
T, E, U, D, F = 32, 8, 2, 64, 64          # tokens, experts, experts used, width, expert rows


def router_then_experts() -> tuple[Graph, dict[str, Tensor]]:
    x = Tensor("x", (T, D), role="input")
    w_inp = Tensor("gate_inp", (E, D), role="weight", backend="CUDA0")
    exps = Tensor("up_exps", (E, F, D), dtype="f16", role="weight")          # on the CPU
    x3 = make_node("x3", "reshape", [x], {"shape": (T, 1, D)})
    logits = make_node("logits", "mul_mat", [w_inp, x])
    probs = make_node("probs", "soft_max", [logits])
    probs3 = make_node("probs3", "reshape", [probs], {"shape": (T, E, 1)})
    order = make_node("argsort", "argsort", [probs], {"order": "desc"})
    topk = make_node("topk", "view", [order], {"shape": (T, U), "strides": order.strides})
    weights = make_node("weights", "get_rows", [probs3, topk])
    up = make_node("up", "mul_mat_id", [exps, x3, topk])
    out = make_node("out", "mul", [up, weights])
    out.is_output = True
    nodes = [x3, logits, probs, probs3, order, topk, weights, up, out]
    g = Graph("edge", [x, w_inp, exps], nodes, [out], ggml_leaf_order=True)
    return g, {t.name: t for t in nodes}


def plan(backends_file: str):
    g, named = router_then_experts()
    sched = engine.schedule(g, load_backends(BACKENDS / backends_file))
    leafs, seq = allocation_sequence(sched)
    return sched, seq, GraphAllocator([b.alignment for b in sched.backends]).plan(leafs, seq), named


def test_the_router_ends_its_split_and_the_experts_open_the_next():
    sched, _, _, named = plan("llamacpp_cuda.yaml")
    first, second = (s for s in sched.splits
                     if named["weights"] in s.nodes or named["up"] in s.nodes)
    assert first.nodes[-1] is named["weights"] and second.nodes[0] is named["up"]
    assert first.backend == second.backend == 0 and second.copy_of   # the experts' copy


def test_the_dependency_follows_the_next_splits_first_node():
    """ggml's graph copy: the next split's input copy, its first node, then the op-NONE node
    keeping every fused node and its sources (ggml_backend_cuda_graph_optimize's order)."""
    _, seq, _, named = plan("llamacpp_cuda.yaml")
    at = seq.tensors.index(named["up"])
    assert at + 1 in seq.dependencies
    kept = [t.name for t in seq.srcs[at + 1]]
    assert kept == ["probs", "logits", "probs3", "argsort", "topk", "weights"]
    assert "CUDA0#up_exps" in [t.name for t in seq.tensors[:at]]   # the copy came before
    _, plain, _, named = plan("llamacpp_cuda_nofusion.yaml")      # `fusion: false`: none
    assert plain.tensors[plain.tensors.index(named["up"]) + 1] is named["out"]


def test_it_keeps_the_router_alive_through_the_expert_copy():
    """So the copy cannot take the router's memory: the kept logits and probs die after it."""
    arenas = []
    for backends, outlives in (("llamacpp_cuda.yaml", True),
                               ("llamacpp_cuda_nofusion.yaml", False)):
        _, _, memory, named = plan(backends)
        copy_born = next(s.born for s in memory.slots if s.tensors[0].name == "CUDA0#up_exps")
        for name in ("logits", "probs"):
            assert (memory.slot_of[named[name]].died > copy_born) == outlives, (backends, name)
        arenas.append(memory.arena_bytes[0])
    assert arenas == [99328, 91392]
