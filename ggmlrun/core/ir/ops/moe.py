"""The ops a mixture-of-experts layer adds: argsort (the router's top-k) and mul_mat_id.

argsort follows ggml_argsort: the indices (i32) that sort each row of a, ascending or
descending (ggml_sort_order); llama.cpp's ggml_argsort_top_k is an argsort, descending, and a
view of its first k columns. ggml-cpu sorts with std::sort, whose order among equal values is
unspecified; here ties keep the lower index first (a stable sort), which is what std::sort gives
on the short rows of a router in practice.

mul_mat_id follows ggml_mul_mat_id(as, b, ids): as [E, M, K] holds one matrix per expert
(any weight type), b [T, B, K] the rows (B is 1, one row per token, or the number of experts
used), ids i32 [T, U] the experts each token uses; the result [T, U, M] (f32) is, for token t
and slot i, as[ids[t, i]] @ b[t, i % B]. As in mul_mat, b is rounded to the expert matrix's
vec_dot type first (f16 for f16 experts, q8_0 for q8_0 ones ...) and the sums are f32.

add_id follows ggml_add_id(a, b, ids) (gpt-oss's expert biases): a [T, U, N] the experts'
outputs, b [E, N] one bias row per expert, ids i32 [T, U] the experts used; each row a[t, i]
gets b[ids[t, i]] added (ggml_vec_add_f32, f32). It may take a's memory in place:
ggml_op_can_inplace lists GGML_OP_ADD_ID (ggml 0.15.3 and 0.25.3 alike), so ggml's allocator
gives the biased product the expert product's slot when that has no other consumer. Without it
every expert projection of gpt-oss holds one more [T, U, N] tensor for a while, which moved
CUDA0's compute buffer by 1,280 to 58,880 bytes in 14 recorded gpt-oss configurations
(docs/models.md, CUDA section).
"""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError, RunError
from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.ir.ops.common import F32, fmt, need_dtype, need_rows, quiet, store, who
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register

SORT_ORDERS = ("asc", "desc")     # GGML_SORT_ORDER_ASC = 0, GGML_SORT_ORDER_DESC = 1


# --- argsort -------------------------------------------------------------------------------

def _argsort_infer(srcs, *, order):
    (a,) = srcs
    need_dtype("argsort", a, ("f32",))
    need_rows("argsort", a)
    if order not in SORT_ORDERS:
        raise InputError(f"argsort: order must be one of {', '.join(SORT_ORDERS)}, got {order!r}")
    if a.shape[-1] > 2**31 - 1:
        raise InputError(f"argsort: rows of {a.shape[-1]} values do not fit i32 indices")
    return OpResult(a.shape, "i32")


@quiet
def _argsort_kernel(out, a, *, order):
    keys = -np.asarray(a, dtype=F32) if order == "desc" else np.asarray(a, dtype=F32)
    store(out, np.argsort(keys, axis=-1, kind="stable").astype(np.int32))


register(OpSpec(name="argsort", n_src=(1, 1), infer=_argsort_infer, kernel=_argsort_kernel,
                params={"order": "asc"},
                flops=lambda out, srcs: 0,
                summary="indices (i32) sorting each row of a (f32), order asc or desc; "
                        "ties keep the lower index first"))


# --- mul_mat_id ----------------------------------------------------------------------------

