"""The graph contract's differential cases: one op, its sources in chosen layouts and types.

A case is (op, sources, params); a source is (dtype, shape, layout), shape in NumPy order,
layout one of:

- "c":    contiguous;
- "t":    a transpose of a contiguous tensor (ggml_transpose: nb[0] > nb[1]);
- "pad":  a view of a wider tensor: rows contiguous, the row stride padded (not contiguous);
- "step": a view whose innermost stride is twice the element size (nb[0] != type size).

`ours(case)` builds the case with ggmlrun's `make_node` and returns (accepted, message).
tests/conformance/test_contract.py builds the same case in real ggml (ggml-python 0.0.45,
ggml 0.15.3) in a child process; tests/test_contract.py states ggml's rules in plain Python
(`tests/ggml_rules.py`) and compares them with ggmlrun's verdict over generated layouts.
"""

from __future__ import annotations

import itertools

LAYOUTS = ("c", "t", "pad", "step")
ITEM = {"f32": 4, "f16": 2, "i32": 4}


def base_cases() -> list[tuple[str, list, dict]]:
    """One valid case per op and form (every source contiguous, the types ggml computes)."""
    f32, f16, i32 = "f32", "f16", "i32"
    c = []
    for op in ("add", "sub", "mul", "div"):
        c.append((op, [(f32, (3, 8), "c"), (f32, (3, 8), "c")], {}))
        c.append((op, [(f32, (3, 8), "c"), (f32, (8,), "c")], {}))
    for op in ("neg", "abs", "sqr", "sqrt", "log", "exp", "relu", "silu", "sigmoid", "tanh",
               "gelu", "cont"):
        c.append((op, [(f32, (3, 8), "c")], {}))
    c += [
        ("scale", [(f32, (3, 8), "c")], {"s": 2.0}),
        ("clamp", [(f32, (3, 8), "c")], {"min": -1.0, "max": 1.0}),
        ("sum", [(f32, (3, 8), "c")], {}),
        ("sum_rows", [(f32, (3, 8), "c")], {}),
        ("mean", [(f32, (3, 8), "c")], {}),
        ("argmax", [(f32, (3, 8), "c")], {}),
        ("norm", [(f32, (3, 8), "c")], {}),
        ("rms_norm", [(f32, (3, 8), "c")], {}),
        ("soft_max", [(f32, (2, 4, 8), "c")], {}),
        ("soft_max", [(f32, (2, 4, 8), "c"), (f32, (4, 8), "c")], {}),
        ("diag_mask_inf", [(f32, (2, 8, 8), "c")], {"n_past": 0}),
        ("mul_mat", [(f32, (6, 8), "c"), (f32, (3, 8), "c")], {}),
        ("mul_mat", [(f16, (6, 8), "c"), (f32, (3, 8), "c")], {}),
        ("get_rows", [(f32, (5, 8), "c"), (i32, (3,), "c")], {}),
        ("repeat", [(f32, (1, 8), "c")], {"shape": [3, 8]}),
        ("concat", [(f32, (3, 8), "c"), (f32, (2, 8), "c")], {"axis": 0}),
        ("rope", [(f32, (4, 2, 8), "c"), (i32, (4,), "c")], {"n_dims": 8, "mode": 0}),
        ("argsort", [(f32, (3, 8), "c")], {}),
        ("pad", [(f32, (3, 8), "c")], {"pad": [1, 2]}),
        ("cpy", [(f32, (3, 8), "c"), (f16, (3, 8), "c")], {}),
        ("glu", [(f32, (3, 8), "c")], {"op": "swiglu"}),
        ("glu", [(f32, (3, 8), "c"), (f32, (3, 8), "c")], {"op": "swiglu"}),
        ("cast", [(f32, (3, 8), "c")], {"dtype": "f16"}),
        ("softplus", [(f32, (3, 8), "c")], {}),
        ("add_id", [(f32, (2, 3, 8), "c"), (f32, (4, 8), "c"), (i32, (2, 3), "c")], {}),
        ("mul_mat_id", [(f32, (4, 6, 8), "c"), (f32, (2, 1, 8), "c"), (i32, (2, 3), "c")], {}),
        ("set_rows", [(f32, (5, 8), "c"), (f32, (2, 8), "c"), (i32, (2,), "c")], {}),
        ("flash_attn_ext", [(f32, (1, 2, 3, 8), "c"), (f16, (1, 2, 4, 8), "c"),
                            (f16, (1, 2, 4, 8), "c"), (f16, (3, 4), "c")], {"scale": 1.0}),
        ("ssm_conv", [(f32, (1, 4, 6), "c"), (f32, (4, 3), "c")], {}),
    ]
    return c


