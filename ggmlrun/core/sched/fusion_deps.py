"""The allocation dependencies ggml-cuda's graph_optimize adds for the fusions it will make.

ggml_backend_sched_split_graph (ggml-backend.cpp) calls each split's backend's graph_optimize
with an add_alloc_dep(tensor, until) callback; ggml's graph copy then puts, right after the node
`until`, GGML_OP_NONE nodes whose srcs are the kept tensors (GGML_MAX_SRC = 10 a node), so the
allocator frees none of them before `until`. ggml_backend_cuda_graph_optimize (ggml-cuda.cu,
unless GGML_CUDA_DISABLE_FUSION is set) adds them for two fusions of a mixture of experts:

- the weighted sum of the experts (ggml_cuda_match_moe_weighted_reduction): MUL (experts x
  router weights; or (experts x expert scale) x weights), the n_expert_used views of it and
  the n_expert_used - 1 ADDs: experts, weights and the scale are kept until the last ADD;
- the top-k router (ggml_cuda_topk_moe_fusion, not the delayed soft_max of gpt-oss): soft_max
  or sigmoid, RESHAPE, (ADD of the selection bias), ARGSORT, VIEW, GET_ROWS, then optionally
  the weights' normalization (RESHAPE, SUM_ROWS, CLAMP, DIV, RESHAPE) and SCALE: every node of
  it and each of their srcs are kept until the node after it; only when
  ggml_cuda_should_use_topk_moe agrees (n_expert a power of two up to 512, or 288 or 576;
  contiguous logits and weights; a soft_max of scale 1 without mask or sinks).

`until` is the node after the fused run in the whole graph: the run lies inside its split
(ggml_can_fuse_subgraph stops at the split's end), but when it ends the split, `until` is the
next split's first node (`after` here), and the graph copy (memory/alloc.py) keeps the
tensors alive into that split, behind its input copies.

Measured on an NVIDIA H200 (tests/data/llamacpp/figures_cuda_moe*.json): these dependencies
change the GPU's compute buffer in 155 of 257 MoE configurations.
"""

from __future__ import annotations

from ggmlrun.core.ir.graph import Tensor

MAX_SRC = 10                               # GGML_MAX_SRC
MAX_EXPERTS = 15                           # MOE_WEIGHTED_REDUCTION_MAX_EXPERTS
VIEW_OPS = ("view", "reshape", "permute", "transpose")


def ne(t: Tensor) -> list[int]:
    return (list(reversed(t.shape)) + [1, 1, 1, 1])[:4]


def nb(t: Tensor) -> list[int]:
    strides = list(reversed(t.strides))
    for _ in range(4 - len(strides)):
        strides.append((strides[-1] * ne(t)[len(strides) - 1]) if strides else t.itemsize)
    return strides


