"""The pieces of llama.cpp's llm_graph_context that a decoder-only graph is made of.

`GraphBuilder` mirrors ggml's graph construction: tensors are created as ggml's calls create
them (with ggml's derived names: "x (view)", "x (reshaped)", ...), `cb` renames them as
llama.cpp's callback does ("Qcur-0", "result_output"), and `expand` adds them to the graph with
ggml_visit_parents' depth-first walk, so the node order, the leaf order and the "node_%d" names
of unnamed nodes are ggml's own. Nodes are built directly from the shapes ggml computes (no
per-node shape inference: an 80-layer graph has thousands of nodes and `fit` builds several);
tests re-infer every node through the op registry to keep the two in step.

`LayerContext` holds what build_norm / build_attn need; models/graph/attention.py builds the
attention and the KV cache's views on it, models/graph/decoder.py the rest of llm_graph_context, so
an architecture is a short file of calls, as in llama.cpp's src/models/. `rs_inputs` /
`build_rs` are the recurrent state's (llm_graph_context::build_rs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ggmlrun.core.ir.graph import Graph, Tensor, contiguous_strides
from ggmlrun.core.ir.types import TYPES


def ggml_set_rows_order(src: list[Tensor]) -> list[Tensor]:
    """ggml_set_rows' src[] is (rows, indices, destination), "due to legacy reasons"."""
    return [src[1], src[2], src[0]]


def _walk_order(t: Tensor) -> list[Tensor]:
    return t.src if t.op != "set_rows" else ggml_set_rows_order(t.src)


def row_size(dtype: str, n: int) -> int:
    return TYPES[dtype].row_bytes(n)


@functools.cache
def _op_registry() -> dict:
    """The op registry (every op module), imported when the first node is built: the
    architecture modules import this one, and reading a model's header must not pay for it."""
    from ggmlrun.core.ir.ops import OPS

    return OPS


@functools.cache
def _defaults(op: str) -> dict | None:
    spec = _op_registry().get(op)
    return None if spec is None else dict(spec.params)


def _params(op: str, params: dict) -> dict:
    """Params as the op registry declares them (defaults filled in); unknown ops keep theirs.
    Each node gets its own dict (a graph of 100k nodes calls this for every one)."""
    defaults = _defaults(op)
    if defaults is None:
        return params
    out = dict(defaults)
    for k, v in params.items():
        if k in defaults:
            out[k] = v
    return out


