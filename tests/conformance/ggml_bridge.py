"""A bridge from a ggmlrun `Graph` to real ggml (ggml-python 0.0.45 = ggml 0.15.3), for conformance.

It rebuilds the same graph with ggml's own ops through the ctypes bindings (`import ggml`), then
asks ggml what it would do, so ggmlrun's planner, scheduler and kernels can be compared with it:

- `gallocr_buffer_size(graph)`: ggml's graph allocator (one CPU buffer, alignment 32): bytes.
- `gallocr_offsets(graph)`: the same, allocated for real: every tensor's offset in the buffer.
- `compute_outputs(graph, leaf_values)`: run it on ggml's CPU backend; outputs as NumPy arrays.
- `sched_stats(graph, device_weights)`: ggml's scheduler over [device, CPU]: split count, the
  compute buffer size per backend, where every node went and each split's inputs. The device is
  ggml's RPC backend talking to an RPC server on 127.0.0.1 that this module starts as a child
  process (its buffers are not host memory, like our `sim`). ggml-python builds ggml-rpc only when
  asked: `CMAKE_ARGS="-DGGML_RPC=ON" pip install --no-cache-dir ggml-python==0.0.45`. Without it
  (`HAS_RPC` False) only the CPU-only scheduler is available, and asking for a device raises
  `NoDeviceBackend`. What the RPC device cannot mirror of a `sim` backend: it claims every op
  (no `unsupported` list), has no offload_op (ggml never offloads an op to it) and its buffers
  have the server CPU's alignment, 32 (compare with a sim of alignment 32).
- `isolated(fn, *args)`: run any of the above in a fresh process. ggml reports a violated
  precondition with abort(), which would take pytest down; in a child it becomes `GgmlAborted`.

How a graph is translated (facts about ggml 0.15.3, verified on this build):
- Shapes are NumPy order; ggml's `ne` is the same list reversed, `nb` the byte strides reversed.
- The ggml graph is built by `ggml_build_forward_expand` on each of our nodes in our node order,
  so ggml's node order is ours and its leafs come in first-use order; inputs no node uses are
  expanded last (ggml then lists them as leafs, as our planner does).
- Weights (leafs whose role is not "input") live in their own backend buffer (per backend),
  flagged WEIGHTS, outside any compute arena. Inputs get `ggml_set_input` and no buffer: the
  graph allocator places them (in leaf order, before any node). Outputs get `ggml_set_output`.
- Pins (`Tensor.backend` on nodes) become `ggml_backend_sched_set_tensor_backend`.
- Translations that are not one ggml call:
  * clamp -> clamp(cont(a)): ggml_clamp returns a view of its source and clamps it in place;
    the `cont` node owns the memory (named `NAME#cont`).
  * argmax of a 1-D/2-D f32 tensor is ggml_argmax; of 3-D/4-D: reshape to 2-D (cont first if
    not contiguous), argmax, reshape back (views, no memory). f16 argmax: `Unsupported`.
  * ggml's view functions always set nb[0] to the element size; a `view` whose innermost
    stride is not gets its nb[0] patched after ggml_view_Nd.
  * ggml kernels other than cont/cpy (and the view ops) need a source whose nb[0] is the
    element size (some assert it while building the graph, some while computing): a node
    reading such a source (a permuted/transposed tensor, an odd view) raises `Unsupported`,
    for sizes and compute alike. ggml's CPU kernels also lack some dtype combinations that
    ggmlrun accepts (scale of f16 aborts, for one): run such graphs through `isolated`.
  * permute: ggml takes where each source axis goes: p[n-1-axes[j]] = n-1-j.
  * concat: ggml dim = ndim-1-axis. repeat: ggml_repeat_4d. soft_max: ggml_soft_max_ext.
  * rope: ggml_rope_ext with the node's params (YaRN's default to 0, 1, 32, 1, n_ctx_orig 0)
    and its optional freq_factors source. soft_max passes its max_bias.
- ggml's f32 GELU goes through an fp16 table: it differs from the exact formula by up to ~1e-3
  (about 8e-4 measured). Compare gelu outputs with a tolerance.

Bindings bugs of ggml-python 0.0.45 fixed here on import: four functions declare a pointer
result as a Python NewType, which ctypes reads as a 32-bit int (a truncated pointer, then a
segfault): ggml_backend_cpu_buffer_type, ggml_backend_sched_get_tensor_backend,
ggml_backend_alloc_buffer, ggml_backend_cpu_buffer_from_ptr. Their restype becomes c_void_p.

Everything here is NumPy in, NumPy out; nothing of ggml leaks to the caller.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import os
import re
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import numpy as np

import ggml

__all__ = [
    "HAS_RPC", "Unsupported", "NoDeviceBackend", "GgmlAborted",
    "gallocr_buffer_size", "gallocr_offsets", "compute_outputs", "sched_stats", "isolated", "rpc_endpoint",
    "stop_rpc_server",
]

# a failed GGML_ASSERT prints a backtrace by forking and attaching gdb; in a test run that can
# leave stuck forks behind. Without it the message is still printed before abort().
os.environ.setdefault("GGML_NO_BACKTRACE", "1")

for _name in ("ggml_backend_cpu_buffer_type", "ggml_backend_sched_get_tensor_backend",
              "ggml_backend_alloc_buffer", "ggml_backend_cpu_buffer_from_ptr"):
    getattr(ggml, _name).restype = ctypes.c_void_p

HAS_RPC: bool = bool(getattr(ggml, "GGML_USE_RPC", False))

GGML_TYPES = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16, "i32": ggml.GGML_TYPE_I32}
NP_TYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32}
GRAPH_SIZE_MIN = 2048  # GGML_DEFAULT_GRAPH_SIZE


class Unsupported(Exception):
    """The graph uses something this bridge cannot express in ggml 0.15.3."""


class NoDeviceBackend(Unsupported):
    """A device backend was asked for but this ggml build has none (build it with RPC)."""


class GgmlAborted(RuntimeError):
    """ggml aborted (a GGML_ASSERT failed) in an `isolated` child process."""


# ------------------------------------------------------------------------------------------
# translation
# ------------------------------------------------------------------------------------------

def _ne(shape) -> list[int]:
    ne = [int(d) for d in reversed(shape)]
    return ne + [1] * (4 - len(ne))


def _nb(strides) -> list[int]:
    return [int(s) for s in reversed(strides)]


def _new_tensor(ctx, dtype: str, shape):
    ne = [int(d) for d in reversed(shape)]
    fn = (ggml.ggml_new_tensor_1d, ggml.ggml_new_tensor_2d,
          ggml.ggml_new_tensor_3d, ggml.ggml_new_tensor_4d)[len(ne) - 1]
    return fn(ctx, GGML_TYPES[dtype], *ne)


def _reshape(ctx, a, shape):
    ne = [int(d) for d in reversed(shape)]
    fn = (ggml.ggml_reshape_1d, ggml.ggml_reshape_2d,
          ggml.ggml_reshape_3d, ggml.ggml_reshape_4d)[len(ne) - 1]
    return fn(ctx, a, *ne)


def _set_name(t, name: str):
    ggml.ggml_set_name(t, name.encode()[:63])
    return t


def _root_offset(t) -> int:
    return t.view_offset if t.view_src is not None else 0


UNARY = {op: getattr(ggml, f"ggml_{op}") for op in
         ("neg", "abs", "sqr", "sqrt", "log", "exp", "relu", "silu", "sigmoid", "tanh", "gelu",
          "cont", "sum", "sum_rows", "mean", "transpose")}
BINARY = {op: getattr(ggml, f"ggml_{op}") for op in
          ("add", "sub", "mul", "div", "mul_mat", "get_rows", "cpy")}


# ops whose ggml kernels take any source strides (the rest assert nb[0] == element size,
# at graph build time (unary ops, scale, ...) or in the CPU kernel (binary ops, mul_mat, norm))
STRIDED_OK = {"cont", "cpy", "view", "permute", "transpose"}


class _Translator:
    """Turns our nodes into ggml tensors inside one no_alloc context."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.owner: dict[str, object] = {}     # our node -> ggml tensor holding its memory

    def node(self, node, srcs):
        if node.op not in STRIDED_OK:
            for src, gsrc in zip(node.src, srcs):
                if int(gsrc.contents.nb[0]) != src.itemsize:
                    raise Unsupported(
                        f"'{node.name}': ggml's {node.op} needs source '{src.name}' to have "
                        "its innermost stride equal to the element size (insert a cont)")
        ctx, op, p = self.ctx, node.op, node.params
        name = node.name
        if op in UNARY:
            return UNARY[op](ctx, srcs[0])
        if op in BINARY:
            return BINARY[op](ctx, srcs[0], srcs[1])
        if op == "scale":
            return ggml.ggml_scale(ctx, srcs[0], float(p["s"]))
        if op == "clamp":
            c = _set_name(ggml.ggml_cont(ctx, srcs[0]), f"{name}#cont")
            self.owner[name] = c
            lo = p.get("min")
            hi = p.get("max")
            lo = -math.inf if lo is None else float(lo)
            hi = math.inf if hi is None else float(hi)
            return ggml.ggml_clamp(ctx, c, lo, hi)
        if op == "argmax":
            a, src = srcs[0], node.src[0]
            if src.dtype != "f32":
                raise Unsupported("argmax: ggml 0.15.3 takes only f32")
            if len(src.shape) <= 2:
                return ggml.ggml_argmax(ctx, a)
            if not src.is_contiguous:
                a = _set_name(ggml.ggml_cont(ctx, a), f"{name}#cont")
            rows = math.prod(src.shape[:-1])
            a = _set_name(_reshape(ctx, a, (rows, src.shape[-1])), f"{name}#2d")
            r = _set_name(ggml.ggml_argmax(ctx, a), f"{name}#argmax")
            self.owner[name] = r
            return _reshape(ctx, r, node.shape)
        if op == "norm":
            return ggml.ggml_norm(ctx, srcs[0], float(p.get("eps", 1e-5)))
        if op == "rms_norm":
            return ggml.ggml_rms_norm(ctx, srcs[0], float(p.get("eps", 1e-6)))
        if op == "soft_max":
            mask = srcs[1] if len(srcs) > 1 else None
            return ggml.ggml_soft_max_ext(ctx, srcs[0], mask, float(p.get("scale", 1.0)),
                                          float(p.get("max_bias", 0.0)))
        if op == "diag_mask_inf":
            return ggml.ggml_diag_mask_inf(ctx, srcs[0], int(p.get("n_past", 0)))
        if op == "repeat":
            return ggml.ggml_repeat_4d(ctx, srcs[0], *_ne(node.shape))
        if op == "concat":
            nd = len(node.shape)
            axis = int(p["axis"]) % nd
            return ggml.ggml_concat(ctx, srcs[0], srcs[1], nd - 1 - axis)
        if op == "rope":
            d = node.src[0].shape[-1]
            n_dims = p.get("n_dims")
            n_dims = d if n_dims is None else int(n_dims)
            factors = srcs[2] if len(srcs) > 2 else None
            return ggml.ggml_rope_ext(ctx, srcs[0], srcs[1], factors, n_dims,
                                      int(p.get("mode", 0)), int(p.get("n_ctx_orig", 0)),
                                      float(p.get("freq_base", 10000.0)),
                                      float(p.get("freq_scale", 1.0)),
                                      float(p.get("ext_factor", 0.0)),
                                      float(p.get("attn_factor", 1.0)),
                                      float(p.get("beta_fast", 32.0)),
                                      float(p.get("beta_slow", 1.0)))
        if op == "reshape":
            return _reshape(ctx, srcs[0], node.shape)
        if op == "permute":
            n = len(node.shape)
            perm = list(range(4))
            for j, ax in enumerate(p["axes"]):
                perm[n - 1 - (int(ax) % n)] = n - 1 - j
            return ggml.ggml_permute(ctx, srcs[0], *perm)
        if op == "view":
            return self._view(node, srcs[0])
        raise Unsupported(f"op '{op}' has no ggml translation here")

    def _view(self, node, a):
        src = node.src[0]
        offset = _root_offset(node) - _root_offset(src)
        ne = [int(d) for d in reversed(node.shape)]
        nb = _nb(node.strides)
        item = node.itemsize
        root = src.view_src or src
        if item * math.prod(node.shape) + _root_offset(node) > root.nbytes:
            raise Unsupported(f"view '{node.name}': ggml checks the contiguous size of a view "
                              "against its source and would abort")
        if len(ne) == 1:
            t = ggml.ggml_view_1d(self.ctx, a, ne[0], offset)
        elif len(ne) == 2:
            t = ggml.ggml_view_2d(self.ctx, a, ne[0], ne[1], nb[1], offset)
        elif len(ne) == 3:
            t = ggml.ggml_view_3d(self.ctx, a, ne[0], ne[1], ne[2], nb[1], nb[2], offset)
        else:
            t = ggml.ggml_view_4d(self.ctx, a, *ne, nb[1], nb[2], nb[3], offset)
        if nb[0] != item:
            t.contents.nb[0] = nb[0]
        return t