def alloc_deps(nodes: list[Tensor], srcs: list[list[Tensor]], use_count: dict[Tensor, int],
               after: Tensor | None) -> dict[Tensor, list[Tensor]]:
    """One split's nodes (view nodes included) and their srcs as the scheduler left them
    (copies in place of other backends' tensors) -> for each node `until`, the tensors kept
    alive until it, in ggml's order. `after`: the graph's node after the split."""
    deps: dict[Tensor, list[Tensor]] = {}
    src_of = dict(zip(map(id, nodes), srcs))
    n = len(nodes)

    def src(t: Tensor, k: int) -> Tensor | None:
        s = src_of.get(id(t), t.src)
        return s[k] if k < len(s) else None

    def keep(tensor: Tensor | None, until: Tensor | None) -> None:
        if tensor is None or until is None:
            return
        kept = deps.setdefault(until, [])
        if not any(k is tensor for k in kept):
            kept.append(tensor)

    def can_fuse(start: int, count: int, ops: list[str], outputs: list[int]) -> bool:
        """ggml_can_fuse_subgraph: the ops match, and every node but the outputs is used only
        inside the subgraph (no graph output), its view sources inside it or constant."""
        if start + count > n:
            return False
        inside = nodes[start:start + count]
        for k, node in enumerate(inside):
            if node.op != ops[k]:
                return False
            if start + k in outputs:
                continue
            if node.is_output:
                return False
            uses = sum(1 for other in inside[k + 1:] for s in src_of.get(id(other), other.src)
                       if s is node)
            if uses != use_count.get(node, 0):
                return False
            if node.view_src is not None and node.view_src.op is not None \
                    and not any(node.view_src is t for t in inside):
                return False
        return True

    i = 0
    while i < n:
        match = weighted_reduction(nodes, i, src, can_fuse)
        if match is not None:
            experts, scale, weights, dst, count = match
            keep(experts, dst)
            keep(weights, dst)
            keep(scale, dst)
            i += count - 1
        node = nodes[i]
        if node.op in ("soft_max", "sigmoid", "softplus", "argsort"):
            fused = topk_moe(nodes, i, src)
            if fused is not None:
                ops, outs, logits, weights, ids = fused
                if can_fuse(i, len(ops), ops, outs) \
                        and should_use_topk_moe(node, logits, weights, ids):
                    last = i + len(ops)
                    until = nodes[last] if last < n else after
                    for k in range(i, last):
                        keep(nodes[k], until)
                        for s in src_of.get(id(nodes[k]), nodes[k].src):
                            keep(s, until)
                    i += len(ops) - 1
        i += 1
    return deps


def weighted_reduction(nodes, i, src, can_fuse):
    first = nodes[i]
    if first.op != "mul" or first.dtype != "f32" or not first.is_contiguous:
        return None

    def split_mul(mul):
        def is_weights(t):
            return t is not None and t.dtype == "f32" and t.is_contiguous and ne(t)[0] == 1 \
                and ne(t)[1:] == ne(mul)[1:]

        def is_experts(t):
            return t is not None and t.dtype == "f32" and t.is_contiguous and ne(t) == ne(mul)

        a, b = src(mul, 0), src(mul, 1)
        if is_experts(a) and is_weights(b):
            return a, b
        if is_experts(b) and is_weights(a):
            return b, a
        return None

    weighted, experts, scale, weights, muls = first, None, None, None, 1
    if i + 1 < len(nodes):
        second = nodes[i + 1]
        if second.op == "mul" and second.dtype == "f32" and second.is_contiguous:
            outer, inner = split_mul(second), split_mul(first)
            if outer and inner and outer[0] is first:
                weighted, (experts, scale), weights, muls = second, inner, outer[1], 2
    if experts is None:
        pair = split_mul(first)
        if pair is None:
            return None
        experts, weights = pair
    used, n_tokens = ne(weighted)[1], ne(weighted)[2] * ne(weighted)[3]
    if used < 2 or used > MAX_EXPERTS or n_tokens <= 0:
        return None
    count = 2 * used + muls - 1
    if i + count > len(nodes):
        return None
    ops = ["mul"] * muls
    views: list[Tensor] = []
    previous, adds = None, 0
    wne, wnb = ne(weighted), nb(weighted)
    for k in range(muls, count):
        c = nodes[i + k]
        ops.append(c.op)
        if c.op == "view":
            if len(views) >= used or src(c, 0) is not weighted or c.view_src is not weighted \
                    or c.dtype != "f32" or ne(c) != [wne[0], n_tokens, 1, 1] \
                    or nb(c)[0] != wnb[0] or nb(c)[1] != wnb[2] \
                    or c.view_offset != len(views) * wnb[1]:
                return None
            views.append(c)
            continue
        if c.op != "add" or len(views) < 2 or adds + 1 >= len(views):
            return None
        lhs = views[0] if adds == 0 else previous
        if src(c, 0) is not lhs or src(c, 1) is not views[adds + 1] or c.dtype != "f32":
            return None
        previous, adds = c, adds + 1
    if len(views) != used or adds != used - 1 or previous is None:
        return None
    if not previous.is_contiguous or ne(previous) != [wne[0], n_tokens, 1, 1]:
        return None
    if not can_fuse(i, count, ops, [i + count - 1]):
        return None
    return experts, scale, weights, nodes[i + count - 1], count