@dataclass
class GraphBuilder:
    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    pins: list[tuple[Tensor, str, int]] = field(default_factory=list)   # (node, cb name, il)
    kqv_outs: list[Tensor] = field(default_factory=list)   # attention outputs (no flash attn)
    fa_nodes: list[tuple[Tensor, int]] = field(default_factory=list)   # (flash_attn_ext, il)
    _visited: set = field(default_factory=set)

    # --- creating tensors --------------------------------------------------------------------
    @staticmethod
    def leaf(name: str, shape, dtype: str = "f32", role: str = "input") -> Tensor:
        return Tensor(name=name, shape=tuple(shape), dtype=dtype, role=role)

    @staticmethod
    def op(kind: str, srcs: list[Tensor], dims, out_dtype: str = "f32", out_name: str = "",
           **params) -> Tensor:
        """A compute node: op `kind` with NumPy-order output dims and the op's params."""
        return Tensor(name=out_name, shape=tuple(dims), dtype=out_dtype, op=kind, src=list(srcs),
                      params=_params(kind, params))

    @staticmethod
    def _view_of(op: str, a: Tensor, layout: tuple, byte_offset: int, suffix: str,
                 **params) -> Tensor:
        """A view op on a: `layout` is (NumPy shape, byte strides)."""
        dims, steps = layout
        t = Tensor(name=f"{a.name} ({suffix})", shape=tuple(dims), dtype=a.dtype,
                   strides=tuple(steps), op=op, src=[a], params=_params(op, params))
        t.view_src = a.view_src or a
        t.view_offset = a.view_offset + byte_offset
        return t

    def view(self, a: Tensor, shape, strides, offset: int = 0) -> Tensor:
        """ggml_view_Nd: NumPy-order shape and byte strides, byte offset into a."""
        return self._view_of("view", a, (shape, strides), offset, "view",
                             shape=list(shape), offset=offset, strides=list(strides))

    def reshape(self, a: Tensor, shape) -> Tensor:
        g = TYPES[a.dtype]
        steps = contiguous_strides(tuple(shape), g.type_size, g.block_size)
        return self._view_of("reshape", a, (shape, steps), 0, "reshaped", shape=list(shape))

    def permute(self, a: Tensor, axes) -> Tensor:
        """`axes` in NumPy's transpose form (ggml_permute(0, 2, 1, 3) is [0, 2, 1, 3])."""
        layout = ([a.shape[i] for i in axes], [a.strides[i] for i in axes])
        return self._view_of("permute", a, layout, 0, "permuted", axes=list(axes))

    def transpose(self, a: Tensor) -> Tensor:
        """ggml_transpose: the last two dims swapped, named "a (transposed)"."""
        layout = ((*a.shape[:-2], a.shape[-1], a.shape[-2]),
                  (*a.strides[:-2], a.strides[-1], a.strides[-2]))
        return self._view_of("transpose", a, layout, 0, "transposed")

    def scale_inplace(self, a: Tensor, s: float) -> Tensor:
        """ggml_scale_inplace: a SCALE node that is a view of a ("a (view)"), writing a's bytes."""
        t = Tensor(name=f"{a.name} (view)", shape=a.shape, dtype=a.dtype, strides=a.strides,
                   op="scale", src=[a], params=_params("scale", {"s": s}))
        t.view_src = a.view_src or a
        t.view_offset = a.view_offset
        return t

    def cpy(self, a: Tensor, dst: Tensor) -> Tensor:
        """ggml_cpy(a, dst): a view of dst named "dst (copy of a)" (a's name when it is made:
        empty for a node not yet named)."""
        name = f"{dst.name} (copy of {a.name})" if dst.name else f"{a.name} (copy)"
        t = Tensor(name=name, shape=dst.shape, dtype=dst.dtype, strides=dst.strides, op="cpy",
                   src=[a, dst], params=_params("cpy", {}))
        t.view_src = dst.view_src or dst
        t.view_offset = dst.view_offset
        return t

    def cont(self, a: Tensor, shape=None) -> Tensor:
        params = {"shape": list(shape)} if shape is not None else {}
        return self.op("cont", [a], shape or a.shape, a.dtype, f"{a.name} (cont)", **params)

    def set_rows(self, dst: Tensor, src: Tensor, idx: Tensor) -> Tensor:
        """ggml_set_rows(dst, src, idx): the result is a view of dst named "dst (view)".
        Sources are in ggmlrun's order (dst, src, idx); ggml lists them (src, idx, dst), and
        `expand` walks them in ggml's order so the graph's order is llama.cpp's."""
        t = Tensor(name=f"{dst.name} (view)", shape=dst.shape, dtype=dst.dtype,
                   strides=dst.strides, op="set_rows", src=[dst, src, idx],
                   params=_params("set_rows", {}))
        t.view_src = dst.view_src or dst
        t.view_offset = dst.view_offset
        return t

    # --- naming (llama.cpp's graph callback) -----------------------------------------------
    def cb(self, t: Tensor, name: str, il: int) -> Tensor:
        t.name = f"{name}-{il}" if il >= 0 else name
        if name == "norm" and il >= 0:
            self.pins.append((t, name, il))
        return t

    # --- the graph (ggml_build_forward_expand) -----------------------------------------------
    def expand(self, tensor: Tensor) -> None:
        """ggml_visit_parents: sources left to right, depth first; a node after its sources
        (each frame walks past its visited sources without leaving the loop)."""
        visited = self._visited
        if tensor in visited:
            return
        visited.add(tensor)
        stack = [[tensor, _walk_order(tensor), 0]]
        while stack:
            frame = stack[-1]
            t, srcs, i = frame
            n = len(srcs)
            while i < n:
                src = srcs[i]
                i += 1
                if src not in visited:
                    visited.add(src)
                    frame[2] = i
                    stack.append([src, _walk_order(src), 0])
                    break
            else:
                stack.pop()
                self._emit(t)

    def _emit(self, t: Tensor) -> None:
        if t.op is None:
            if not t.name:                 # ggml_visit_parents names an unnamed leaf
                t.name = f"leaf_{len(self.leafs)}"
            self.leafs.append(t)
        else:
            if not t.name:
                t.name = f"node_{len(self.nodes)}"
            self.nodes.append(t)

    def graph(self, name: str, outputs: list[Tensor], extra_leafs: list[Tensor] = ()) -> Graph:
        for t in outputs:
            t.is_output = True
        leafs = list(self.leafs) + [t for t in extra_leafs if t not in self._visited]
        return Graph(name=name, leafs=leafs, nodes=list(self.nodes), outputs=list(outputs),
                     ggml_leaf_order=True)


