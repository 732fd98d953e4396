"""mul_mat and get_rows: the ops that read a weight matrix.

mul_mat follows ggml: result [.., N, M] = b @ aᵀ in f32, and b is first rounded the way ggml
converts it to a's "vec_dot_type" (f16 for f16 a, bf16 for bf16, q8_0 for q4_0/q5_*/q8_0, q8_K
for the k-quants) while sums stay f32. A source with fewer than 2 dims counts as one row. Batch
broadcasting repeats each of a's batches r times in a row (b's batch j reads a's batch j // r),
which differs from the "tiles" rule of add & co.

A single matrix a (every weight of a model) is multiplied panel by panel (panels.py): a's rows
in L2-sized groups, each decoded to f32 only while it is used, so a quantized or f16 matrix is
never held in f32 whole, and the panels can be shared out among the run's threads. Batched a
(attention: the KV cache) is decoded whole and handed to one broadcasting matmul, or, bound
by the executor with more than one thread, split by KV head among the threads
(`_shared_batches`).
"""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError, RunError
from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.ir.ops.common import (
    as_strided, fast_path, fmt, need_dtype, need_float, need_not_transposed, need_rows, quiet,
    store, who)
from ggmlrun.core.ir.ops import panels
from ggmlrun.core.ir.ops.panels import PanelProduct, Workers, f16_has_inf_nan
from ggmlrun.core.ir.ops.quant import (
    MIN_TYPES, block_mins, q8_1_sum_error, round_like_vec_dot, to_f32, type_of, vec_dot_type)
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register