# ------------------------------------------------------------------------------------------
# one ggml session: backends, weight buffers, graph contexts; everything freed on exit
# ------------------------------------------------------------------------------------------

def _graph_size(graph) -> int:
    return max(GRAPH_SIZE_MIN, 4 * (len(graph.nodes) + len(graph.leafs)) + 64)


class _Session:
    """Weights live in one WEIGHTS buffer per backend; graphs are built in fresh contexts."""

    def __init__(self, graph, weight_backend: dict[str, int], values: dict | None = None):
        self.graph = graph
        self.ctxs: list[int] = []
        self.buffers: list[int] = []
        self.weights: dict[str, object] = {}
        self.size = _graph_size(graph)
        by_backend: dict[int, list] = {}
        for t in graph.leafs:
            if t.role != "input":
                by_backend.setdefault(weight_backend[t.name], []).append(t)
        for backend, leafs in by_backend.items():
            ctx = self._ctx(len(leafs) + 1, graph=False)
            for t in leafs:
                self.weights[t.name] = _set_name(_new_tensor(ctx, t.dtype, t.shape), t.name)
            buf = ggml.ggml_backend_alloc_ctx_tensors(ctx, backend)
            if not buf:
                raise RuntimeError("ggml could not allocate the weights buffer")
            self.buffers.append(buf)
            ggml.ggml_backend_buffer_set_usage(buf, ggml.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
            for t in leafs:
                if values is not None and t.name in values:
                    _set_values(self.weights[t.name], t, values[t.name])

    def _ctx(self, n_tensors: int, graph: bool):
        mem = ggml.ggml_tensor_overhead() * (n_tensors + 16)
        if graph:
            mem += ggml.ggml_graph_overhead_custom(self.size, False)
        params = ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True)
        ctx = ggml.ggml_init(params)
        if not ctx:
            raise RuntimeError("ggml_init failed")
        self.ctxs.append(ctx)
        return ctx

    def build(self, keep_view_sources: bool = False, all_nodes_output: bool = False):
        """A fresh ggml graph of our graph. Returns (cgraph, tensors by name, translator).

        keep_view_sources: also flag the view source of every output that is a view as an
        output (SPEC.md's rule; ggml itself does not, and loses such outputs).
        all_nodes_output: flag every node as an output (nothing is freed or overwritten), so
        every node's value can be read back after compute.
        """
        g = self.graph
        ctx = self._ctx(4 * (len(g.nodes) + len(g.leafs)) + 8, graph=True)
        cgraph = ggml.ggml_new_graph_custom(ctx, self.size, False)
        tr = _Translator(ctx)
        tensors: dict[str, object] = {}
        for t in g.leafs:
            if t.role == "input":
                gt = _set_name(_new_tensor(ctx, t.dtype, t.shape), t.name)
                ggml.ggml_set_input(gt)
                tensors[t.name] = gt
            else:
                tensors[t.name] = self.weights[t.name]
        outputs = {t.name for t in g.outputs}
        for node in g.nodes:
            if node.role == "copy" or node.op is None:
                raise Unsupported(f"'{node.name}': scheduler copies cannot be translated")
            gt = tr.node(node, [tensors[s.name] for s in node.src])
            _set_name(gt, node.name)
            tensors[node.name] = gt
            if node.name in outputs or all_nodes_output:
                ggml.ggml_set_output(gt)
                own = tr.owner.get(node.name)
                if own is not None:
                    ggml.ggml_set_output(own)
                if keep_view_sources and node.view_src is not None:
                    ggml.ggml_set_output(tensors[node.view_src.name])
            ggml.ggml_build_forward_expand(cgraph, gt)
        used = {id(s) for n in g.nodes for s in n.src}
        for t in g.leafs:
            if t.role == "input" and id(t) not in used:
                ggml.ggml_build_forward_expand(cgraph, tensors[t.name])
        if cgraph.contents.n_nodes > self.size // 2:
            raise Unsupported("graph too large for the bridge's graph size")
        return cgraph, tensors, tr

    def close(self):
        for buf in reversed(self.buffers):
            ggml.ggml_backend_buffer_free(buf)
        for ctx in reversed(self.ctxs):
            ggml.ggml_free(ctx)
        self.buffers.clear()
        self.ctxs.clear()


