"""Shared checks and array tricks for the op modules.

Params arrive as raw YAML values, so every check is strict about type (a bool is not a number,
2.0 is not an integer) and says what it got: the user fixes the file from the message alone.
Kernels receive arrays of any strides (arena views, permuted views); the tiling helpers build
strided views instead of materialising `np.tile` copies.
"""

from __future__ import annotations

import functools
import math

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.lazynumpy import np, numpy_later
from ggmlrun.core.util.fmt import all_plain_ints, is_int, is_number  # noqa: F401  (kernels import them from here)
from ggmlrun.core.util.fmt import shape_text as fmt
from ggmlrun.core.ir.graph import MAX_DIMS, Tensor

FLOATS = ("f32", "f16")
F32 = numpy_later(lambda np: np.float32)
as_strided = numpy_later(lambda np: np.lib.stride_tricks.as_strided)


def who(t: Tensor) -> str:
    return f"'{t.name}' {fmt(t.shape)} {t.dtype}"


def per_element(cost: int):
    """An op's flops: `cost` per output element."""
    return lambda out, srcs: cost * out.n_elements


# --- param checks ------------------------------------------------------------------------



def want_int(op: str, key: str, v, *, lo: int | None = None) -> int:
    if not is_int(v):
        raise InputError(f"{op}: param '{key}' must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise InputError(f"{op}: param '{key}' must be >= {lo}, got {v}")
    return int(v)


def want_number(op: str, key: str, v, *, finite: bool = True, positive: bool = False,
                nonneg: bool = False) -> float:
    if not is_number(v):
        raise InputError(f"{op}: param '{key}' must be a number, got {v!r}")
    try:
        x = float(v)
    except OverflowError:
        raise InputError(f"{op}: param '{key}' is too large, got {v!r}") from None
    if math.isnan(x) or (finite and math.isinf(x)):
        raise InputError(f"{op}: param '{key}' must be a finite number, got {v!r}")
    if positive and not x > 0:
        raise InputError(f"{op}: param '{key}' must be > 0, got {v!r}")
    if nonneg and not x >= 0:
        raise InputError(f"{op}: param '{key}' must be >= 0, got {v!r}")
    return x


def want_int_list(op: str, key: str, v) -> list[int]:
    if type(v) is list and all_plain_ints(v):
        return list(v)                 # plain ints already: the usual case, checked in C
    if not isinstance(v, (list, tuple)) or not all(is_int(d) for d in v):
        raise InputError(f"{op}: param '{key}' must be a list of integers, got {v!r}")
    return [int(d) for d in v]


def want_shape(op: str, key: str, v, zero: bool = False) -> tuple[int, ...]:
    """A result shape: 1 to 4 dims, each >= 1 (SPEC.md section 1); with `zero`, 0 too (ggml's
    zero-element views: llama.cpp's recurrent state makes them in every reserve)."""
    dims = want_int_list(op, key, v)
    if not 1 <= len(dims) <= MAX_DIMS:
        raise InputError(f"{op}: param '{key}' must have 1 to {MAX_DIMS} dims, got {v!r}")
    if any(d < (0 if zero else 1) for d in dims):
        raise InputError(f"{op}: param '{key}' dims must be >= {0 if zero else 1}, got {v!r}")
    return tuple(dims)


# --- source checks -----------------------------------------------------------------------

def need_float(op: str, t: Tensor, role: str = "a") -> None:
    if t.dtype not in FLOATS:
        raise InputError(f"{op}: {role} {who(t)} must be f32 or f16 ({op} has no integer form)")


def need_dtype(op: str, t: Tensor, dtypes, role: str = "a") -> None:
    if t.dtype not in dtypes:
        raise InputError(f"{op}: {role} {who(t)} must be {' or '.join(dtypes)}")


def need_ndim(op: str, t: Tensor, lo: int, hi: int = MAX_DIMS, role: str = "a") -> None:
    if not lo <= len(t.shape) <= hi:
        want = f"{lo}" if lo == hi else f"{lo} to {hi}"
        raise InputError(f"{op}: {role} {who(t)} must have {want} dims")


# --- layout checks: ggml's preconditions on a source's strides (docs/format.md, "Layouts") ---
# In NumPy order: ggml's nb[0] is strides[-1], nb[1] strides[-2]; ne[0] is shape[-1].

def ggml_contiguous(t: Tensor, n: int = 0) -> bool:
    """ggml_is_contiguous_n: dims above n packed (a dim of size 1 may have any stride), dims
    1..n free; nb[0] the type size unless ne[0] is one block."""
    gtype = t.gtype
    shape, strides = t.shape[::-1], t.strides[::-1]
    if shape[0] != gtype.block_size and strides[0] != gtype.type_size:
        return False
    next_nb = gtype.type_size * (shape[0] // gtype.block_size)
    for i in range(1, len(shape)):
        if i > n:
            if shape[i] != 1 and strides[i] != next_nb:
                return False
            next_nb *= shape[i]
        else:
            next_nb = shape[i] * strides[i]
    return True


def rows_packed(t: Tensor) -> bool:
    """nb[0] == type size: what ggml-cpu's row loops assert (GGML_ASSERT(nb00 == sizeof(T)))."""
    return t.strides[-1] == t.gtype.type_size


def is_transposed(t: Tensor) -> bool:
    """ggml_is_transposed: nb[0] > nb[1] (a 1-D tensor's nb[1] is its whole row)."""
    nb1 = t.strides[-2] if len(t.shape) >= 2 else t.strides[-1] * t.shape[-1]
    return t.strides[-1] > nb1


def need_rows(op: str, t: Tensor, role: str = "a") -> None:
    if not rows_packed(t):
        raise InputError(
            f"{op}: {role} {who(t)} has an innermost stride of {t.strides[-1]} bytes; ggml's "
            f"{op} reads rows of packed elements ({t.gtype.type_size} bytes apart): insert a "
            f"cont before it")


def need_contiguous(op: str, t: Tensor, role: str = "a", n: int = 0) -> None:
    if not ggml_contiguous(t, n):
        what = "contiguous" if n == 0 else f"contiguous above dim {n} (ggml_is_contiguous_{n})"
        raise InputError(f"{op}: {role} {who(t)} must be {what} in ggml: insert a cont "
                         f"before it")


def need_not_transposed(op: str, t: Tensor, role: str = "a") -> None:
    if is_transposed(t):
        raise InputError(f"{op}: {role} {who(t)} is transposed (its innermost stride exceeds "
                         f"the next one); ggml's {op} refuses it: insert a cont before it")


def tiles(big: tuple[int, ...], small: tuple[int, ...]) -> bool:
    """SPEC's "tiles" rule: right-aligned, every dim of `big` a multiple of `small`'s.

    `small` may carry extra leading 1s (they change nothing).
    """
    extra = len(small) - len(big)
    if extra > 0:
        if any(d != 1 for d in small[:extra]):
            return False
        small = small[extra:]
    padded = (1,) * (len(big) - len(small)) + tuple(small)
    return all(s >= 1 and b % s == 0 for b, s in zip(big, padded))


def need_tiles(op: str, a: Tensor, b: Tensor, role: str = "b") -> None:
    if not tiles(a.shape, b.shape):
        raise InputError(
            f"{op}: {role} {fmt(b.shape)} does not tile a {fmt(a.shape)}: right-aligned, each "
            f"dim of a must be a multiple of {role}'s")


# --- kernel helpers ----------------------------------------------------------------------

def quiet(kernel):
    """Kernels follow ggml: inf/nan arise silently from the data, never as warnings."""
    @functools.wraps(kernel)
    def wrapped(*args, **kwargs):
        with np.errstate(all="ignore"):
            return kernel(*args, **kwargs)
    wrapped.raw = kernel    # for callers that already ignore errors (the executor's loop)
    return wrapped


def fast_path(bind):
    """Attach `bind(out, *srcs, **params) -> (fn, args) | None` to a kernel.

    The executor binds each node once, before its loop: where `bind` returns a call, each run
    is just `fn(*args)` (e.g. a ufunc with its output given positionally), skipping the
    kernel's per-call checks; None means "use the kernel". The call must compute exactly what
    the kernel computes for these arrays, under `np.errstate(all="ignore")`.
    """
    def attach(kernel):
        kernel.bind = bind
        return kernel
    return attach


def tile_split(big: np.ndarray, small: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Views of `big` and `small` in which plain NumPy broadcasting performs the tiling.

    Each dim n of `big` (tiled by a dim m of `small`) becomes two, (n/m, m); `small` gets
    stride 0 on the first of each pair. No data is copied, and the `big` view is writeable
    when `big` is, so it can be a ufunc's `out`.
    """
    extra = small.ndim - big.ndim
    if extra > 0:
        small = small[(0,) * extra]
    sshape = (1,) * (big.ndim - small.ndim) + small.shape
    sstrides = (0,) * (big.ndim - small.ndim) + small.strides
    if sshape == big.shape:
        return big, small.reshape(big.shape)
    bshape, bstrides, tshape, tstrides = [], [], [], []
    for n, s, m, ss in zip(big.shape, big.strides, sshape, sstrides):
        bshape += [n // m, m]
        bstrides += [m * s, s]
        tshape += [n // m, m]
        tstrides += [0, ss]
    big_v = as_strided(big, bshape, bstrides, writeable=big.flags.writeable)
    small_v = as_strided(small, tshape, tstrides, writeable=False)
    return big_v, small_v


def store(out: np.ndarray, value: np.ndarray) -> None:
    """Write a computed value into `out`, rounding to out's dtype (f32 -> f16 on store)."""
    np.copyto(out, value, casting="unsafe")
