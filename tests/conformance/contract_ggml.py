"""Real ggml's verdict on a contract case (tests/contract_cases.py): does ggml 0.15.3 build and
compute it on its CPU backend, or abort?

Each case runs in a forked child (ggml is already imported, so a fork costs milliseconds):
the child builds the sources in the case's layouts, the op, a graph, computes
it with one thread and exits 0; a failed GGML_ASSERT aborts it. Source data is zeros, so row
indices are valid and nothing depends on values. `ggml_verdicts` forks from a fresh, small
process rather than from the test worker: a fork copies the parent's page tables, and a worker
that has loaded models makes each of the 428 forks several times dearer (13 s against 2 s).
"""

from __future__ import annotations

import ctypes
import faulthandler
import math
import os
import pickle
import subprocess
import sys

import ggml

os.environ.setdefault("GGML_NO_BACKTRACE", "1")

T = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16, "i32": ggml.GGML_TYPE_I32,
     "q8_0": ggml.GGML_TYPE_Q8_0}
ITEM = {"f32": 4, "f16": 2, "i32": 4}
GLU = {"swiglu": ggml.GGML_GLU_OP_SWIGLU, "geglu": ggml.GGML_GLU_OP_GEGLU,
       "reglu": ggml.GGML_GLU_OP_REGLU, "swiglu_oai": ggml.GGML_GLU_OP_SWIGLU_OAI}


def _ne(shape):
    ne = [int(d) for d in reversed(shape)]
    return ne + [1] * (4 - len(ne))


def _new(ctx, dtype, shape):
    ne = _ne(shape)
    t = ggml.ggml_new_tensor_4d(ctx, T[dtype], *ne)
    ctypes.memset(ggml.ggml_get_data(t), 0, ggml.ggml_nbytes(t))
    return t


def _source(ctx, dtype, shape, layout):
    shape = tuple(shape)
    if layout == "c":
        t = _new(ctx, dtype, shape)
        return t
    if layout == "t":
        base = _new(ctx, dtype, shape[:-2] + (shape[-1], shape[-2]))
        return ggml.ggml_transpose(ctx, base)
    wide = shape[-1] + 2 if layout == "pad" else 2 * shape[-1]
    base = _new(ctx, dtype, shape[:-1] + (wide,))
    nb = base.contents.nb
    ne = _ne(shape)
    v = ggml.ggml_view_4d(ctx, base, *ne, nb[1], nb[2], nb[3], 0)
    if layout == "step":
        v.contents.nb[0] = 2 * ITEM[dtype]
    return v


def _rows(shape):
    return len(shape)


def _op(ctx, op, s, p, shapes):
    g = ggml
    unary = {"neg": g.ggml_neg, "abs": g.ggml_abs, "sqr": g.ggml_sqr, "sqrt": g.ggml_sqrt,
             "log": g.ggml_log, "exp": g.ggml_exp, "relu": g.ggml_relu, "silu": g.ggml_silu,
             "sigmoid": g.ggml_sigmoid, "tanh": g.ggml_tanh, "gelu": g.ggml_gelu,
             "cont": g.ggml_cont, "sum": g.ggml_sum, "sum_rows": g.ggml_sum_rows,
             "mean": g.ggml_mean, "argmax": g.ggml_argmax, "softplus": g.ggml_softplus}
    binary = {"add": g.ggml_add, "sub": g.ggml_sub, "mul": g.ggml_mul, "div": g.ggml_div,
              "mul_mat": g.ggml_mul_mat, "get_rows": g.ggml_get_rows, "cpy": g.ggml_cpy,
              "ssm_conv": g.ggml_ssm_conv}
    if op in unary:
        return unary[op](ctx, s[0])
    if op in binary:
        return binary[op](ctx, s[0], s[1])
    if op == "scale":
        return g.ggml_scale(ctx, s[0], float(p["s"]))
    if op == "clamp":
        return g.ggml_clamp(ctx, s[0], float(p.get("min", -math.inf)),
                            float(p.get("max", math.inf)))
    if op in ("norm", "rms_norm"):
        fn = g.ggml_norm if op == "norm" else g.ggml_rms_norm
        return fn(ctx, s[0], float(p.get("eps", 1e-5)))
    if op == "soft_max":
        return g.ggml_soft_max_ext(ctx, s[0], s[1] if len(s) > 1 else None,
                                   float(p.get("scale", 1.0)), float(p.get("max_bias", 0.0)))
    if op == "diag_mask_inf":
        return g.ggml_diag_mask_inf(ctx, s[0], int(p.get("n_past", 0)))
    if op == "repeat":
        return g.ggml_repeat_4d(ctx, s[0], *_ne(p["shape"]))
    if op == "concat":
        nd = len(shapes[0])
        return g.ggml_concat(ctx, s[0], s[1], nd - 1 - int(p["axis"]) % nd)
    if op == "rope":
        return g.ggml_rope_ext(ctx, s[0], s[1], s[2] if len(s) > 2 else None,
                               int(p["n_dims"]), int(p.get("mode", 0)), 0, 10000.0, 1.0,
                               0.0, 1.0, 32.0, 1.0)
    if op == "argsort":
        order = g.GGML_SORT_ORDER_DESC if p.get("order") == "desc" else g.GGML_SORT_ORDER_ASC
        return g.ggml_argsort(ctx, s[0], order)
    if op == "pad":
        pads = list(reversed(p["pad"])) + [0] * (4 - len(p["pad"]))
        return g.ggml_pad(ctx, s[0], *pads)
    if op == "glu":
        if len(s) == 2:
            return g.ggml_glu_split(ctx, s[0], s[1], GLU[p["op"]])
        return g.ggml_glu(ctx, s[0], GLU[p["op"]], bool(p.get("swapped", False)))
    if op == "cast":
        return g.ggml_cast(ctx, s[0], T[p["dtype"]])
    if op == "add_id":
        return g.ggml_add_id(ctx, s[0], s[1], s[2])
    if op == "mul_mat_id":
        return g.ggml_mul_mat_id(ctx, s[0], s[1], s[2])
    if op == "set_rows":
        return g.ggml_set_rows(ctx, s[0], s[1], s[2])
    if op == "flash_attn_ext":
        return g.ggml_flash_attn_ext(ctx, s[0], s[1], s[2], s[3] if len(s) > 3 else None,
                                     float(p.get("scale", 1.0)), 0.0, 0.0)
    raise KeyError(op)