@contextmanager
def _session(graph, weight_backend, values=None):
    s = _Session.__new__(_Session)
    s.ctxs, s.buffers = [], []
    try:
        s.__init__(graph, weight_backend, values)
        yield s
    finally:
        s.close()


@contextmanager
def _cpu_backend(n_threads: int | None = None):
    be = ggml.ggml_backend_cpu_init()
    if not be:
        raise RuntimeError("ggml_backend_cpu_init failed")
    try:
        if n_threads:
            ggml.ggml_backend_cpu_set_n_threads(be, int(n_threads))
        yield be
    finally:
        ggml.ggml_backend_free(be)


def _set_values(gt, t, value):
    arr = np.ascontiguousarray(np.asarray(value, dtype=NP_TYPES[t.dtype]))
    if arr.shape != tuple(t.shape):
        if arr.size != math.prod(t.shape):
            raise ValueError(f"'{t.name}': value of shape {arr.shape}, tensor is {list(t.shape)}")
        arr = arr.reshape(t.shape)
    ggml.ggml_backend_tensor_set(gt, arr.ctypes.data, 0, arr.nbytes)


def _get_values(gt, t) -> np.ndarray:
    """Read a ggml tensor (contiguous or not) into a fresh contiguous NumPy array."""
    c = gt.contents
    n = len(t.shape)
    nbytes = ggml.ggml_nbytes(gt)
    raw = np.empty(nbytes, dtype=np.uint8)
    ggml.ggml_backend_tensor_get(gt, raw.ctypes.data, 0, nbytes)
    dtype = np.dtype(NP_TYPES[t.dtype])
    strides = tuple(int(c.nb[i]) for i in reversed(range(n)))
    shape = tuple(int(c.ne[i]) for i in reversed(range(n)))
    view = np.ndarray(shape, dtype=dtype, buffer=raw.data, offset=0, strides=strides)
    return np.array(view.reshape(t.shape), copy=True)


