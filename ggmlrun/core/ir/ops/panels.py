"""b @ aᵀ for one matrix a, panel by panel: how mul_mat keeps up with onnxruntime in NumPy.

Why panels (figures from benchmarks/bench_compute.py, one 4096x16384 product at 32 rows, one
thread, on the 2-core EPYC this was written on):
- `b @ a.T` in one call costs ~100-130 ms; the same product over panels of 64-256 of a's rows
  (`np.matmul(b, a[i:j].T, out=out[:, i:j])`, no copy) ~75-85 ms, as fast as prepacked
  contiguous panels of aᵀ (so nothing is prepacked and no memory is spent on it), and about
  onnxruntime's MatMul (70-85 ms, which prepacks its constant weights).
- OpenBLAS's own threads gain nothing at 32 rows (it splits the small side); splitting the
  panels between the run's threads, each calling a 1-thread BLAS (NumPy releases the GIL), does.
  BLAS is held to one thread only while a product is shared out (~20 us to switch, so only
  products of 32M multiply-adds or more are shared); everything else keeps BLAS as it was.
- An f16 matrix costs NumPy ~2 ns an element to cast (no SIMD), 3x the product itself. Here a
  panel's f16 bits become f32 bits in three integer passes (~0.25-0.4 ns an element, while the
  panel sits in L2): sign-extend to int32, shift left 13, keep the sign, exponent and mantissa.
  That f32 is the f16 value times 2^-112 (denormals included), so b is multiplied by 2^112
  instead: each product b·a, hence each sum, is exactly what f32 a would give (b is rounded to
  f16 first, so |b| <= 65504 and b·2^112 stays finite). f16 inf/nan would come out finite:
  a panel holding one takes NumPy's cast instead (a constant weight is checked once).
- A quantized or bf16 panel is decoded with quant.to_f32 just before its product, so the
  whole matrix is never in f32 at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ggmlrun.core.util import host
from ggmlrun.core.util.lazynumpy import np, numpy_later
from ggmlrun.core.ir.ops import onerow
from ggmlrun.core.ir.ops.quant import F32, to_f32, vec_dot_type

if TYPE_CHECKING:     # loaded with the first split product: ~5 ms of every command's start-up
    from concurrent.futures import ThreadPoolExecutor

DECODED_PANEL_BYTES = 1 << 20    # a decoded panel stays in one core's L2 (1 MiB here)
WIDE_B_BYTES = 1 << 20           # a b of more f32 bytes than this no longer stays in cache:
WIDE_B_PANEL_BYTES = 4 << 20     # BLAS re-packs it from L3 per panel, so panels grow 4x
F32_PANEL_BYTES = 4 << 20        # f32 panels are read in place: fewer, larger calls
SPLIT_MIN_MACS = 1 << 25         # below this a product is not worth a thread hand-off
ROUND_SHARE_MIN_VALUES = 1 << 18  # b's rounding is shared out from 1 MiB of f32 (~0.5 ms)

# f16 bits << 13, read as f32, are value·2^-112; the mask is 0x8FFFE000
F16_SCALE = numpy_later(lambda np: np.float32(2.0 ** 112))
_SIGN_EXP_MANTISSA = numpy_later(lambda np: np.int32(-1879056384))
_F16_INF_NAN_POSITIVE = 0x7C00              # int16 bits at or above: +inf / nan
_F16_INF_NAN_NEGATIVE = 0xFC00              # uint16 bits at or above: -inf / nan


class Workers:
    """The threads one run computes on: the caller plus threads-1 from a shared pool."""

    _pool: ThreadPoolExecutor | None = None
    _blas = None            # threadpoolctl's controller, found once (~2 ms)

    def __init__(self, threads: int):
        self.threads = max(1, min(int(threads), host.cores()))

    def share(self, work: Callable[[int, int], None], chunks: list[tuple[int, int]]) -> None:
        """work(lo, hi) for every chunk; the caller takes the last one, errors re-raised."""
        if len(chunks) == 1:
            work(*chunks[0])
            return
        if Workers._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            Workers._pool = ThreadPoolExecutor(max(1, host.cores() - 1),
                                               thread_name_prefix="ggmlrun-panels")
        with Workers.blas_at_one_thread():                      # our threads, not BLAS's
            futures = [Workers._pool.submit(work, lo, hi) for lo, hi in chunks[:-1]]
            try:
                work(*chunks[-1])
            finally:
                for future in futures:
                    future.result()

    def share_evenly(self, work: Callable[[int, int], None], count: int,
                     unit: int = 1, end: int | None = None) -> None:
        """work over `count` units of `unit` items (the last may stop at `end`), the units
        dealt out as evenly as they go among the threads."""
        parts = min(self.threads, count)
        bounds = [count * t // parts * unit for t in range(parts + 1)]
        if end is not None:
            bounds = [min(end, b) for b in bounds]
        self.share(work, list(zip(bounds, bounds[1:])))

    @staticmethod
    def blas_at_one_thread():
        """A context holding BLAS to one thread (~20-50 us to enter and leave)."""
        if Workers._blas is None:
            from threadpoolctl import ThreadpoolController

            Workers._blas = ThreadpoolController()
        return Workers._blas.limit(limits=1, user_api="blas")


def f16_has_inf_nan(bits: np.ndarray) -> bool:
    """Whether f16 storage holds an inf or nan (exponent all ones): two SIMD max passes."""
    if bits.size == 0:
        return False
    return bool(bits.view(np.int16).max() >= _F16_INF_NAN_POSITIVE
                or bits.view(np.uint16).max() >= _F16_INF_NAN_NEGATIVE)


def f16_scaled(bits: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """f16 values·2^-112 as f32, written into `scratch` (int32, at least bits' size)."""
    buf = scratch.reshape(-1)[:bits.size].reshape(bits.shape)
    np.copyto(buf, bits.view(np.int16))
    np.left_shift(buf, 13, out=buf)
    np.bitwise_and(buf, _SIGN_EXP_MANTISSA, out=buf)
    return buf.view(F32)


def panel_rows(k: int, nbytes: int) -> int:
    """Rows of a per panel: `nbytes` of f32, a multiple of 16 (BLAS's unroll), at least 16."""
    return max(16, nbytes // max(1, 4 * k) // 16 * 16)


class PanelProduct:
    """out2 [N, M] = b2 @ a2ᵀ for one matrix a2 [M, K] of any type, b2 already rounded.

    Built once per node (the executor binds it); `a_checked` says a2 is a constant weight
    whose f16 bits were found free of inf/nan, so panels skip that check.
    """

    def __init__(self, a2: np.ndarray, weight_type: str, k: int, workers: Workers | None,
                 a_checked: bool = False, n: int = 1):
        """`n`: b's rows. A wide b (a 512-token prompt: 8 MiB) is re-packed by BLAS on every
        panel, so decoded panels are then 4 MiB (256 rows at K 4096: q4_K's pp512 products
        ran ~15% faster than with 64 rows, one thread); each stays one thread's at a time."""
        self.a2 = a2
        self.k = k
        self.fast_f16 = weight_type == "f16"
        self.a_checked = a_checked
        decoded = WIDE_B_PANEL_BYTES if 4 * n * k > WIDE_B_BYTES else DECODED_PANEL_BYTES
        self.rows = panel_rows(k, F32_PANEL_BYTES if weight_type == "f32" else decoded)
        self.workers = workers
        self.weight_type = weight_type

    def __call__(self, out2: np.ndarray, b2: np.ndarray) -> None:
        m = self.a2.shape[0]
        b_scaled = b2 * F16_SCALE if self.fast_f16 else None

        def work(lo: int, hi: int) -> None:
            scratch = np.empty(self.rows * self.k, np.int32) if self.fast_f16 else None
            for i in range(lo, hi, self.rows):
                j = min(i + self.rows, hi)
                panel = self.a2[i:j]
                if not self.fast_f16:
                    np.matmul(b2, to_f32(panel).T, out=out2[:, i:j])
                elif self.a_checked or not f16_has_inf_nan(panel):
                    np.matmul(b_scaled, f16_scaled(panel, scratch).T, out=out2[:, i:j])
                else:
                    np.matmul(b2, panel.astype(F32).T, out=out2[:, i:j])

        self.workers_share(work, m, b2.shape[0], self.rows)

    def rounded(self, b2: np.ndarray, round_rows: Callable[[np.ndarray], np.ndarray]
                ) -> np.ndarray:
        """round_rows(b2) (b's rounding to a's vec_dot type, row by row), its rows shared
        among the run's threads for a wide b: a 512-token prompt's q8_K rounding is ~2 ns a
        value, 4-5 ms per product, which the other threads would otherwise wait out."""
        threads = self.workers.threads if self.workers else 1
        if (threads == 1 or b2.size < ROUND_SHARE_MIN_VALUES or len(b2) < 2
                or vec_dot_type(self.weight_type) == "f32"):      # nothing to round
            return round_rows(b2)
        out = np.empty(b2.shape, F32)

        def work(lo: int, hi: int) -> None:
            out[lo:hi] = round_rows(b2[lo:hi])

        self.workers.share_evenly(work, len(b2))
        return out

    def one_row(self, out2: np.ndarray, b2: np.ndarray) -> bool:
        """out2 [1, M] = b2 (one f32 row, NOT yet rounded) @ a2ᵀ the way ggml's vec_dot does
        it, with no f32 panel of a (onerow.py); False where that path does not apply."""
        if (b2.shape[0] != 1 or self.weight_type not in onerow.TYPES
                or self.a2.shape[0] * self.k < onerow.MIN_VALUES
                or not np.isfinite(b2).all()):       # inf/nan b: ggml's rounding of it is
            return False                             # the decode path's business
        prepared = onerow.OneRow(b2[0], self.weight_type)
        if not prepared.usable:
            return False
        raw = np.asarray(self.a2).view(np.ndarray)
        rows = prepared.panel_rows(raw.shape[1])

        def work(lo: int, hi: int) -> None:
            scratch = prepared.scratch(raw.shape[1])
            for i in range(lo, hi, rows):
                j = min(i + rows, hi)
                prepared.dots(raw[i:j], out2[0, i:j], scratch)

        with Workers.blas_at_one_thread():     # its GEMVs of 18-34 columns: OpenBLAS's own
            self.workers_share(work, raw.shape[0], 1, rows)   # threads ran them 5-8x slower
        return True                                            # with the other core busy

    def workers_share(self, work: Callable[[int, int], None], m: int, n: int,
                      rows: int) -> None:
        """Whole panels of `rows` per thread, as evenly as they go; small products stay on
        one."""
        threads = self.workers.threads if self.workers else 1
        panels = -(-m // rows)
        if threads == 1 or panels < 2 or n * m * self.k < SPLIT_MIN_MACS:
            work(0, m)
            return
        self.workers.share_evenly(work, panels, rows, m)