def _child(case) -> None:
    op, srcs, params = case
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 << 20, mem_buffer=None,
                                               no_alloc=False))
    s = [_source(ctx, *src) for src in srcs]
    out = _op(ctx, op, s, params, [src[1] for src in srcs])
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, out)
    ggml.ggml_graph_compute_with_ctx(ctx, gf, 1)


def ggml_accepts(case) -> bool:
    """True when real ggml builds and computes the case; False when it aborts."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        faulthandler.disable()        # pytest's would report ggml's abort as a Python fatal error
        try:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 2)
            _child(case)
        except KeyError:
            code = 3
        except BaseException:  # noqa: BLE001 - a harness error, not a verdict
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return False
    code = os.WEXITSTATUS(status)
    if code:
        raise RuntimeError(f"the ggml harness failed on {case!r} (exit {code})")
    return True


def ggml_verdicts(cases) -> list[bool]:
    """`ggml_accepts` of every case, forked from a fresh interpreter that runs this module."""
    done = subprocess.run([sys.executable, "-m", "tests.conformance.contract_ggml"],
                          input=pickle.dumps(list(cases)), capture_output=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))), check=False)
    if done.returncode:
        raise RuntimeError("the ggml verdict process failed: "
                           + done.stderr.decode(errors="replace")[-2000:])
    return pickle.loads(done.stdout)


# --- values: what ggml computes for a case, from given source values ------------------------

NP = {"f32": "float32", "f16": "float16", "i32": "int32"}


def _fill(t, arr, layout):
    """Write the logical values `arr` into the bytes `t` (a source of `layout`) reads."""
    import numpy as np

    base = t.contents.view_src if layout != "c" else t
    ne = [int(base.contents.ne[i]) for i in range(4)]
    shape = [d for d in reversed(ne)]
    n = int(np.prod(ne))
    buf = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(base),
                                            ctypes.POINTER(ctypes.c_uint8)),
                                shape=(n * arr.itemsize,)).view(arr.dtype).reshape(shape)
    lead = (1,) * (4 - arr.ndim)
    full = arr.reshape(lead + arr.shape)
    if layout == "c":
        buf[...] = full
    elif layout == "t":
        buf[...] = np.swapaxes(full, -1, -2)
    elif layout == "pad":
        buf[..., :arr.shape[-1]] = full
    else:
        buf[..., ::2] = full


def _child_values(case, arrays, fd) -> None:
    import numpy as np

    op, srcs, params = case
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 << 20, mem_buffer=None,
                                               no_alloc=False))
    s = []
    for src, arr in zip(srcs, arrays):
        t = _source(ctx, *src)
        _fill(t, arr, src[2])
        s.append(t)
    out = _op(ctx, op, s, params, [src[1] for src in srcs])
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, out)
    ggml.ggml_graph_compute_with_ctx(ctx, gf, 1)
    ne = [int(out.contents.ne[i]) for i in range(4)]
    dtype = {ggml.GGML_TYPE_F32: np.float32, ggml.GGML_TYPE_I32: np.int32}[out.contents.type]
    n = int(np.prod(ne))
    data = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(out),
                                             ctypes.POINTER(dtype == np.float32 and
                                                            ctypes.c_float or ctypes.c_int32)),
                                 shape=(n,))
    payload = np.asarray(data, dtype).reshape(list(reversed(ne))).tobytes()
    os.write(fd, dtype.__name__.encode().ljust(8) + payload)


def ggml_values(case, arrays):
    """ggml's result for the case with these source values (NumPy order, 4-D padded)."""
    import numpy as np

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        faulthandler.disable()
        code = 0
        try:
            _child_values(case, arrays, write)
        except BaseException:  # noqa: BLE001
            code = 4
        os.close(write)
        os._exit(code)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status):
        raise RuntimeError(f"ggml did not compute {case!r}")
    raw = b"".join(chunks)
    return np.frombuffer(raw[8:], dtype=raw[:8].decode().strip())


if __name__ == "__main__":
    verdicts = [ggml_accepts(case) for case in pickle.load(sys.stdin.buffer)]
    sys.stdout.buffer.write(pickle.dumps(verdicts))
    sys.stdout.flush()