# ------------------------------------------------------------------------------------------
# public API
# ------------------------------------------------------------------------------------------

@contextmanager
def _cpu_gallocr(graph, keep_view_sources: bool):
    """(cgraph, tensors by name, galloc): the graph built for one CPU-buffer graph allocator."""
    with _cpu_backend() as cpu:
        homes = {t.name: cpu for t in graph.leafs}
        with _session(graph, homes) as s:
            cgraph, tensors, _ = s.build(keep_view_sources=keep_view_sources)
            galloc = ggml.ggml_gallocr_new(ggml.ggml_backend_cpu_buffer_type())
            try:
                yield cgraph, tensors, galloc
            finally:
                ggml.ggml_gallocr_free(galloc)


def gallocr_buffer_size(graph, *, keep_view_sources: bool = False) -> int:
    """Bytes ggml's graph allocator reserves for `graph` in one CPU buffer (alignment 32).

    One `ggml_gallocr` on the CPU buffer type, `ggml_gallocr_reserve(graph)`, then
    `ggml_gallocr_get_buffer_size(galloc, 0)`. Weights sit in their own WEIGHTS buffer and are
    not counted; inputs are (they are placed first, in leaf order). keep_view_sources: see
    `_Session.build` (off: exactly what ggml 0.15.3 does).
    """
    with _cpu_gallocr(graph, keep_view_sources) as (cgraph, _, galloc):
        if not ggml.ggml_gallocr_reserve(galloc, cgraph):
            raise RuntimeError("ggml_gallocr_reserve failed")
        return int(ggml.ggml_gallocr_get_buffer_size(galloc, 0))