@dataclass
class LayerContext:
    """What llm_graph_context carries for one ubatch: sizes and the builder."""

    b: GraphBuilder
    n_tokens: int
    n_outputs: int
    n_kv: int
    kv_size: int
    flash_attn: bool
    norm_rms_eps: float

    def build_norm(self, cur: Tensor, weight: Tensor, il: int) -> Tensor:
        """LLM_NORM_RMS with a weight: rms_norm named "norm" (pinned by llama.cpp), then the mul."""
        cur = self.b.cb(self.b.op("rms_norm", [cur], cur.shape, eps=self.norm_rms_eps), "norm", il)
        return self.b.op("mul", [cur, weight], cur.shape)

    def mul_mat(self, w: Tensor, cur: Tensor) -> Tensor:
        """ggml_mul_mat(w, cur): w [.., M, K], cur [.., N, K] -> [.., N, M] in f32."""
        batch = cur.shape[:-2] if len(cur.shape) >= len(w.shape) else w.shape[:-2]
        return self.b.op("mul_mat", [w, cur], (*batch, cur.shape[-2], w.shape[-2]))


def rs_inputs(b: GraphBuilder, n_rs: int, n_seqs: int) -> dict[str, Tensor]:
    """build_rs_inp_impl: rs_s_copy i32 [n_rs] and its two views, the first n_seqs ids (the
    states the ubatch reads) and the rest (the states only copied along)."""
    s_copy = b.leaf("rs_s_copy", (n_rs,), "i32")
    return {"s_copy": s_copy,
            "s_copy_main": b.view(s_copy, (n_seqs,), (4,), 0),
            "s_copy_extra": b.view(s_copy, (n_rs - n_seqs,), (4,), n_seqs * 4)}


def build_rs(b: GraphBuilder, inputs: dict[str, Tensor], s: Tensor, state_size: int,
             n_seqs: int, n_rs: int, rs_head: int = 0, rs_zero: int = 0,
             get_state_rows=None) -> Tensor:
    """llm_graph_context::build_rs: clear the one state rs_zero (an in-place scale by 0 of its
    row; a zero-sized view when rs_zero < 0), read the ubatch's states with get_rows (or
    `get_state_rows(states, ids)`: Mamba-2's ssm_scan reads them by id itself), and copy
    the other n_rs - n_seqs along (zero-sized when n_rs == n_seqs, as in every reserve)."""
    states = b.reshape(s, (s.shape[0], state_size))
    row = states.strides[0]
    on = rs_zero >= 0
    zero = b.view(states, (state_size * on,), (4,), rs_zero * row * on)
    b.expand(b.scale_inplace(zero, 0.0))
    if get_state_rows is None:
        out = b.op("get_rows", [states, inputs["s_copy_main"]], (n_seqs, state_size))
    else:
        out = get_state_rows(states, inputs["s_copy_main"])
    b.expand(out)
    extra = b.op("get_rows", [states, inputs["s_copy_extra"]], (n_rs - n_seqs, state_size))
    dst = b.view(s, (n_rs - n_seqs, state_size), (s.strides[0], 4), (rs_head + n_seqs) * row)
    b.expand(b.cpy(extra, dst))
    return out
