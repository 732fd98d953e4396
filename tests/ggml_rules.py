"""ggml's graph contract, stated in plain Python on ggml's own terms (ne, nb), for the cases of
tests/contract_cases.py. Read from ggml 0.15.3 (the ggml ggml-python 0.0.45 vendors): ggml.c's
op constructors and ggml-cpu's kernels, and checked against the real thing by
tests/conformance/test_contract.py. Written apart from ggmlrun's shape rules on purpose: the
property test compares the two.

`verdict(case)` is (accepted, kind, rule): kind "assert" where ggml aborts (GGML_ASSERT or
GGML_ABORT, while building or computing), "wrong" where ggml's release build computes without
complaint but wrongly (ggmlrun refuses those too), "kept" where ggml computes and ggmlrun
refuses on purpose (docs/format.md says why), None when accepted.
"""

from __future__ import annotations

ITEM = {"f32": 4, "f16": 2, "i32": 4}
FLOAT = ("f32", "f16")


class G:
    """A source as ggml sees it: type, ne and nb (4 of each, innermost first)."""

    def __init__(self, dtype, shape, layout):
        self.type = dtype
        item = ITEM[dtype]
        shape = tuple(shape)
        if layout == "t":
            base = shape[:-2] + (shape[-1], shape[-2])
        elif layout == "pad":
            base = shape[:-1] + (shape[-1] + 2,)
        elif layout == "step":
            base = shape[:-1] + (2 * shape[-1],)
        else:
            base = shape
        bne = list(reversed(base)) + [1] * (4 - len(base))
        bnb = [item]
        for i in range(1, 4):
            bnb.append(bnb[-1] * bne[i - 1])
        self.ne = list(reversed(shape)) + [1] * (4 - len(shape))
        self.nb = list(bnb)
        if layout == "t":
            self.nb[0], self.nb[1] = bnb[1], bnb[0]
        elif layout == "step":
            self.nb[0] = 2 * item
        self.ndim = len(shape)

    @property
    def item(self):
        return ITEM[self.type]

    def rows(self):                       # GGML_ASSERT(nb00 == sizeof(T))
        return self.nb[0] == self.item

    def contiguous(self, n=0):            # ggml_is_contiguous_n
        if self.ne[0] != 1 and self.nb[0] != self.item:
            return False
        nxt = self.item * self.ne[0]
        for i in range(1, 4):
            if i > n:
                if self.ne[i] != 1 and self.nb[i] != nxt:
                    return False
                nxt *= self.ne[i]
            else:
                nxt = self.ne[i] * self.nb[i]
        return True

    def transposed(self):                 # ggml_is_transposed
        return self.nb[0] > self.nb[1]


BINARY_TYPES = {("f32", "f32"), ("f16", "f16"), ("f16", "f32")}
UNARY = {"neg", "abs", "sqr", "sqrt", "log", "exp", "relu", "silu", "sigmoid", "tanh", "gelu",
         "softplus"}