def gallocr_offsets(graph, *, keep_view_sources: bool = False) -> dict:
    """Where ggml's graph allocator put every tensor: {"buffer_size": n, "offsets": {name: off}}.

    Allocates for real (ggml_gallocr_alloc_graph) and reads each tensor's data pointer relative
    to the buffer base; views report the offset of their first byte. Weights are left out.
    """
    with _cpu_gallocr(graph, keep_view_sources) as (cgraph, tensors, galloc):
        if not ggml.ggml_gallocr_alloc_graph(galloc, cgraph):
            raise RuntimeError("ggml_gallocr_alloc_graph failed")
        size = int(ggml.ggml_gallocr_get_buffer_size(galloc, 0))
        base = None
        offsets = {}
        names = [t.name for t in graph.leafs if t.role == "input"] + [n.name for n in graph.nodes]
        for name in names:
            c = tensors[name].contents
            if not c.data:
                continue
            if base is None:
                buf = c.buffer or c.view_src.contents.buffer
                base = ggml.ggml_backend_buffer_get_base(buf)
            offsets[name] = int(c.data - base)
        return {"buffer_size": size, "offsets": offsets}


def compute_outputs(graph, leaf_values: dict, *, all_nodes: bool = False,
                    keep_view_sources: bool = True, n_threads: int | None = None) -> dict:
    """Run `graph` on ggml's CPU backend; return {name: np.ndarray} for every output.

    leaf_values: a value for every leaf (weights and inputs) by name, NumPy-order shape (a flat
    array of the right size is reshaped); cast to the leaf's dtype.
    all_nodes: also return every node (every node is then flagged OUTPUT, so nothing is reused;
    the values are the same, the memory plan is not).
    keep_view_sources (default on): outputs that are views keep their source alive (SPEC.md);
    off reproduces ggml 0.15.3, where such an output can be overwritten before it is read.
    """
    missing = [t.name for t in graph.leafs if t.name not in leaf_values]
    if missing:
        raise KeyError(f"no value for leafs {missing}")
    with _cpu_backend(n_threads) as cpu:
        homes = {t.name: cpu for t in graph.leafs}
        with _session(graph, homes, leaf_values) as s:
            cgraph, tensors, _ = s.build(keep_view_sources=keep_view_sources,
                                         all_nodes_output=all_nodes)
            galloc = ggml.ggml_gallocr_new(ggml.ggml_backend_cpu_buffer_type())
            try:
                if not ggml.ggml_gallocr_alloc_graph(galloc, cgraph):
                    raise RuntimeError("ggml_gallocr_alloc_graph failed")
                for t in graph.leafs:
                    if t.role == "input":
                        _set_values(tensors[t.name], t, leaf_values[t.name])
                status = ggml.ggml_backend_graph_compute(cpu, cgraph)
                if status != ggml.GGML_STATUS_SUCCESS:
                    raise RuntimeError(f"ggml_backend_graph_compute: status {status}")
                want = graph.nodes if all_nodes else graph.outputs
                return {t.name: _get_values(tensors[t.name], t) for t in want}
            finally:
                ggml.ggml_gallocr_free(galloc)


