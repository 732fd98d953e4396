"""mul_mat of a quantized weight by ONE row of b, without decoding the weight to f32.

At one row (a token being generated, and pp's last-layer FFN, where llama keeps only the
output token) the product is a GEMV: each weight value is used once, so decoding it to f32
(1.4-2 ns a value here: short strided passes per 32-value block, then a scale multiply
broadcast over each block) costs ten times the GEMV itself. Here, as in ggml's vec_dot, b's integer
quants meet the weight's integer quants and the block scales come in per block:

- b is rounded to its vec_dot type once per call (q8_0 / q8_K: integer quants and a scale per
  block, the rounding that makes results match ggml) and laid out as a row of the weight's own
  bytes: b's quant under each quant byte, 0 under every scale byte.
- a panel of whole weight rows (contiguous bytes, scale bytes included, so every pass runs
  over long rows) is widened to int16, split into nibbles and multiplied by that b row in
  int16 (quant times quant: exact), cast to f32 once and summed per (sub-)block by one GEMV
  with a ones vector: ggml's integer block sums, exactly (integers below 2^24).
- the per-block sums meet the block scales (ggml's `sumi * d_a * d_b` order within a block;
  the sum over blocks is one f32 dot, ggml's own is SIMD-ordered too).

Same result as decode-then-GEMV within f32 rounding of the final sums (both are within a few
ulps of the exact value; tests/test_quant_onerow.py holds it to the f64 reference), and the
weight's f32 panel never exists. Types: q8_0, q4_0, q4_K (the ones models ship most); the rest
decode as before.
"""

from __future__ import annotations

from ggmlrun.core.util.lazynumpy import np, numpy_later
from ggmlrun.core.ir.blockdecode import f16_at, k_scale_bytes
from ggmlrun.core.ir.ops.quant import F32, QK_K, q8_0_quants, q8_k_quants

I16 = numpy_later(lambda np: np.int16)
PANEL_VALUES = 1 << 20          # weight values per panel: ~25 NumPy calls each, so panels are
                                # large (4 MiB of f32 products; 256K values ran 1.5x slower)
TYPES = ("q8_0", "q4_0", "q4_K")
MIN_VALUES = 1 << 20            # smaller weights keep the decode path: holding BLAS to one
                                # thread for the call costs ~20-50 us


