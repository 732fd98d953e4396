"""ggml-cpu's repacked weights (ggml/src/ggml-cpu/repack.cpp, ggml 0.25.3): which weight types
the CPU backend's extra buffer type (`CPU_REPACK`) takes, per instruction set.

llama.cpp's loader offers a CPU weight to the extra buffer types first
(`select_weight_buft` with the op that reads it): a matrix read by MUL_MAT whose type the CPU
repacks, and whose rows (ne[1]) are a multiple of the repacked tile, is allocated in a
`CPU_REPACK` buffer (its ggml_nbytes: the interleaved layout takes the same bytes) and
repacked there at load. With mmap the file range stays mapped too (the loader maps the
range from the first to the last CPU tensor), so such a weight costs host RAM twice:
page cache and the repacked copy. `token_embd` is read by GET_ROWS and is never repacked.

`ggml_repack_get_optimal_repack_type`, by CPU features:
- x86 AVX2: q4_0, q4_K, iq4_nl, mxfp4 (rows a multiple of 8);
- x86 AVX-512 (avx512f): the AVX2 types and q2_K;
- ARM NEON with dotprod and i8mm (any current ARM server or Apple M core): q4_0, iq4_nl,
  mxfp4, q8_0 (rows a multiple of 4), q4_K, q5_K, q6_K (8);
- none: nothing is repacked.
"""

from __future__ import annotations

REPACK_KINDS = ("avx2", "avx512", "neon", "none")

_AVX2 = {"q4_0": 8, "q4_K": 8, "iq4_nl": 8, "mxfp4": 8}
REPACK_TYPES: dict[str, dict[str, int]] = {      # kind -> type -> rows must be a multiple of
    "avx2": _AVX2,
    "avx512": _AVX2 | {"q2_K": 8},
    "neon": {"q4_0": 4, "iq4_nl": 4, "mxfp4": 4, "q8_0": 4, "q4_K": 8, "q5_K": 8, "q6_K": 8},
    "none": {},
}


def host_repack() -> str:
    """The repack this host's CPU flags give (GGMLRUN_HOST_CPU_FLAGS overrides them)."""
    from ggmlrun.core.util import host

    return host.repack()


def repacked(kind: str | None, dtype: str, shape) -> bool:
    """Whether ggml-cpu with this repack kind moves a weight of this type and NumPy shape into
    CPU_REPACK: a 2-D matrix read by MUL_MAT, or a 3-D one (a model's experts) read by
    MUL_MAT_ID (the extra buffer's supports_op takes both), its ne[1] (rows per matrix) a
    multiple of the tile."""
    tile = REPACK_TYPES.get(kind or "none", {}).get(dtype)
    if tile is None or len(shape) not in (2, 3):
        return False
    return shape[-2] % tile == 0