_SPLIT_RE = re.compile(r"^## SPLIT #(\d+): (.*?) # (\d+) inputs(?:: (.*))?$")
_INPUT_RE = re.compile(r"\[(\S+) \(\s*[^)]*\)\]")


@contextmanager
def _capture_ggml_log():
    """Collect ggml's log text (GGML_LOG_*) while inside; restores the default logger."""
    chunks: list[str] = []

    @ggml.ggml_log_callback
    def _cb(level, text, user_data):  # noqa: ARG001
        if text:
            chunks.append(text.decode(errors="replace"))

    ggml.ggml_log_set(_cb, None)
    try:
        yield chunks
    finally:
        ggml.ggml_log_set(ctypes.cast(None, ggml.ggml_log_callback), None)


def _parse_splits(text: str) -> list[dict]:
    splits = []
    for line in text.splitlines():
        m = _SPLIT_RE.match(line.strip())
        if m:
            inputs = _INPUT_RE.findall(m.group(4) or "")
            splits.append({"backend": m.group(2), "n_inputs": int(m.group(3)), "inputs": inputs})
    return splits


def sched_stats(graph, device_weights: set[str] | None = None, *, device: str = "auto",
                names: tuple[str, str] = ("SIM0", "CPU"), op_offload: bool = True) -> dict:
    """ggml's scheduler (ggml_backend_sched) on `graph`, over [device, CPU] or [CPU].

    device: "rpc" (the RPC backend; NoDeviceBackend if this build lacks it), "none" (CPU only),
    "auto" (rpc when built, else CPU only). names: what to call the device and the CPU in the
    result and in pins (`Tensor.backend` of nodes, mapped to set_tensor_backend).
    device_weights: names of weights whose buffer lives on the device (None: the weights whose
    `backend` is names[0]); every other weight lives in a CPU WEIGHTS buffer.
    op_offload: ggml_backend_sched_new's flag (the RPC backend has no offload_op, so it never
    offloads; the flag only matters to other backends).

    Returns {"backends": [names used, priority order], "device": "rpc" | None,
    "ggml_names": {our name: ggml backend name}, "n_splits": int,
    "buffer_sizes": {name: compute-buffer bytes}, "alignment": {name: bytes},
    "node_backends": {node name: our backend name, views included},
    "splits": [{"backend": our name, "n_inputs": int, "inputs": [tensor names]}]}.
    Splits come from ggml's GGML_SCHED_DEBUG print; backend assignment from
    ggml_backend_sched_get_tensor_backend after ggml_backend_sched_split_graph; sizes from
    ggml_backend_sched_reserve on a second, fresh copy of the graph (the scheduler rewrites the
    sources of the graph it splits, so a graph is used once).
    """
    dev_name, cpu_name = names
    if device_weights is None:
        device_weights = {t.name for t in graph.leafs if t.role != "input" and t.backend == dev_name}
    device_weights = set(device_weights)
    use_rpc = device == "rpc" or (device == "auto" and HAS_RPC)
    if device not in ("rpc", "none", "auto"):
        raise ValueError(f"device must be rpc, none or auto, not {device!r}")
    if use_rpc and not HAS_RPC:
        raise NoDeviceBackend("this ggml-python build has no RPC backend; reinstall with "
                              "CMAKE_ARGS='-DGGML_RPC=ON' pip install --no-cache-dir "
                              "--force-reinstall ggml-python==0.0.45")
    if not use_rpc:
        pinned = [n.name for n in graph.nodes if n.backend == dev_name]
        if device_weights or pinned:
            raise NoDeviceBackend(f"no device backend: weights {sorted(device_weights)} and "
                                  f"pins {pinned} need one")

    backends: list[int] = []
    try:
        if use_rpc:
            be = ggml.ggml_backend_rpc_init(rpc_endpoint().encode(), 0)
            if not be:
                raise RuntimeError("ggml_backend_rpc_init failed")
            backends.append(be)
        cpu = ggml.ggml_backend_cpu_init()
        backends.append(cpu)
        ours = [dev_name, cpu_name] if use_rpc else [cpu_name]
        by_ours = dict(zip(ours, backends))
        by_ptr = {b: n for n, b in by_ours.items()}
        ggml_names = {n: ggml.ggml_backend_name(b).decode() for n, b in by_ours.items()}
        homes = {t.name: (backends[0] if t.name in device_weights else cpu) for t in graph.leafs}
        pins = {n.name: n.backend for n in graph.nodes if n.backend}
        for name, b in pins.items():
            if b not in by_ours:
                raise Unsupported(f"pin of '{name}' to unknown backend '{b}'")
        arr = (ctypes.c_void_p * len(backends))(*backends)
        with _session(graph, homes) as s, _capture_ggml_log() as log:
            sched = _sched_new_debug(arr, len(backends), s.size, op_offload)
            try:
                # 1) split once: where every node went, and the split list (debug print)
                cgraph, tensors, _ = s.build()
                for name, b in pins.items():
                    ggml.ggml_backend_sched_set_tensor_backend(sched, tensors[name], by_ours[b])
                ggml.ggml_backend_sched_split_graph(sched, cgraph)
                node_backends = {}
                for node in graph.nodes:
                    p = ggml.ggml_backend_sched_get_tensor_backend(sched, tensors[node.name])
                    node_backends[node.name] = by_ptr.get(p) if p else None
                n_splits_split = int(ggml.ggml_backend_sched_get_n_splits(sched))
                split_log = "".join(log)
                ggml.ggml_backend_sched_reset(sched)
                # 2) reserve a fresh copy of the graph: the compute buffer sizes
                cgraph2, tensors2, _ = s.build()
                for name, b in pins.items():
                    ggml.ggml_backend_sched_set_tensor_backend(sched, tensors2[name], by_ours[b])
                if not ggml.ggml_backend_sched_reserve(sched, cgraph2):
                    raise RuntimeError("ggml_backend_sched_reserve failed")
                n_splits = int(ggml.ggml_backend_sched_get_n_splits(sched))
                sizes = {n: int(ggml.ggml_backend_sched_get_buffer_size(sched, b))
                         for n, b in by_ours.items()}
                align = {n: int(ggml.ggml_backend_buft_get_alignment(
                    ggml.ggml_backend_get_default_buffer_type(b))) for n, b in by_ours.items()}
            finally:
                ggml.ggml_backend_sched_free(sched)
        to_ours = {v: k for k, v in ggml_names.items()}
        splits = _parse_splits(split_log)
        for sp in splits:
            sp["backend"] = to_ours.get(sp["backend"], sp["backend"])
        if n_splits != n_splits_split or len(splits) != n_splits:
            raise RuntimeError(f"split counts disagree: split_graph {n_splits_split}, "
                               f"reserve {n_splits}, debug print {len(splits)}")
        return {"backends": ours, "device": "rpc" if use_rpc else None,
                "ggml_names": ggml_names, "n_splits": n_splits, "buffer_sizes": sizes,
                "alignment": align, "node_backends": node_backends, "splits": splits}
    finally:
        for b in reversed(backends):
            ggml.ggml_backend_free(b)


