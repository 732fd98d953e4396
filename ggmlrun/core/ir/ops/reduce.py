"""Reductions: sum, sum_rows, mean (last dim, kept) and argmax (last dim, dropped).

Float sums accumulate in f64 as ggml's `ggml_float` does, so long rows agree with it; the
result keeps `a`'s dtype. Types are ggml-cpu's: sum takes f32 or f16, sum_rows, mean and
argmax f32 only (argmax at most 2-D, as ggml_argmax asserts). Every one reads a's rows
packed: ggml-cpu asserts it for sum_rows and computes the others wrongly without it.
"""

from __future__ import annotations

from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.ir.ops.common import need_dtype, need_float, need_ndim, need_rows, quiet, store
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register


def _per_input(out, srcs):
    return srcs[0].n_elements


def _acc_dtype(a: np.ndarray):
    return np.float64 if a.dtype.kind == "f" else a.dtype


# --- sum -----------------------------------------------------------------------------------

def _sum_infer(srcs):
    (a,) = srcs
    need_float("sum", a)
    need_rows("sum", a)
    return OpResult((1,), a.dtype)


@quiet
def _sum_kernel(out, a):
    store(out, np.sum(a, dtype=_acc_dtype(a)))


register(OpSpec(name="sum", n_src=(1, 1), infer=_sum_infer, kernel=_sum_kernel,
                flops=_per_input, summary="sum of all elements, shape [1]"))


# --- sum_rows, mean ------------------------------------------------------------------------

def _rows_infer(op: str):
    def infer(srcs):
        (a,) = srcs
        need_dtype(op, a, ("f32",))
        need_rows(op, a)
        return OpResult(a.shape[:-1] + (1,), a.dtype)
    return infer


@quiet
def _sum_rows_kernel(out, a):
    store(out, np.sum(a, axis=-1, keepdims=True, dtype=_acc_dtype(a)))


@quiet
def _mean_kernel(out, a):
    store(out, np.mean(a, axis=-1, keepdims=True, dtype=np.float64))


register(OpSpec(name="sum_rows", n_src=(1, 1), infer=_rows_infer("sum_rows"),
                kernel=_sum_rows_kernel, flops=_per_input,
                summary="sum over the last dim, kept as 1"))
register(OpSpec(name="mean", n_src=(1, 1), infer=_rows_infer("mean"), kernel=_mean_kernel,
                flops=_per_input, summary="mean over the last dim, kept as 1"))


# --- argmax --------------------------------------------------------------------------------

def _argmax_infer(srcs):
    (a,) = srcs
    need_dtype("argmax", a, ("f32",))
    need_ndim("argmax", a, 1, 2)
    need_rows("argmax", a)
    return OpResult(a.shape[:-1] or (1,), "i32")


@quiet
def _argmax_kernel(out, a):
    """Ties go to the last index, as in ggml: search the reversed row, map the index back."""
    n = a.shape[-1]
    first_in_reversed = np.argmax(a[..., ::-1], axis=-1)
    store(out, (n - 1 - first_in_reversed).reshape(out.shape))


register(OpSpec(name="argmax", n_src=(1, 1), infer=_argmax_infer, kernel=_argmax_kernel,
                flops=_per_input,
                summary="index of the max over the last dim (ties: last), i32, dim dropped"))