def extra_cases() -> list[tuple[str, list, dict]]:
    """Cases one source at a time does not reach: a type for every source at once, the cpy
    and cast type matrix, ranks and params ggml bounds."""
    f32, f16, i32 = "f32", "f16", "i32"
    c = []
    for op in ("add", "sub", "mul", "div"):
        c.append((op, [(i32, (3, 8), "c"), (i32, (3, 8), "c")], {}))
        c.append((op, [(f16, (3, 8), "c"), (f16, (3, 8), "c")], {}))
    c.append(("mul_mat", [(f16, (6, 8), "c"), (f16, (3, 8), "c")], {}))
    c.append(("mul_mat_id", [(f16, (4, 6, 8), "c"), (f16, (2, 1, 8), "c"), (i32, (2, 3), "c")], {}))
    c.append(("mul_mat_id", [(f16, (4, 6, 8), "c"), (f32, (2, 1, 8), "c"), (i32, (2, 3), "c")], {}))
    for x in (f32, f16, i32):
        for y in (f32, f16, i32):
            c.append(("cpy", [(x, (3, 8), "c"), (y, (3, 8), "c")], {}))
            if x != y:
                c.append(("cast", [(x, (3, 8), "c")], {"dtype": y}))
    c += [
        ("argmax", [(f32, (2, 3, 8), "c")], {}),
        ("diag_mask_inf", [(f32, (2, 8, 8), "c")], {"n_past": -1}),
        ("get_rows", [(f32, (2, 3, 5, 8), "c"), (i32, (2, 3, 4), "c")], {}),
        ("get_rows", [(f32, (3, 5, 8), "c"), (i32, (3, 4), "c")], {}),
        ("rope", [(f16, (4, 2, 8), "c"), (i32, (4,), "c")], {"n_dims": 8, "mode": 2}),
        ("glu", [(f16, (3, 8), "c")], {"op": "swiglu_oai", "alpha": 1.702, "limit": 7.0}),
        ("glu", [(f16, (3, 8), "c")], {"op": "geglu"}),
        ("glu", [(f32, (3, 8), "c"), (f16, (3, 8), "c")], {"op": "swiglu"}),
        ("flash_attn_ext", [(f16, (1, 2, 3, 8), "c"), (f16, (1, 2, 4, 8), "c"),
                            (f16, (1, 2, 4, 8), "c"), (f16, (3, 4), "c")], {"scale": 1.0}),
        ("flash_attn_ext", [(f32, (1, 4, 3, 8), "c"), (f16, (1, 2, 4, 8), "c"),
                            (f16, (1, 2, 4, 8), "c"), (f16, (2, 3, 4), "c")], {"scale": 1.0}),
        ("flash_attn_ext", [(f32, (2, 4, 3, 8), "c"), (f16, (2, 2, 4, 8), "c"),
                            (f16, (2, 2, 4, 8), "c"), (f16, (2, 1, 3, 4), "c")], {"scale": 1.0}),
        ("flash_attn_ext", [(f32, (1, 2, 3, 8), "c"), (f16, (1, 2, 4, 8), "c"),
                            (f16, (1, 2, 4, 8), "c"), (f32, (3, 4), "c")], {"scale": 1.0}),
        ("soft_max", [(f32, (2, 4, 8), "c"), (f16, (4, 8), "c")], {}),
        ("concat", [(i32, (3, 8), "c"), (i32, (2, 8), "c")], {"axis": 0}),
        ("concat", [(f16, (3, 8), "c"), (f16, (3, 2), "c")], {"axis": 1}),
        ("repeat", [(i32, (1, 8), "c")], {"shape": [3, 8]}),
        ("sum", [(f16, (3, 8), "c")], {}),
    ]
    return c


def variants() -> list[tuple[str, list, dict]]:
    """Every base case, then each source alone in every other layout and every other type."""
    out, seen = [], set()

    def add(case):
        key = repr(case)
        if key not in seen:
            seen.add(key)
            out.append(case)

    for case in extra_cases():
        add(case)
    for op, srcs, params in base_cases():
        add((op, srcs, params))
        for i, (dtype, shape, _) in enumerate(srcs):
            for layout in LAYOUTS[1:]:
                if len(shape) < 2:
                    continue
                add((op, srcs[:i] + [(dtype, shape, layout)] + srcs[i + 1:], params))
            for other in ("f32", "f16", "i32"):
                if other != dtype:
                    add((op, srcs[:i] + [(other, shape, "c")] + srcs[i + 1:], params))
    return out


def case_name(case) -> str:
    op, srcs, params = case
    parts = [f"{d}{list(s)}{'' if l == 'c' else ':' + l}".replace(" ", "") for d, s, l in srcs]
    extra = ",".join(f"{k}={v}" for k, v in params.items()).replace(" ", "")
    return f"{op}({' '.join(parts)}{' ' + extra if extra else ''})"


# --- ggmlrun's side ------------------------------------------------------------------------

def our_source(name: str, dtype: str, shape, layout: str):
    from ggmlrun.core.ir.graph import Tensor
    from ggmlrun.core.ir.ops.registry import make_node

    shape = tuple(shape)
    if layout == "c":
        return Tensor(name=name, shape=shape, dtype=dtype, role="weight")
    if layout == "t":
        base = Tensor(name=name + "_base", shape=shape[:-2] + (shape[-1], shape[-2]),
                      dtype=dtype, role="weight")
        return make_node(name, "transpose", [base])
    wide = shape[-1] + 2 if layout == "pad" else 2 * shape[-1]
    base = Tensor(name=name + "_base", shape=shape[:-1] + (wide,), dtype=dtype, role="weight")
    inner = ITEM[dtype] if layout == "pad" else 2 * ITEM[dtype]
    return make_node(name, "view", [base], {"shape": list(shape),
                                            "strides": list(base.strides[:-1]) + [inner]})


def ours(case) -> tuple[bool, str]:
    """ggmlrun's verdict on a case: (accepted, the error line when refused)."""
    from ggmlrun.core.ir.ops.registry import make_node
    from ggmlrun.core.util.errors import InputError

    op, srcs, params = case
    tensors = [our_source(f"s{i}", *src) for i, src in enumerate(srcs)]
    try:
        make_node("y", op, tensors, dict(params))
    except InputError as err:
        return False, str(err)
    return True, ""


def combinations(ops=None):
    """(op, layouts) pairs of every base case: for a generator that varies one thing."""
    for op, srcs, params in base_cases():
        if ops is None or op in ops:
            yield op, srcs, params, list(itertools.product(LAYOUTS, repeat=len(srcs)))