def _sched_new_debug(arr, n, size, op_offload):
    """A scheduler created with GGML_SCHED_DEBUG=2 (ggml reads it at creation only)."""
    old = os.environ.get("GGML_SCHED_DEBUG")
    os.environ["GGML_SCHED_DEBUG"] = "2"
    try:
        sched = ggml.ggml_backend_sched_new(arr, None, n, size, False, op_offload)
    finally:
        if old is None:
            os.environ.pop("GGML_SCHED_DEBUG", None)
        else:
            os.environ["GGML_SCHED_DEBUG"] = old
    if not sched:
        raise RuntimeError("ggml_backend_sched_new failed")
    return sched


# ------------------------------------------------------------------------------------------
# the RPC server (a child process on 127.0.0.1) and crash isolation
# ------------------------------------------------------------------------------------------

_rpc = {"proc": None, "endpoint": None}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rpc_endpoint(timeout: float = 20.0) -> str:
    """The endpoint of a ggml RPC server on 127.0.0.1, started once per process (a child).

    GGMLRUN_RPC_ENDPOINT, when set, names a server already running instead. The server serves
    ggml's CPU device; the client sees it as a separate, non-host device ("RPC0[...]").
    """
    ext = os.environ.get("GGMLRUN_RPC_ENDPOINT")
    if ext:
        return ext
    proc = _rpc["proc"]
    if proc is not None and proc.poll() is None:
        return _rpc["endpoint"]
    if not HAS_RPC:
        raise NoDeviceBackend("this ggml-python build has no RPC backend")
    port = _free_port()
    endpoint = f"127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rpc-server", endpoint],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the RPC server exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the RPC server did not start") from None
            time.sleep(0.05)
    _rpc["proc"], _rpc["endpoint"] = proc, endpoint
    return endpoint