def topk_moe(nodes, i, src):
    """ggml_cuda_topk_moe_fusion's pattern from node i, as graph_optimize builds its op list
    (the delayed soft_max form adds no dependency): (ops, output indices, logits, weights,
    ids), or None."""
    n = len(nodes)
    gate = nodes[i]
    if gate.op == "argsort":
        return None
    j = i
    if gate.op == "softplus":
        if not (j + 1 < n and nodes[j + 1].op == "sqrt" and src(nodes[j + 1], 0) is gate):
            return None
        j += 1
    ops = [gate.op] + (["sqrt"] if j > i else [])
    i_probs = j
    j += 1
    if j >= n or nodes[j].op != "reshape" or src(nodes[j], 0) is not nodes[j - 1]:
        return None
    probs_reshaped = nodes[j]
    j += 1
    if j >= n:
        return None
    bias = nodes[j].op == "add" and src(nodes[j], 0) is nodes[j - 2]
    if bias:
        j += 1
    if j >= n or nodes[j].op != "argsort":
        return None
    if src(nodes[j], 0) is not nodes[j - 1 if bias else j - 2]:
        return None
    j += 1
    if j >= n or nodes[j].op != "view" or src(nodes[j], 0) is not nodes[j - 1]:
        return None
    j += 1
    if j >= n or nodes[j].op != "get_rows" or src(nodes[j], 0) is not probs_reshaped \
            or src(nodes[j], 1) is not nodes[j - 1]:
        return None
    ops += ["reshape"] + (["add"] if bias else []) + ["argsort", "view", "get_rows"]
    ids_at = i_probs + (4 if bias else 3)
    j += 1
    # the weights' normalization and scale, where they follow
    norm = broken = False
    if j < n and nodes[j].op == "reshape" and src(nodes[j], 0) is nodes[j - 1]:
        seq = ["reshape", "sum_rows", "clamp"]
        k = j
        ok = True
        for op in seq:
            if k < n and nodes[k].op == op and src(nodes[k], 0) is nodes[k - 1]:
                k += 1
            else:
                ok = False
                break
        if ok and k < n and nodes[k].op == "div" and src(nodes[k], 1) is nodes[k - 1] \
                and src(nodes[k], 0) is nodes[k - 3]:
            k += 1
            if k < n and nodes[k].op == "reshape" and src(nodes[k], 0) is nodes[k - 1]:
                norm, j = True, k + 1
        broken = not norm          # the matcher returns there: no scale looked for
    if norm:
        ops += ["reshape", "sum_rows", "clamp", "div", "reshape"]
    if not broken and j < n and nodes[j].op == "scale" and src(nodes[j], 0) is nodes[j - 1]:
        ops.append("scale")
    weights_at = i + len(ops) - 1
    if weights_at >= n:
        return None
    return ops, [ids_at, weights_at], src(gate, 0), nodes[weights_at], nodes[ids_at]


def should_use_topk_moe(gate: Tensor, logits: Tensor | None, weights: Tensor, ids: Tensor) -> bool:
    """ggml_cuda_should_use_topk_moe (topk-moe.cu)."""
    ids_nb = nb(ids)
    n_expert = ids_nb[1] // ids_nb[0]
    if ((n_expert & (n_expert - 1)) != 0 or n_expert > 512) and n_expert not in (288, 576):
        return False
    if logits is None or not weights.is_contiguous or not logits.is_contiguous:
        return False
    if gate.op == "soft_max":
        if gate.params.get("scale", 1.0) != 1.0 or gate.params.get("max_bias", 0.0) != 0.0:
            return False
        if len(gate.src) > 1 and any(s is not None for s in gate.src[1:]):
            return False
    return True