def _f16_column(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` (even) of every block ([r, n, size] uint8) as f32 [r, n]."""
    r, n, size = blocks.shape
    return f16_at(blocks.reshape(r * n, size).view(np.uint16), at // 2).reshape(r, n)


PAGE = 4096
UNDER_LEAD = 3072           # bytes, mod 4 KiB, from b's quants to each row of the products


def _at_offset(block: np.ndarray, start: int, residue: int) -> int:
    """The first int16 index of `block` from `start` whose address is `residue` mod 4 KiB."""
    return start + (residue - block.ctypes.data - 2 * start) % PAGE // 2


def _whole_pages(values: int) -> int:
    """int16 values per row, padded to whole 4 KiB where that adds a quarter or less."""
    padded = -(-values * 2 // PAGE) * PAGE // 2
    return padded if padded - values <= values // 4 else values


class Scratch:
    """One thread's buffers for panels of up to `rows` weight rows (fresh arrays per panel
    would be fresh pages: their faults cost as much as the arithmetic).

    q4_K's int16 products are half-major ([low/high nibbles, rows, K/2]): a pass over one
    half then streams whole pages instead of 4 KiB runs with 4 KiB gaps (the shift and mask
    passes ran 2-3x slower row-major at K 4096). They share one block with the thread's own
    copy of b's quants (`under`), every row of each starting UNDER_LEAD bytes (mod 4 KiB)
    after its half of `under` (rows whole 4 KiB where that costs little): x86 makes a load
    wait for an older in-flight store at the same address mod 4 KiB ("4K aliasing"), and
    left to where the allocator put them, `products *= under` ran 1x-3x its time."""

    def __init__(self, rows: int, row_bytes: int, name: str, under: np.ndarray):
        quants = row_bytes * 128 // 144 if name == "q4_K" else row_bytes
        halves = 2 if name == "q4_K" else 1
        self.under = under
        self.f32 = np.empty(rows * halves * quants, F32)
        self.high = np.empty((rows, quants), I16) if name == "q4_0" else None
        if name != "q4_K":
            self.wide = np.empty((rows, halves, quants), I16)
            return
        row = _whole_pages(quants)
        block = np.empty(2 * row + 2 * rows * row + PAGE, I16)
        u0 = _at_offset(block, 0, 0)
        w0 = _at_offset(block, u0 + 2 * row, UNDER_LEAD)
        self.under = block[u0:u0 + 2 * row].reshape(2, 1, row)[:, :, :quants]
        np.copyto(self.under, under.reshape(2, 1, quants))
        self.wide = block[w0:w0 + 2 * rows * row].reshape(2, rows, row)[:, :, :quants]


class OneRow:
    """b (one row, f32) prepared for the weight type `name`; `dots(rows)` is rows·b.

    `usable` is False where b's quants are not finite (values so small that 1/d overflows:
    ggml's own rounding is undefined there; the decode path's gives nan), so the caller
    keeps the decode path."""

    def __init__(self, b: np.ndarray, name: str):
        self.name = name
        x = np.ascontiguousarray(b, dtype=F32).reshape(-1)
        if name == "q4_K":
            self._prepare_q8_k(x)
        else:
            self._prepare_q8_0(x)

    def _prepare_q8_0(self, x: np.ndarray) -> None:
        d, q = q8_0_quants(x.reshape(-1, 32))
        self.usable = bool(np.isfinite(q).all())
        q = q if self.usable else np.zeros_like(q)   # unused then; zeros cast to int16 quietly
        self.b_scale = d.astype(np.float16).astype(F32)     # q8_0 stores d as f16
        n = len(q)
        if self.name == "q8_0":                  # [d:2][32 int8]: b's 32 quants under them
            self.size = 34
            under = np.zeros((1, n, 34), I16)
            under[0, :, 2:] = q
        else:                                    # q4_0 [d:2][16 bytes]: low nibble j, high j+16
            self.size = 18
            under = np.zeros((2, n, 18), I16)
            under[0, :, 2:] = q[:, :16]
            under[1, :, 2:] = q[:, 16:]
            self.offset = q.sum(axis=1) * F32(8)            # q4_0's quants are nibble - 8
        self.under = under.reshape(len(under), -1)

    def _prepare_q8_k(self, x: np.ndarray) -> None:
        d, q = q8_k_quants(x.reshape(-1, QK_K))
        self.usable = bool(np.isfinite(q).all())
        q = q if self.usable else np.zeros_like(q)   # unused then; zeros cast to int16 quietly
        self.b_scale = d
        n = len(q)
        self.size = 144                          # [d:2][dmin:2][scales:12][4 x 32 bytes]
        sub = q.reshape(n, 4, 2, 32).astype(I16)  # byte c·32+j: low nibble c·64+j, high +32
        self.under = np.ascontiguousarray(sub.transpose(2, 0, 1, 3)).reshape(2, n, 128)
        self.b_sums = q.reshape(n, 8, 32).sum(axis=2)       # per sub-block, for the mins

    def panel_rows(self, row_bytes: int) -> int:
        values = row_bytes * (1 if self.name == "q8_0" else 2)
        return max(1, PANEL_VALUES // values)

    def scratch(self, row_bytes: int) -> Scratch:
        return Scratch(self.panel_rows(row_bytes), row_bytes, self.name, self.under)

    def dots(self, rows: np.ndarray, out: np.ndarray, scratch: Scratch) -> None:
        """out [R] = rows (uint8 [R, row_bytes], whole weight rows) · b.

        Products of quants stay int16 (|q_a·q_b| <= 15·127 per nibble, 127·127 for q8_0;
        a q4_0 byte's two products summed <= 3810) until one cast to f32 for the block sums."""
        rows = np.ascontiguousarray(np.asarray(rows).view(np.ndarray))
        r = len(rows)
        blocks = rows.reshape(r, -1, self.size)
        if self.name == "q4_K":
            self._q4_k_dots(blocks, out, scratch)
            return
        wide = scratch.wide[:r, 0]
        if self.name == "q8_0":
            np.copyto(wide, rows.view(np.int8))
            wide *= self.under[0]
        else:
            high = scratch.high[:r]
            np.copyto(wide, rows)
            np.right_shift(wide, I16(4), out=high)
            wide &= I16(15)
            wide *= self.under[0]
            high *= self.under[1]
            wide += high
        wide32 = scratch.f32[:wide.size].reshape(wide.shape)
        np.copyto(wide32, wide)
        block = (wide32.reshape(-1, self.size) @ np.ones(self.size, F32)).reshape(r, -1)
        if self.name == "q4_0":
            block -= self.offset
        block *= _f16_column(blocks, 0)
        np.matmul(block, self.b_scale, out=out)

    def _q4_k_dots(self, blocks: np.ndarray, out: np.ndarray, scratch: Scratch) -> None:
        """ggml's q4_K·q8_K: Σ_blocks d_a·d_b·Σ_s sc_s·(Σ q·q_b) − dmin_a·d_b·Σ_s m_s·Σ q_b."""
        r, n = blocks.shape[:2]
        nibbles = np.reshape(scratch.wide[:, :r], (2, r, n, 128), copy=False)   # half-major
        np.copyto(nibbles[0], blocks[:, :, 16:])
        np.right_shift(nibbles[0], I16(4), out=nibbles[1])
        nibbles[0] &= I16(15)
        nibbles *= np.reshape(scratch.under, (2, 1, n, 128), copy=False)
        wide32 = scratch.f32[:2 * r * n * 128].reshape(2, r, n, 128)
        np.copyto(wide32, nibbles)
        sums = (wide32.reshape(-1, 32) @ np.ones(32, F32)).reshape(2, r * n, 4)
        packed = k_scale_bytes(blocks.reshape(r * n, -1))   # sub-block s = 2·chunk + half:
        pairs = packed.view(np.uint16)[:, :4]                # the scales of s and s+1
        by_half = np.empty((2, r * n, 4), np.uint16)         # sums' layout: one contiguous
        np.bitwise_and(pairs, np.uint16(0xFF), out=by_half[0])   # multiply, not strided
        np.right_shift(pairs, np.uint16(8), out=by_half[1])
        sums *= by_half.astype(F32)
        scaled = (sums[0] + sums[1]) @ np.ones(4, F32)
        mins = packed[:, 2:].view(np.uint8).astype(F32).reshape(r, n, 8)
        mins = (mins * self.b_sums).reshape(-1, 8) @ np.ones(8, F32)
        scaled = scaled.reshape(r, n)
        scaled *= _f16_column(blocks, 0) * self.b_scale
        scaled -= mins.reshape(r, n) * (_f16_column(blocks, 2) * self.b_scale)
        np.sum(scaled, axis=1, out=out)