def _padded(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


# --- mul_mat -------------------------------------------------------------------------------

def need_weight_type(op: str, a: Tensor) -> None:
    """Weights may be any float or block type; integers are not matrices to multiply."""
    gtype = TYPES[a.dtype]
    if not (gtype.is_block or a.dtype in ("f32", "f16", "bf16")):
        raise InputError(f"{op}: a {who(a)} must be f32 or f16 (or bf16, or a quantized type)")


def need_product_sources(op: str, a: Tensor, b: Tensor) -> None:
    """ggml_mul_mat(_id)'s preconditions on layouts and ggml-cpu's on b's type: a packed and
    not transposed, b packed, b f32 or already a's vec_dot type (f16 for an f16 a)."""
    need_float(op, b, "b")
    if b.dtype != "f32" and b.dtype != vec_dot_type(a.dtype):
        raise InputError(f"{op}: b {who(b)} with a {who(a)}: ggml-cpu converts an f32 b to "
                         f"a's vec_dot type ({vec_dot_type(a.dtype)}), so b must be f32 "
                         f"or {vec_dot_type(a.dtype)}: cast b to f32")
    need_not_transposed(op, a)
    need_rows(op, a)
    need_rows(op, b, "b")


def _mul_mat_infer(srcs):
    a, b = srcs
    need_weight_type("mul_mat", a)
    need_product_sources("mul_mat", a, b)
    rank = max(len(a.shape), len(b.shape), 2)
    ap, bp = _padded(a.shape, rank), _padded(b.shape, rank)
    if ap[-1] != bp[-1]:
        raise InputError(f"mul_mat: a {fmt(a.shape)} and b {fmt(b.shape)} disagree on K "
                         f"({ap[-1]} vs {bp[-1]})")
    for da, db in zip(ap[:-2], bp[:-2]):
        if db % da:
            raise InputError(f"mul_mat: b's batch dims {fmt(bp[:-2])} must each be a multiple "
                             f"of a's {fmt(ap[:-2])} (a {fmt(a.shape)}, b {fmt(b.shape)})")
    return OpResult(bp[:-2] + (bp[-2], ap[-2]), "f32")


def _mul_mat_flops(out, srcs):
    return 2 * out.n_elements * srcs[0].shape[-1]


def _split_batches(x: np.ndarray, groups: tuple[int, ...]) -> np.ndarray:
    """View each batch dim n of x as (g, n/g): index j becomes (j // (n/g), j % (n/g))."""
    shape, strides = [], []
    for n, s, g in zip(x.shape[:-2], x.strides[:-2], groups):
        r = n // g
        shape += [g, r]
        strides += [r * s, s]
    shape += list(x.shape[-2:])
    strides += list(x.strides[-2:])
    return as_strided(x, shape, strides, writeable=x.flags.writeable)


def _batched_matmul(out, a32, b32, accumulate: bool = False) -> None:
    """out (+)= b32 @ a32ᵀ with ggml's batch broadcast (b's batch j uses a's batch j // r)."""
    groups = a32.shape[:-2]
    out_v = _split_batches(out, groups)
    b_v = _split_batches(b32, groups)
    # a: each batch (g) meets all r repeats of it -> a size-1 axis after every batch axis
    a_v = a32.reshape([d for g in groups for d in (g, 1)] + list(a32.shape[-2:]))
    if accumulate:
        out_v += np.matmul(b_v, np.swapaxes(a_v, -1, -2))
    else:
        np.matmul(b_v, np.swapaxes(a_v, -1, -2), out=out_v)


def _round_b(b: np.ndarray, weight_type: str) -> np.ndarray:
    """b as ggml hands it to the dot products: rounded to a's vec_dot type, in f32."""
    return round_like_vec_dot(to_f32(b), weight_type)


def _as_rows(arr: np.ndarray, width: int) -> np.ndarray | None:
    """arr seen as [rows, width] without a copy (a writeable view of out), or None."""
    try:
        return np.reshape(arr, (-1, width), copy=False)
    except ValueError:
        return None


def _mul_mat_bind(out, a, b, *, workers: Workers | None = None, constant=(False, False)):
    """One matrix a (its batch dims all 1; every weight): the panel product, b's batch dims
    flattened into rows. `constant[0]` (from the executor) says a is a weight no node writes,
    so an f16 a is checked for inf/nan once, here, instead of per panel."""
    if a.ndim < 2 or any(d != 1 for d in a.shape[:-2]) or 0 in out.shape or 0 in b.shape:
        return None
    m, k = out.shape[-1], b.shape[-1]
    out2 = _as_rows(out, m)
    if out2 is None:
        return None
    weight_type = type_of(a)
    a2 = a.reshape(a.shape[-2:])
    product = PanelProduct(a2, weight_type, k, workers,
                           a_checked=weight_type == "f16" and constant[0]
                           and not f16_has_inf_nan(a2), n=out2.shape[0])

    def run(out2, b):
        b2 = b.reshape(-1, k)
        if not product.one_row(out2, to_f32(b2)):
            product(out2, product.rounded(b2, lambda rows: _round_b(rows, weight_type)))
        if weight_type in MIN_TYPES:     # a's block mins, read per call: a may change
            mins = block_mins(np.asarray(a2).view(np.ndarray), weight_type)
            out2 += np.matmul(q8_1_sum_error(to_f32(b2)), mins.T)
    return run, (out2, b)


def _mul_mat_batched(out, a, b) -> None:
    rank = out.ndim
    weight_type = type_of(a)
    a32 = to_f32(a)
    a32 = a32.reshape(_padded(a32.shape, rank))
    b = b.reshape(_padded(b.shape, rank))
    _batched_matmul(out, a32, _round_b(b, weight_type))
    if weight_type in MIN_TYPES:
        mins = block_mins(np.asarray(a).view(np.ndarray), weight_type)
        _batched_matmul(out, mins.reshape(_padded(mins.shape, rank)),
                        q8_1_sum_error(to_f32(b)), accumulate=True)


def _shared_batches(out, a, b, workers: Workers):
    """Attention's products (kq, kqv: a the f16 cache, one matrix per KV head) shared out
    among the run's threads by a's largest batch dim, BLAS at one thread: each thread rounds
    its part of b (the softmax, 8M values at 512 tokens), converts its part of a and
    multiplies it. OpenBLAS's own threads re-synchronise on each of the 32 small products and
    lose badly when the other core is busy. None where the product is too small to share."""
    rank = out.ndim
    weight_type = type_of(a)
    groups = _padded(a.shape, rank)[:-2]
    axis = int(np.argmax(groups)) if groups else 0
    if (weight_type in MIN_TYPES or workers.threads == 1 or not groups or groups[axis] < 2
            or out.size * b.shape[-1] < panels.SPLIT_MIN_MACS):
        return None
    a_v = a.reshape([d for g in groups for d in (g, 1)] + list(a.shape[-2:]))
    out_v = _split_batches(out, groups)
    b_v = _split_batches(b.reshape(_padded(b.shape, rank)), groups)
    pick = (slice(None),) * (2 * axis)

    def work(lo: int, hi: int) -> None:
        part = pick + (slice(lo, hi),)
        a32 = to_f32(a_v[part])
        np.matmul(_round_b(b_v[part], weight_type), np.swapaxes(a32, -1, -2), out=out_v[part])

    return (lambda: workers.share_evenly(work, groups[axis])), ()


def _mul_mat_bind_any(out, a, b, *, workers: Workers | None = None, constant=(False, False)):
    """The executor's binding: the panel product for one matrix a, shared batches for
    attention's, else None (the kernel)."""
    call = _mul_mat_bind(out, a, b, workers=workers, constant=constant)
    if call is None and workers is not None and 0 not in out.shape and 0 not in b.shape:
        call = _shared_batches(out, a, b, workers)
    return call


@fast_path(_mul_mat_bind_any)
@quiet
def _mul_mat_kernel(out, a, b):
    call = _mul_mat_bind(out, a, b)
    if call is None:
        _mul_mat_batched(out, a, b)
    else:
        call[0](*call[1])


_mul_mat_kernel.binds_run_context = True   # the executor passes workers= and constant=


register(OpSpec(name="mul_mat", n_src=(2, 2), infer=_mul_mat_infer, kernel=_mul_mat_kernel,
                flops=_mul_mat_flops,
                summary="a [.., M, K] (float or quantized), b [.., N, K] -> [.., N, M] = b @ aᵀ, f32"))


# --- get_rows ------------------------------------------------------------------------------

def _get_rows_infer(srcs):
    a, b = srcs
    need_dtype("get_rows", b, ("i32",), "b (row indices)")
    if len(a.shape) != len(b.shape) + 1 or len(a.shape) < 2 or a.shape[:-2] != b.shape[:-1]:
        raise InputError(f"get_rows: a {who(a)} and b {who(b)} must be a [.., R, C] with b "
                         f"[.., N], the same leading dims (a [R, C] with b [N], a [B, R, C] "
                         f"with b [B, N], a [B3, B2, R, C] with b [B3, B2, N])")
    need_rows("get_rows", a)
    return OpResult(b.shape + a.shape[-1:], "i32" if a.dtype == "i32" else "f32")


def _picked_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Only the picked rows are decoded (a quantized token table stays quantized)."""
    if a.ndim == 2:
        return to_f32(a[b]) if getattr(a, "ggml_type", "") else a[b]
    lead = b.shape[:-1]
    batch = tuple(np.arange(n).reshape((1,) * i + (n,) + (1,) * (len(lead) - i))
                  for i, n in enumerate(lead))
    picked = a[batch + (b,)]
    return to_f32(picked) if getattr(a, "ggml_type", "") else picked


def _get_rows_flops(out, srcs):
    return 0   # pure data movement: its cost is bytes, not arithmetic


@quiet
def _get_rows_kernel(out, a, b):
    rows = a.shape[-2]
    bad = (b < 0) | (b >= rows)
    if bad.any():
        raise RunError(f"get_rows: row index {int(b[bad].flat[0])} is out of range "
                       f"[0, {rows})")
    store(out, _picked_rows(a, b))


register(OpSpec(name="get_rows", n_src=(2, 2), infer=_get_rows_infer, kernel=_get_rows_kernel,
                flops=_get_rows_flops,
                summary="rows of a [(B), R, C] (any type) picked by b i32/i64 [(B), N]; f32 (i32 for i32 a)"))
