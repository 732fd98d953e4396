"""Graph generators: llama-style blocks and MLPs as graph-file text, for real model shapes.

Output is YAML in flow style, one tensor or node per line, so a generated file reads like a
hand-written one. Nothing here parses YAML; the loader reads what this writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ggmlrun.core.util.errors import InputError

MAX_GEN_NODES = 200_000       # validate reads ~30k nodes a second: ~7 s at this bound
MAX_GEN_TENSOR_BYTES = 2**40  # the loader's limit per tensor (frontend/leaves.py)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, float):
        return repr(v)
    return str(v)


class GraphText:
    """Collects tensors and nodes, then renders the graph file."""

    def __init__(self, name: str, comment: str = ""):
        self.name = name
        self.comment = comment
        self.tensors: list[tuple[str, dict]] = []
        self.nodes: list[dict] = []
        self.outputs: list[str] = []
        self.backends: list[dict] | None = None

    def tensor(self, name: str, shape, **keys) -> str:
        self.tensors.append((name, {"shape": list(shape), **keys}))
        return name

    def node(self, name: str, op: str, *src: str, backend: str | None = None, **params) -> str:
        entry = {"name": name, "op": op, "src": list(src)}
        if params:
            entry["params"] = params
        if backend:
            entry["backend"] = backend
        self.nodes.append(entry)
        return name

    def render(self) -> str:
        lines = [f"# {line}" for line in self.comment.splitlines()]
        lines += [f"name: {self.name}", "seed: 0"]
        if self.backends:
            lines.append("backends:")
            lines += [f"  - {_value(b)}" for b in self.backends]
        lines.append("tensors:")
        lines += [f"  {name}: {_value(spec)}" for name, spec in self.tensors]
        lines.append("nodes:")
        lines += [f"  - {_value(n)}" for n in self.nodes]
        lines.append(f"outputs: {_value(self.outputs or [self.nodes[-1]['name']])}")
        return "\n".join(lines) + "\n"


@dataclass
class LlamaShape:
    layers: int = 2
    dim: int = 256
    heads: int = 8
    ffn: int = 688
    context: int = 0         # KV-cache length; 0 (or = batch): attention over the batch alone
    batch: int = 32          # tokens processed at once (rows of every activation)
    dtype: str = "f32"       # weights' dtype
    offload: int = 0         # how many of the last layers keep their weights on SIM0
    device: str = "SIM0"


def check_names(name: str, device: str) -> None:
    """A graph name and device the loader would take: refused here, before generating, rather
    than in the file ggmlrun itself then rejects."""
    from ggmlrun.core.frontend.yamlfile import NAME_RE
    from ggmlrun.core.util.fmt import clip

    for option, value in (("--name", name), ("--device", device)):
        if not NAME_RE.match(value):
            raise InputError(f"{option} '{clip(value)}' is not a valid name; use letters, digits, "
                             "'_', '.' and '-', starting with a letter or '_'")


def check_size(layers: int, nodes_per_layer: int, tensors: dict[str, list[int]]) -> None:
    """Bound what would be written before writing it: `--layers 100000000` would build gigabytes
    of text for minutes and end in a MemoryError, and a weight over the loader's limit would
    write a file ggmlrun itself refuses."""
    if layers * nodes_per_layer > MAX_GEN_NODES:
        raise InputError(f"--layers {layers} would write {layers * nodes_per_layer:,} nodes "
                         f"({nodes_per_layer} a layer); at most {MAX_GEN_NODES:,} "
                         f"(--layers {MAX_GEN_NODES // nodes_per_layer})")
    for what, shape in tensors.items():
        nbytes = 4 * shape[0] * shape[1]
        if nbytes > MAX_GEN_TENSOR_BYTES:
            raise InputError(f"{what} would make a {shape} weight of {nbytes:,} bytes, over the "
                             f"{MAX_GEN_TENSOR_BYTES:,} (1 TiB) a graph file allows per tensor")


def check_llama(s: LlamaShape, name: str) -> None:
    check_names(name, s.device)
    if s.dim % s.heads or (s.dim // s.heads) % 2:
        raise InputError(f"--dim {s.dim} must be a multiple of --heads {s.heads} with an even "
                         f"head size")
    if s.offload > s.layers:
        raise InputError(f"--offload {s.offload} is more than --layers {s.layers}")
    if 0 < s.context < s.batch:
        raise InputError(f"--context {s.context} is shorter than --batch {s.batch}")
    check_size(s.layers, 32, {"--ffn/--dim": [s.ffn, s.dim], "--context/--dim": [s.context, s.dim],
                              "--batch/--ffn": [s.batch, s.ffn]})


def llama(shape: LlamaShape, name: str = "llama") -> str:
    """A llama-style stack: rms_norm, q/k/v, rope, causal attention, swiglu FFN, residuals.

    As in llama.cpp's partial offload, the last `offload` layers' weights live on the device
    and the rest on the CPU; the scheduler decides where every node runs from there.
    """
    check_llama(shape, name)
    s = shape
    hd = s.dim // s.heads
    cached = s.context > s.batch
    past = s.context - s.batch if cached else 0
    g = GraphText(name, f"generated: ggmlrun gen llama --layers {s.layers} --dim {s.dim} "
                        f"--heads {s.heads} --ffn {s.ffn} --batch {s.batch} --context "
                        f"{s.context} --dtype {s.dtype} --offload {s.offload}")
    x = g.tensor("x", [s.batch, s.dim], role="input", init="randn")
    pos = g.tensor("pos", [s.batch], dtype="i32", role="input", init="arange", start=past)
    wscale = 1.0 / math.sqrt(s.dim)
    for layer in range(s.layers):
        p = f"l{layer}."
        where = {"backend": s.device} if layer >= s.layers - s.offload else {}
        w = {}
        for key, shp in (("attn_norm", [s.dim]), ("wq", [s.dim, s.dim]), ("wk", [s.dim, s.dim]),
                         ("wv", [s.dim, s.dim]), ("wo", [s.dim, s.dim]), ("ffn_norm", [s.dim]),
                         ("ffn_gate", [s.ffn, s.dim]), ("ffn_up", [s.ffn, s.dim]),
                         ("ffn_down", [s.dim, s.ffn])):
            keys = dict(where)
            if len(shp) == 1:
                keys.update(init="ones")
            else:
                keys.update(init="randn", scale=wscale)
                if s.dtype != "f32":
                    keys["dtype"] = s.dtype
            w[key] = g.tensor(p + key, shp, **keys)
        n = g.node(p + "attn_rms", "rms_norm", x)
        n = g.node(p + "attn_in", "mul", n, w["attn_norm"])
        heads = {}
        for key in ("q", "k", "v"):
            m = g.node(p + key, "mul_mat", w["w" + key], n)
            heads[key] = g.node(p + key + "3", "reshape", m, shape=[s.batch, s.heads, hd])
        q = g.node(p + "q_rope", "rope", heads["q"], pos)
        k = g.node(p + "k_rope", "rope", heads["k"], pos)
        v = heads["v"]
        if cached:
            # write the batch's keys and values as cache rows past..context, then attend over all
            k, v = (_through_cache(g, p, kind, rows, s, hd, past, where)
                    for kind, rows in (("k", k), ("v", v)))
        qp = g.node(p + "q_heads", "permute", q, axes=[1, 0, 2])
        kp = g.node(p + "k_heads", "permute", k, axes=[1, 0, 2])
        kq = g.node(p + "kq", "mul_mat", kp, qp)
        kq = g.node(p + "kq_scaled", "scale", kq, s=1.0 / math.sqrt(hd))
        kq = g.node(p + "kq_masked", "diag_mask_inf", kq, **({"n_past": past} if past else {}))
        kq = g.node(p + "kq_soft", "soft_max", kq)
        vt = g.node(p + "v_heads_t", "permute", v, axes=[1, 2, 0])
        vt = g.node(p + "v_cont", "cont", vt)
        kqv = g.node(p + "kqv", "mul_mat", vt, kq)
        kqv = g.node(p + "kqv_tokens", "permute", kqv, axes=[1, 0, 2])
        kqv = g.node(p + "kqv_cont", "cont", kqv)
        kqv = g.node(p + "kqv_flat", "reshape", kqv, shape=[s.batch, s.dim])
        o = g.node(p + "attn_out", "mul_mat", w["wo"], kqv)
        h = g.node(p + "attn_res", "add", o, x)
        n = g.node(p + "ffn_rms", "rms_norm", h)
        n = g.node(p + "ffn_in", "mul", n, w["ffn_norm"])
        gate = g.node(p + "gate", "mul_mat", w["ffn_gate"], n)
        gate = g.node(p + "gate_silu", "silu", gate)
        up = g.node(p + "up", "mul_mat", w["ffn_up"], n)
        gu = g.node(p + "gate_up", "mul", gate, up)
        down = g.node(p + "down", "mul_mat", w["ffn_down"], gu)
        x = g.node(p + "out", "add", down, h)
    g.outputs = [x]
    return g.render()


def _through_cache(g: GraphText, p: str, kind: str, rows: str, s: LlamaShape, hd: int,
                   past: int, where: dict) -> str:
    """Store `rows` [batch, heads, hd] as cache rows past.. and return a view of the whole cache."""
    cache = g.tensor(f"{p}cache_{kind}", [s.context, s.dim], init="randn", **where)
    flat = g.node(f"{p}{kind}_rows", "reshape", rows, shape=[s.batch, s.dim])
    slot = g.node(f"{p}{kind}_slot", "view", cache, shape=[s.batch, s.dim], offset=past * s.dim * 4)
    g.node(f"{p}{kind}_store", "cpy", flat, slot)
    return g.node(f"{p}{kind}_all", "view", cache, shape=[s.context, s.heads, hd])


def mlp(layers: int = 2, dim: int = 512, hidden: int = 2048, batch: int = 32,
        dtype: str = "f32", offload: int = 0, device: str = "SIM0", name: str = "mlp") -> str:
    """A stack of gelu MLP blocks with residuals; the last `offload` blocks' weights on the device."""
    check_names(name, device)
    if offload > layers:
        raise InputError(f"--offload {offload} is more than --layers {layers}")
    check_size(layers, 4, {"--hidden/--dim": [hidden, dim], "--batch/--hidden": [batch, hidden]})
    g = GraphText(name, f"generated: ggmlrun gen mlp --layers {layers} --dim {dim} --hidden "
                        f"{hidden} --batch {batch} --dtype {dtype} --offload {offload}")
    x = g.tensor("x", [batch, dim], role="input", init="randn")
    for layer in range(layers):
        keys = {"init": "randn", "scale": 1.0 / math.sqrt(dim)}
        if dtype != "f32":
            keys["dtype"] = dtype
        if layer >= layers - offload:
            keys["backend"] = device
        w1 = g.tensor(f"l{layer}.w1", [hidden, dim], **keys)
        w2 = g.tensor(f"l{layer}.w2", [dim, hidden], **keys)
        h = g.node(f"l{layer}.h", "mul_mat", w1, x)
        a = g.node(f"l{layer}.a", "gelu", h)
        y = g.node(f"l{layer}.y", "mul_mat", w2, a)
        x = g.node(f"l{layer}.out", "add", y, x)
    g.outputs = [x]
    return g.render()