def stop_rpc_server() -> None:
    """Stop the RPC server this process started, if any."""
    proc = _rpc["proc"]
    _rpc["proc"] = _rpc["endpoint"] = None
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


atexit.register(stop_rpc_server)


def _serve_rpc(endpoint: str, n_threads: int = 4) -> None:
    host = endpoint.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("the RPC server listens on loopback only")
    dev = ggml.ggml_backend_dev_by_type(ggml.GGML_BACKEND_DEVICE_TYPE_CPU)
    devs = (ggml.ggml_backend_dev_t_ctypes * 1)(dev)
    ggml.ggml_backend_rpc_start_server(endpoint.encode(), None, n_threads, 1, devs)


_abort_hook = None  # keeps the ctypes callback alive in an isolated child


def _isolated_child(conn):
    """Runs in the spawned child: for each (fn, args, kwargs) it receives, reports fn's
    result, its exception, or ggml's abort message (after which the child is gone)."""
    global _abort_hook
    import threading

    os.environ["GGML_NO_BACKTRACE"] = "1"
    first = threading.Lock()

    @ggml.ggml_abort_callback_t
    def on_abort(message):
        first.acquire()   # the first aborting thread reports; others wait here for the end
        try:
            conn.send(("abort", (message or b"").decode(errors="replace")))
        except Exception:  # noqa: BLE001 - the process is about to abort anyway
            pass

    _abort_hook = on_abort
    ggml.ggml_set_abort_callback(on_abort)
    try:
        while (job := conn.recv()) is not None:
            fn, args, kwargs = job
            try:
                conn.send(("ok", fn(*args, **kwargs)))
            except BaseException as err:  # noqa: BLE001 - sent back to the parent
                conn.send(("err", err))
    except EOFError:
        pass
    finally:
        conn.close()


class _Isolated:
    """One spawned child, reused from call to call while it lives: spawning costs about a
    second (the child imports NumPy and ggml) and the conformance tests make dozens of calls;
    a call that aborts ggml ends the child, and the next call spawns a new one."""

    def __init__(self):
        self.proc = self.conn = None

    def _start(self):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_isolated_child, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def stop(self):
        if self.proc is None:
            return
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()
        self.proc = self.conn = None

    def call(self, fn, args, kwargs, timeout: float):
        name = getattr(fn, "__name__", fn)
        if self.proc is None or not self.proc.is_alive():
            self.stop()
            self._start()
        try:
            self.conn.send((fn, args, kwargs))
            if not self.conn.poll(timeout):
                self.proc.kill()
                raise TimeoutError(f"{name} took over {timeout}s")
            kind, value = self.conn.recv()
        except (EOFError, BrokenPipeError):
            self.proc.join()
            code = self.proc.exitcode
            self.stop()
            raise GgmlAborted(f"ggml aborted in {name} (exit {code})") from None
        except BaseException:
            self.stop()
            raise
        if kind == "abort":
            self.stop()
            raise GgmlAborted(f"ggml aborted in {name}: {value}")
        if kind == "err":
            raise value
        return value


_ISOLATED = _Isolated()
atexit.register(_ISOLATED.stop)


def isolated(fn, *args, timeout: float = 300.0, **kwargs):
    """fn(*args, **kwargs) in a child process (spawned, not forked: ggml's threads and state
    stay out of the test process): a ggml abort becomes GgmlAborted.

    Exceptions raised by fn come back as themselves; the result must pickle (dicts of NumPy
    arrays and ints do)."""
    return _ISOLATED.call(fn, args, kwargs, timeout)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rpc-server":
        _serve_rpc(sys.argv[2])
    else:
        print("usage: ggml_bridge.py --rpc-server 127.0.0.1:PORT", file=sys.stderr)
        sys.exit(2)