def _mul_mat_id_infer(srcs):
    from ggmlrun.core.ir.ops.matmul import need_product_sources, need_weight_type

    a, b, ids = srcs
    need_weight_type("mul_mat_id", a)
    need_product_sources("mul_mat_id", a, b)
    need_dtype("mul_mat_id", ids, ("i32",), "ids")
    if len(a.shape) != 3:
        raise InputError(f"mul_mat_id: a {who(a)} must be [E, M, K]: one matrix per expert")
    if len(b.shape) != 3:
        raise InputError(f"mul_mat_id: b {who(b)} must be [T, B, K]")
    if len(ids.shape) != 2:
        raise InputError(f"mul_mat_id: ids {who(ids)} must be [T, U]")
    n_tokens, n_b, k = b.shape
    if a.shape[-1] != k:
        raise InputError(f"mul_mat_id: a {fmt(a.shape)} and b {fmt(b.shape)} disagree on K "
                         f"({a.shape[-1]} vs {k})")
    if ids.shape[0] != n_tokens:
        raise InputError(f"mul_mat_id: ids {fmt(ids.shape)} must have one row per token of b "
                         f"{fmt(b.shape)}")
    if ids.shape[1] % n_b:
        raise InputError(f"mul_mat_id: the experts per token ({ids.shape[1]}) must be a "
                         f"multiple of b's rows per token ({n_b})")
    return OpResult((n_tokens, ids.shape[1], a.shape[1]), "f32")


def _mul_mat_id_flops(out, srcs):
    return 2 * out.n_elements * srcs[0].shape[-1]


@quiet
def _mul_mat_id_kernel(out, a, b, ids):
    from ggmlrun.core.ir.ops.matmul import _mul_mat_batched

    n_expert = a.shape[0]
    idx = np.asarray(ids).astype(np.int64)
    bad = (idx < 0) | (idx >= n_expert)
    if bad.any():
        raise RunError(f"mul_mat_id: expert id {int(idx[bad].flat[0])} is out of range "
                       f"[0, {n_expert})")
    n_b = b.shape[1]
    slots = np.arange(idx.shape[1]) % n_b
    for e in np.unique(idx):
        tok, slot = np.nonzero(idx == e)
        rows = np.ascontiguousarray(b[tok, slots[slot]])
        res = np.empty((rows.shape[0], out.shape[-1]), dtype=F32)
        _mul_mat_batched(res, a[int(e)], rows)
        out[tok, slot] = res


register(OpSpec(name="mul_mat_id", n_src=(3, 3), infer=_mul_mat_id_infer,
                kernel=_mul_mat_id_kernel, flops=_mul_mat_id_flops,
                summary="a [E, M, K] (one matrix per expert, any weight type), b [T, B, K], "
                        "ids i32 [T, U] -> [T, U, M], f32: as[ids[t, i]] @ b[t, i % B]"))


# --- add_id --------------------------------------------------------------------------------

def _add_id_infer(srcs):
    a, b, ids = srcs
    need_dtype("add_id", a, ("f32",))
    need_dtype("add_id", b, ("f32",), "b")
    need_dtype("add_id", ids, ("i32",), "ids")
    need_rows("add_id", a)
    need_rows("add_id", b, "b")
    if len(a.shape) != 3 or len(b.shape) != 2 or len(ids.shape) != 2:
        raise InputError(f"add_id: a {who(a)} must be [T, U, N], b {who(b)} [E, N] and ids "
                         f"{who(ids)} [T, U]")
    if a.shape[-1] != b.shape[-1] or tuple(ids.shape) != tuple(a.shape[:2]):
        raise InputError(f"add_id: a {fmt(a.shape)}, b {fmt(b.shape)} and ids "
                         f"{fmt(ids.shape)} disagree (a [T, U, N], b [E, N], ids [T, U])")
    return OpResult(a.shape, "f32")


@quiet
def _add_id_kernel(out, a, b, ids):
    idx = np.asarray(ids).astype(np.int64)
    bad = (idx < 0) | (idx >= b.shape[0])
    if bad.any():
        raise RunError(f"add_id: row id {int(idx[bad].flat[0])} is out of range "
                       f"[0, {b.shape[0]})")
    store(out, np.asarray(a, dtype=F32) + np.asarray(b, dtype=F32)[idx])


register(OpSpec(name="add_id", n_src=(3, 3), infer=_add_id_infer, kernel=_add_id_kernel,
                inplace=True,
                summary="a [T, U, N] + b [E, N] by rows: a[t, i] + b[ids[t, i]] (ids i32 "
                        "[T, U]; gpt-oss's expert biases), f32"))
