"""Compute time of real model shapes: ggmlrun (CPU backend) vs the same math in plain NumPy
and in onnxruntime, with f32 weights and with f16 weights, at 1 thread and at every core.

Graphs come from ggmlrun's generators (`gen.llama`, `gen.mlp`), loaded like any graph file,
scheduled on the CPU backend alone, planned and bound once; what is timed is
`Executor.run(feed, repeat=R)` / R, the compute loop `engine.execute` runs, with the
executor's `threads` set to the thread count. The NumPy side is written here by hand from the
same f32 weights, the way a NumPy user would (`x @ w.T`, fresh temporaries, BLAS at that
thread count); the onnxruntime side is the same math built from ONNX ops (MatMul on
pre-transposed constant weights, which ORT prepacks; rope's cos/sin tables and the causal mask
are constants, computed from `pos`). All must give the same outputs (the error column).
A second onnxruntime row runs the same model with prepacking off
(`session.disable_prepacking`), measured after the first session is freed: it shows how much of
ORT's lead is packing the constant weights once, which an OpenBLAS call (NumPy's BLAS) redoes
on every product.

Targets (issue 11): ggmlrun f32 <= 1.0x onnxruntime on both graphs at each thread count;
ggmlrun with f16 weights <= 1.2x ggmlrun f32 (b rounded to f16 as ggml does, sums in f32).

    python benchmarks/bench_compute.py              # dim 4096 (about 2 GiB of weights in all)
    python benchmarks/bench_compute.py --threads 1  # one thread count only
    python benchmarks/bench_compute.py --quick      # dim 512, seconds (CI smoke)
    python benchmarks/bench_compute.py --no-ort     # skip onnxruntime (also when not installed)
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

import _common  # noqa: F401  (sys.path)
from _common import machine, ms, table, verdict

from ggmlrun.core import engine
from ggmlrun.core.backends.spec import default_cpu
from ggmlrun.core.run.exec import Executor
from ggmlrun.core.frontend.gen import LlamaShape, llama, mlp
from ggmlrun.core.frontend.loader import load_graph



def load_text(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.yaml"
        path.write_text(text)
        return load_graph(path)


# --- the same math in NumPy ---------------------------------------------------------------

def rms_norm(x, eps=1e-6):
    return x / np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True) + eps
                       ).astype(np.float32)


def rope(x, pos, base=10000.0):
    """Mode 0 (pairs 2i, 2i+1) over [T, H, D]."""
    d = x.shape[-1]
    theta = pos[:, None].astype(np.float32) * np.power(
        np.float32(base), -np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    u, v = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = u * cos - v * sin
    out[..., 1::2] = u * sin + v * cos
    return out


def llama_numpy(v: dict, heads: int, layers: int = 1):
    x, pos = v["x"], v["pos"]
    t, dim = x.shape
    hd = dim // heads
    mask = np.triu(np.ones((t, t), dtype=bool), k=1)
    for layer in range(layers):
        w = {k[len(f"l{layer}."):]: a for k, a in v.items() if k.startswith(f"l{layer}.")}
        n = rms_norm(x) * w["attn_norm"]
        q = rope((n @ w["wq"].T).reshape(t, heads, hd), pos).transpose(1, 0, 2)
        k = rope((n @ w["wk"].T).reshape(t, heads, hd), pos).transpose(1, 0, 2)
        vv = (n @ w["wv"].T).reshape(t, heads, hd).transpose(1, 0, 2)
        kq = (q @ k.transpose(0, 2, 1)) * np.float32(1.0 / math.sqrt(hd))
        kq[:, mask] = -np.inf
        kq = np.exp(kq - kq.max(axis=-1, keepdims=True))
        kq /= kq.sum(axis=-1, keepdims=True)
        kqv = (kq @ vv).transpose(1, 0, 2).reshape(t, dim)
        h = kqv @ w["wo"].T + x
        n = rms_norm(h) * w["ffn_norm"]
        g = n @ w["ffn_gate"].T
        g = g / (1 + np.exp(-g))
        x = (g * (n @ w["ffn_up"].T)) @ w["ffn_down"].T + h
    return x


def gelu(x):
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def mlp_numpy(v: dict, layers: int):
    x = v["x"]
    for layer in range(layers):
        h = gelu(x @ v[f"l{layer}.w1"].T)
        x = h @ v[f"l{layer}.w2"].T + x
    return x


# --- the same math in onnxruntime ---------------------------------------------------------

class OnnxGraph:
    """Just enough of onnx.helper to write the two graphs: fresh names, constants."""

    def __init__(self, helper, numpy_helper):
        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes, self.inits, self.count = [], [], 0

    def const(self, value: np.ndarray) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, kind: str, *inputs: str, **attrs) -> str:
        self.count += 1
        out = f"{kind.lower()}{self.count}"
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def matmul_t(self, x: str, w: np.ndarray) -> str:
        """x @ wᵀ with wᵀ stored as a constant: the layout ORT prepacks."""
        return self.op("MatMul", x, self.const(w.T))

    def rms_norm(self, x: str, weight: np.ndarray, eps: float = 1e-6) -> str:
        mean = self.op("ReduceMean", self.op("Mul", x, x), self.const(np.array([-1])),
                       keepdims=1)
        rms = self.op("Sqrt", self.op("Add", mean, self.const(np.float32([eps]))))
        return self.op("Mul", self.op("Div", x, rms), self.const(weight))


def onnx_session(build, x: np.ndarray, threads: int, prepack: bool = True):
    """An ORT session for the graph `build(g, "x") -> output name` writes, or a reason."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as err:
        return None, f"not installed ({err.name}); `pip install onnxruntime onnx`"
    g = OnnxGraph(helper, numpy_helper)
    out = build(g, "x")
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(x.shape))
          for name in ("x", out)]
    model = helper.make_model(helper.make_graph(g.nodes, "bench", [io[0]], [io[1]],
                                                initializer=g.inits),
                              opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # no busy-waiting between runs: spinning ORT threads would steal the cores from the
    # NumPy/ggmlrun timings interleaved with these
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    del model, g
    return (lambda: sess.run(None, {"x": x})[0]), f"onnxruntime {ort.__version__}"


def mlp_onnx_graph(v: dict, layers: int):
    def build(g: OnnxGraph, x: str) -> str:
        for layer in range(layers):
            h = g.op("Gelu", g.matmul_t(x, v[f"l{layer}.w1"]), approximate="tanh")
            x = g.op("Add", g.matmul_t(h, v[f"l{layer}.w2"]), x)
        return x
    return build


def llama_onnx_graph(v: dict, heads: int, layers: int):
    """gen llama's math: rope mode 0 on pairs (2i, 2i+1), causal softmax, swiglu."""
    t, dim = v["x"].shape
    hd = dim // heads
    theta = v["pos"][:, None].astype(np.float32) * np.power(
        np.float32(10000.0), -np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd))
    cos, sin = (f(theta)[:, None, :, None].astype(np.float32) for f in (np.cos, np.sin))
    mask = np.where(np.triu(np.ones((t, t), bool), k=1), -np.inf, 0).astype(np.float32)

    def rope(g: OnnxGraph, x: str) -> str:
        pairs = g.op("Reshape", x, g.const(np.array([t, heads, hd // 2, 2])))
        u = g.op("Slice", pairs, g.const(np.array([0])), g.const(np.array([1])),
                 g.const(np.array([-1])))
        w = g.op("Slice", pairs, g.const(np.array([1])), g.const(np.array([2])),
                 g.const(np.array([-1])))
        c, s = g.const(cos), g.const(sin)
        first = g.op("Sub", g.op("Mul", u, c), g.op("Mul", w, s))
        second = g.op("Add", g.op("Mul", u, s), g.op("Mul", w, c))
        return g.op("Concat", first, second, axis=-1)      # [t, heads, hd/2, 2]

    def build(g: OnnxGraph, x: str) -> str:
        for layer in range(layers):
            w = {k[len(f"l{layer}."):]: a for k, a in v.items() if k.startswith(f"l{layer}.")}
            n = g.rms_norm(x, w["attn_norm"])
            q, k = (rope(g, g.matmul_t(n, w[key])) for key in ("wq", "wk"))
            q = g.op("Transpose", g.op("Reshape", q, g.const(np.array([t, heads, hd]))),
                     perm=[1, 0, 2])
            k = g.op("Transpose", g.op("Reshape", k, g.const(np.array([t, heads, hd]))),
                     perm=[1, 2, 0])
            vv = g.op("Transpose", g.op("Reshape", g.matmul_t(n, w["wv"]),
                                        g.const(np.array([t, heads, hd]))), perm=[1, 0, 2])
            kq = g.op("Mul", g.op("MatMul", q, k), g.const(np.float32([1.0 / math.sqrt(hd)])))
            kq = g.op("Softmax", g.op("Add", kq, g.const(mask)), axis=-1)
            kqv = g.op("Transpose", g.op("MatMul", kq, vv), perm=[1, 0, 2])
            kqv = g.op("Reshape", kqv, g.const(np.array([t, dim])))
            h = g.op("Add", g.matmul_t(kqv, w["wo"]), x)
            n = g.rms_norm(h, w["ffn_norm"])
            gate = g.matmul_t(n, w["ffn_gate"])
            gate = g.op("Mul", gate, g.op("Sigmoid", gate))
            up = g.op("Mul", gate, g.matmul_t(n, w["ffn_up"]))
            x = g.op("Add", g.matmul_t(up, w["ffn_down"]), h)
        return x
    return build


# --- timing --------------------------------------------------------------------------------

def timed(fn, repeat: int) -> float:
    t0 = time.perf_counter()
    fn(repeat)
    return (time.perf_counter() - t0) / repeat


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / max(1e-30, float(np.max(np.abs(want)))))


def compare(sides: dict, want: np.ndarray, repeat: int, trials: int) -> tuple[dict, dict]:
    """Best seconds per compute and error vs NumPy of each side, interleaved trials."""
    errors = {name: rel_err(fn(), want) for name, fn in sides.items()}
    best = {k: float("inf") for k in sides}
    for _ in range(trials):                      # interleaved: drift hits every side alike
        for k, fn in sides.items():
            fn()                                 # untimed: let the other side's threads settle
            best[k] = min(best[k], timed(lambda r: [fn() for _ in range(r)], repeat))
    return best, errors


class Graphs:
    """One generated graph, f32 and f16 weights: ggmlrun executors, NumPy and ORT sides."""

    def __init__(self, name: str, text_f32: str, text_f16: str, numpy_fn, onnx_build):
        self.name = name
        self.prepared = {}
        for dtype, text in (("f32", text_f32), ("f16", text_f16)):
            graph = load_text(text)
            sched = engine.schedule(graph, [default_cpu()])
            plan, memory = engine.plan_memory(sched)
            values = engine.leaf_values(graph)
            self.prepared[dtype] = (graph, sched, plan, values, memory[0])
        graph, _, _, values, _ = self.prepared["f32"]
        self.values = {t.name: v for t, v in values.items()}
        self.numpy_fn = lambda: numpy_fn(self.values)
        self.onnx_build = onnx_build(self.values)
        self.wbytes = {d: sum(a.nbytes for t, a in p[3].items() if t.role == "weight")
                       for d, p in self.prepared.items()}

    def sides(self, threads: int, ort: bool) -> tuple[dict, str]:
        sides = {}
        for dtype, (graph, sched, plan, values, _) in self.prepared.items():
            executor = Executor(sched, plan, values, threads=threads)
            feed = {t: values[t] for t in graph.inputs}
            out = graph.outputs[0].name
            sides[f"ggmlrun {dtype}"] = (lambda e=executor, f=feed, o=out:
                                         e.run(f, repeat=1).outputs[o])
        sides["numpy"] = self.numpy_fn
        note = "skipped (--no-ort)"
        if ort:
            fn, note = onnx_session(self.onnx_build, self.values["x"], threads)
            if fn:
                sides["onnxruntime"] = fn
        return sides, note


def measure(g: Graphs, threads: int, ort: bool, repeat: int, trials: int):
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):     # NumPy's (and ORT-free) BLAS
        sides, note = g.sides(threads, ort)
        best, errors = compare(sides, g.numpy_fn(), repeat, trials)
        del sides
        if "onnxruntime" in best:                # one ORT copy of the weights at a time
            fn, _ = onnx_session(g.onnx_build, g.values["x"], threads, prepack=False)
            unpacked, unpacked_err = compare({"onnxruntime unpacked": fn}, g.numpy_fn(),
                                             repeat, trials)
            del fn
            best.update(unpacked)
            errors.update(unpacked_err)
    base = best["numpy"]
    labels = {"numpy": "plain NumPy (same math, f32)", "ggmlrun f32": "ggmlrun, f32 weights",
              "ggmlrun f16": "ggmlrun, f16 weights", "onnxruntime": f"{note}, f32",
              "onnxruntime unpacked": f"{note}, f32, prepacking off"}
    rows = [[g.name, threads, labels[k], ms(best[k]), f"{best[k] / base:.2f}x",
             "" if k == "numpy" else f"{errors[k]:.1e}"]
            for k in ("numpy", "onnxruntime", "onnxruntime unpacked", "ggmlrun f32",
                      "ggmlrun f16") if k in best]
    return rows, best, note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small dims, seconds (CI smoke)")
    ap.add_argument("--no-ort", action="store_true", help="skip onnxruntime")
    ap.add_argument("--threads", type=int, default=None,
                    help="one thread count (default: 1, then every core this process may use)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--trials", type=int, default=None)
    args = ap.parse_args()
    if args.quick:
        ls = LlamaShape(layers=1, dim=512, heads=8, ffn=1376, batch=32)
        m = dict(layers=1, dim=512, hidden=2048, batch=32)
    else:
        ls = LlamaShape(layers=1, dim=4096, heads=32, ffn=11008, batch=32)
        m = dict(layers=2, dim=4096, hidden=16384, batch=32)
    # one compute per timing, many timings, the fastest kept: on a shared 2-core machine the
    # minimum is the figure least disturbed by other processes
    repeat = args.repeat or 1
    trials = args.trials or (3 if args.quick else 7)
    cores = len(os.sched_getaffinity(0))
    counts = [args.threads] if args.threads else sorted({1, cores})

    print(f"bench_compute: CPU backend, threads {counts}, {repeat} compute(s) per timing, best "
          f"of {trials} ({machine()})")
    rows, verdicts = [], []
    for name, build in (
            ("llama", lambda: Graphs(
                "llama", llama(ls), llama(dataclasses.replace(ls, dtype="f16")),
                lambda v: llama_numpy(v, ls.heads, ls.layers),
                lambda v: llama_onnx_graph(v, ls.heads, ls.layers))),
            ("mlp", lambda: Graphs(
                "mlp", mlp(**m), mlp(**m, dtype="f16"), lambda v: mlp_numpy(v, m["layers"]),
                lambda v: mlp_onnx_graph(v, m["layers"])))):
        t0 = time.perf_counter()
        g = build()
        setup = time.perf_counter() - t0
        shape = (f"1 layer, dim {ls.dim}, heads {ls.heads}, ffn {ls.ffn}, batch {ls.batch}"
                 if name == "llama" else f"{m['layers']} layers, dim {m['dim']}, hidden "
                 f"{m['hidden']}, batch {m['batch']}")
        print(f"- {name}: {shape}; weights {g.wbytes['f32'] / 2**20:.0f} MiB f32, "
              f"{g.wbytes['f16'] / 2**20:.0f} MiB f16 (load+plan+data {setup:.1f} s)")
        for threads in counts:
            r, best, note = measure(g, threads, not args.no_ort, repeat, trials)
            rows += r
            f32, f16 = best["ggmlrun f32"], best["ggmlrun f16"]
            if "onnxruntime" in best:
                ratio = f32 / best["onnxruntime"]
                verdicts.append(f"{name} f32, {threads} thread(s): ggmlrun <= 1.0x onnxruntime: "
                                f"{verdict(ratio <= 1.0)} ({ratio:.2f}x; "
                                f"{f32 / best['onnxruntime unpacked']:.2f}x onnxruntime "
                                f"with prepacking off)")
            else:
                verdicts.append(f"{name}, {threads} thread(s): onnxruntime {note}")
            verdicts.append(f"{name}, {threads} thread(s): f16 weights <= 1.2x f32: "
                            f"{verdict(f16 / f32 <= 1.2)} ({f16 / f32:.2f}x)")
        del g
    print(table(["graph", "threads", "what", "ms per compute", "vs NumPy",
                 "max rel err vs NumPy"], rows))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS {peak:.2f} GiB")
    for line in verdicts:
        print(f"target {line}")


if __name__ == "__main__":
    main()
