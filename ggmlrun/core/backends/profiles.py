"""Device profiles: what a real GPU backend does that changes bytes, read from its source and
checked against llama.cpp recorded on that GPU.

A backends-file entry `{name: CUDA0, kind: sim, profile: cuda}` starts from the profile's values;
keys given beside it override them. Only `cuda` exists, measured on an NVIDIA H200
(tests/data/llamacpp/figures_cuda.json, docs/models.md "CUDA: measured on NVIDIA H200"):

- alignment 128 (ggml_backend_cuda_buffer_type_get_alignment);
- op offload from a batch of 32 (GGML_OP_OFFLOAD_MIN_BATCH's default);
- row_padding 512: ggml_backend_cuda_buffer_type_get_alloc_size pads a quantized tensor whose
  rows are not a multiple of MATRIX_ROW_PADDING (512) elements by the missing elements of one row;
- FLASH_ATTN_EXT only at the head sizes ggml_cuda_get_best_fattn_kernel has kernels for: K = V in
  40, 64, 72, 80, 96, 112, 128, 256 and 512, and (K, V) (192, 128), (320, 256), (576, 512). The
  kernel's further conditions for the last four (a GQA ratio, a padded cache) and its KV types
  are not modeled, nor the f16 copies of a quantized K/V its alloc size adds (measured by the
  probe, not by a configuration yet).
"""

from __future__ import annotations

from ggmlrun.core.backends.spec import BackendSpec

CUDA_FLASH_ATTN_HEAD_SIZES = frozenset({(d, d) for d in (40, 64, 72, 80, 96, 112, 128, 256, 512)}
                                       | {(192, 128), (320, 256), (576, 512)})

PROFILES: dict[str, dict] = {
    "cuda": {"alignment": 128, "offload_min_batch": 32, "row_padding": 512,
             "flash_attn_head_sizes": CUDA_FLASH_ATTN_HEAD_SIZES},
}


def apply_profile(spec: BackendSpec, profile: str) -> BackendSpec:
    """Sets the profile's values on a device backend (KeyError: no such profile)."""
    for key, value in PROFILES[profile].items():
        setattr(spec, key, value)
    spec.profile = profile
    return spec