def _rules(op, s, p):
    """(kind, rule, holds) in ggml's order of checking; the first that fails decides."""
    a = s[0]
    if op in ("add", "sub", "mul", "div"):
        yield "assert", "binary_op types", (a.type, s[1].type) in BINARY_TYPES
        yield "assert", "nb00 == sizeof(src0)", a.rows()
    elif op in UNARY:
        yield "assert", "unary types f32/f16", a.type in FLOAT
        yield "assert", "nb00 == sizeof(src0)", a.rows()
    elif op == "scale":
        yield "assert", "scale f32", a.type == "f32"
        yield "assert", "ggml_is_padded_1d / is_contiguous(src0)", a.contiguous()
    elif op == "clamp":
        yield "assert", "clamp f32/f16", a.type in FLOAT
        yield "assert", "nb00 == sizeof(src0)", a.rows()
    elif op == "sum":
        yield "assert", "sum f32/f16", a.type in FLOAT
        yield "wrong", "sum reads rows as packed", a.rows()
    elif op in ("sum_rows", "mean", "argmax", "argsort"):
        yield "assert", f"{op} f32", a.type == "f32"
        if op == "argmax":
            yield "assert", "ggml_is_matrix(a)", a.ndim <= 2
        kind = "assert" if op == "sum_rows" else "wrong"
        yield kind, f"{op} reads rows as packed", a.rows()
    elif op == "norm":
        yield "assert", "norm f32", a.type == "f32"
    elif op == "rms_norm":
        yield "assert", "rms_norm f32", a.type == "f32"
        yield "assert", "nb00 == sizeof(float)", a.rows()
    elif op == "soft_max":
        yield "assert", "soft_max f32", a.type == "f32"
        yield "assert", "ggml_is_contiguous(a)", a.contiguous()
        if len(s) > 1:
            yield "assert", "mask f16/f32", s[1].type in FLOAT
            yield "assert", "ggml_is_contiguous(mask)", s[1].contiguous()
    elif op == "diag_mask_inf":
        yield "assert", "diag_mask f32", a.type == "f32"
        yield "assert", "contiguous(src0)", a.contiguous()
        yield "assert", "n_past >= 0", p.get("n_past", 0) >= 0
    elif op in ("mul_mat", "mul_mat_id"):
        b = s[1]
        yield "assert", "weight type", a.type in FLOAT
        yield "assert", "b f32 or a's vec_dot type", b.type == "f32" or b.type == a.type == "f16"
        yield "assert", "!ggml_is_transposed(a)", not a.transposed()
        yield "assert", "nb00 == type size", a.rows()
        yield "assert", "nb10 == type size", b.rows()
        if op == "mul_mat_id":
            yield "assert", "ids i32", s[2].type == "i32"
    elif op == "get_rows":
        yield "assert", "b i32", s[1].type == "i32"
        yield "wrong", "get_rows reads rows as packed", a.rows()
    elif op == "repeat":
        yield "assert", "nb00 == sizeof(src0)", a.rows()
    elif op == "concat":
        yield "assert", "a->type == b->type", a.type == s[1].type
    elif op == "rope":
        yield "assert", "rope f32/f16", a.type in FLOAT
        yield "assert", "positions i32", s[1].type == "i32"
        yield "assert", "nb0 == sizeof(T)", a.rows()
    elif op == "pad":
        yield "assert", "pad f32", a.type == "f32"
    elif op == "cpy":
        yield "assert", "dup has no i32 -> f16", (a.type, s[1].type) != ("i32", "f16")
    elif op == "cast":
        to = p["dtype"]
        yield "assert", "dup has no i32 -> f16", (a.type, to) != ("i32", "f16")
        yield "kept", "float -> i32 is C's undefined cast out of range", to != "i32"
    elif op == "glu":
        yield "assert", "glu f32/f16", a.type in FLOAT
        if p.get("op") == "swiglu_oai":
            yield "assert", "swiglu_oai f32", a.type == "f32"
        if len(s) > 1:
            yield "assert", "a->type == b->type", a.type == s[1].type
        for t in s:
            yield "assert", "ggml_is_contiguous_1", t.contiguous(1)
    elif op == "add_id":
        yield "assert", "add_id f32", a.type == s[1].type == "f32"
        yield "assert", "ids i32", s[2].type == "i32"
        yield "assert", "nb[0] == sizeof(float)", a.rows() and s[1].rows()
    elif op == "set_rows":
        yield "kept", "a float: f32 -> i32 is C's undefined cast", a.type in FLOAT
        yield "assert", "b f32", s[1].type == "f32"
        yield "assert", "c i32/i64", s[2].type == "i32"
        yield "assert", "ggml_is_contiguous_rows(a, b)", a.rows() and s[1].rows()
    elif op == "flash_attn_ext":
        q, k, v = s[:3]
        yield "kept", "q float (an i32 q is read as floats)", q.type in FLOAT
        yield "wrong", "q f32 (ggml-cpu reads an f16 q as f32)", q.type == "f32"
        yield "assert", "k, v float", k.type in FLOAT and v.type in FLOAT
        yield "assert", "q, k, v nb0 == type size", q.rows() and k.rows() and v.rows()
        if len(s) > 3:
            yield "assert", "mask f16", s[3].type == "f16"
            yield "assert", "ggml_is_contiguous(mask)", s[3].contiguous()
    elif op == "ssm_conv":
        c = s[1]
        yield "assert", "sx f32", a.type == "f32"
        yield "assert", "c of 4-byte elements", c.type in ("f32", "i32")
        yield "kept", "c f32 (an i32 c is read as floats)", c.type == "f32"
        yield "assert", "nb00, nb10 == sizeof(float)", a.rows() and c.rows()
        yield "assert", "nb01 == ne00*sizeof(float)", a.nb[1] == a.ne[0] * 4
    elif op == "cont":
        pass
    else:
        raise KeyError(op)


def verdict(case):
    op, srcs, params = case
    s = [G(*src) for src in srcs]
    for kind, rule, holds in _rules(op, s, params):
        if not holds:
            return False, kind, rule
    return True, None, None
