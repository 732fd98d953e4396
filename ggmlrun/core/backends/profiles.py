"""Device profiles: what a real GPU backend does that changes bytes and placement.

A backends-file entry `{name: GPU0, kind: sim, profile: cuda}` starts from the profile's values;
keys given beside it override them. Every rule below is read from the ggml that llama-cpp-python
0.3.36 vendors (ggml 0.25.3); only `cuda` and `rpc` are also checked against llama.cpp itself.

`cuda`, measured on an NVIDIA H200 (tests/data/llamacpp/figures_cuda.json, docs/models.md "CUDA:
measured on NVIDIA H200"):
- alignment 128 (ggml_backend_cuda_buffer_type_get_alignment);
- op offload from a batch of 32 (GGML_OP_OFFLOAD_MIN_BATCH's default), any op but GET_ROWS;
- row_padding 512: ggml_backend_cuda_buffer_type_get_alloc_size pads a quantized tensor whose
  rows are not a multiple of MATRIX_ROW_PADDING (512) elements by the missing elements of one row;
- FLASH_ATTN_EXT only at the head sizes ggml_cuda_get_best_fattn_kernel has kernels for: K = V in
  40, 64, 72, 80, 96, 112, 128, 256 and 512, and (K, V) (192, 128), (320, 256), (576, 512). The
  kernel's further conditions for the last four (a GQA ratio, a padded cache) and its KV types
  are not modeled, nor the f16 copies of a quantized K/V its alloc size adds (measured by the
  probe, not by a configuration yet);
- host_buffer: ggml-cuda has a host buffer type (CUDA_Host, pinned), which make_cpu_buft_list
  (llama-model.cpp) puts before ggml-cpu's extra buffer types; a CPU weight then picks it, and
  under mmap llama_model_loader::create_tensor swaps it for the plain CPU buffer type ("avoid
  using a host buffer when using mmap"): beside a CUDA device no CPU weight is repacked, the
  experts of -ot exps=CPU / --cpu-moe / --n-cpu-moe included (tests/data/llamacpp/
  figures_cuda_moe.json: the MXFP4 file's q8_0 matrices and experts stay in CPU_Mapped).
- fusion_alloc_deps: ggml_backend_cuda_graph_optimize's allocation dependencies for the MoE
  fusions it will make (the top-k router, the experts' weighted sum: core/sched/fusion_deps.py),
  unless GGML_CUDA_DISABLE_FUSION is set (`fusion: false` in a backends file); measured, they
  change the GPU's compute buffer in 155 of 257 MoE configurations.

`metal`, read from ggml-metal's source, not measured (no Apple GPU recorded it); lines are
ggml/src/ggml-metal/ in ggml 0.25.3:
- alignment 32 (ggml-metal.cpp:269, 345, 421: the shared, private and mapped buffer types);
- no row padding: ggml_backend_metal_buffer_type_get_alloc_size (ggml-metal.cpp:220) is
  ggml_nbytes, plus scratch for MUL_MAT_ID, FLASH_ATTN_EXT, ARGSORT/CUMSUM (twice) and TOP_K,
  which is not modeled;
- op offload of MUL_MAT only (and MUL_MAT_ID, which ggmlrun's graphs do not have), from a batch
  of 32 (ggml_backend_metal_device_offload_op, ggml-metal.cpp:774; op_offload_min_batch_size,
  ggml-metal-device.m:1285);
- ggml_metal_device_supports_op (ggml-metal-device.m:1539): no DIAG_MASK_INF (the switch's
  default); FLASH_ATTN_EXT (:1727) at a K head size of 32, 40, 48, 64, 72, 80, 96, 112, 128,
  192, 256, 320, 512 or 576, V's not above K's (72 only with 72), on K/V of f32, f16, bf16, q8_0,
  q4_0, q4_1, q5_0 or q5_1 (not iq4_nl). Its largest buffer is the GPU's maxBufferLength.

`vulkan`, read from ggml-vulkan's source, not measured (no Vulkan GPU recorded it); lines are
ggml/src/ggml-vulkan/ggml-vulkan.cpp:
- alignment 16: ggml_backend_vk_buffer_type_get_alignment (:13034) is the device's
  minStorageBufferOffsetAlignment, 16 as NVIDIA's drivers report it (other vendors' differ,
  AMD's report 4): set `alignment` for another GPU;
- no row padding (ggml_backend_vk_buffer_type_get_alloc_size, :13044, is ggml_nbytes);
- max_buffer_size 1 GiB: get_max_size (:13039) is suballocation_block_size, 1 GiB unless the
  GPU's maxMemoryAllocationSize is smaller (:4211-4218; recorded as an rpc device's is, not
  modeled);
- op offload as ggml-cuda's, any op but GET_ROWS from a batch of 32
  (ggml_backend_vk_device_offload_op, :15973; ggml_vk_get_op_batch_size, ggml-vulkan-debug.cpp);
- FLASH_ATTN_EXT only when K's and V's head sizes are multiples of 8
  (ggml_backend_vk_device_supports_op, :15451; its subgroup-feature condition is taken as met).

`rpc`, ggml-rpc's own rules with a CPU rpc-server behind it, as llama.cpp's RPC figures were
recorded (graphs/backends/llamacpp_rpc.yaml, tests/data/llamacpp/figures.json); lines are
ggml/src/ggml-rpc/ggml-rpc.cpp:
- alignment 32: ggml_backend_rpc_buffer_type_get_alignment (:828) asks the server, whose CPU
  buffer type aligns to TENSOR_ALIGNMENT, 32 (ggml-backend.cpp:2474, ggml-impl.h:44); set
  `alignment` for another server;
- alloc size ggml_nbytes: ggml_backend_rpc_buffer_type_get_alloc_size (:846) asks the server,
  and a CPU pads nothing;
- every op (ggml_backend_rpc_device_supports_op, :2216, returns true) and no op offload (its
  offload_op is NULL, :2262).
"""

from __future__ import annotations

from ggmlrun.core.backends.spec import NO_OFFLOAD, BackendSpec

CUDA_FLASH_ATTN_HEAD_SIZES = frozenset({(d, d) for d in (40, 64, 72, 80, 96, 112, 128, 256, 512)}
                                       | {(192, 128), (320, 256), (576, 512)})
METAL_FLASH_ATTN_K_SIZES = frozenset({32, 40, 48, 64, 72, 80, 96, 112, 128, 192, 256, 320, 512,
                                      576})


class HeadSizeRule:
    """FLASH_ATTN_EXT's head sizes as a rule rather than a list: `(k, v) in rule`."""

    def __init__(self, text: str, rule):
        self.text, self.rule = text, rule

    def __contains__(self, pair) -> bool:
        k, v = pair
        return bool(self.rule(k, v))

    def __repr__(self) -> str:
        return self.text


def _metal_heads(k: int, v: int) -> bool:
    return k in METAL_FLASH_ATTN_K_SIZES and v <= k and (k != 72 or v == 72)


def _vulkan_heads(k: int, v: int) -> bool:
    return k % 8 == 0 and v % 8 == 0


METAL_FLASH_ATTN_HEAD_SIZES = HeadSizeRule(
    "K in ggml-metal's list (32 to 576), V no larger, 72 only with 72", _metal_heads)
VULKAN_FLASH_ATTN_HEAD_SIZES = HeadSizeRule("K and V multiples of 8", _vulkan_heads)

PROFILES: dict[str, dict] = {
    "cuda": {"alignment": 128, "offload_min_batch": 32, "row_padding": 512,
             "flash_attn_head_sizes": CUDA_FLASH_ATTN_HEAD_SIZES, "host_buffer": True,
             "fusion_alloc_deps": True},
    "metal": {"alignment": 32, "offload_min_batch": 32,
              "offload_ops": frozenset({"mul_mat", "mul_mat_id"}),   # ggml-metal: both
              "unsupported": frozenset({"diag_mask_inf"}),
              "unsupported_types": {"flash_attn_ext": frozenset({"iq4_nl"})},
              "flash_attn_head_sizes": METAL_FLASH_ATTN_HEAD_SIZES},
    "vulkan": {"alignment": 16, "offload_min_batch": 32, "max_buffer_size": 2**30,
               "flash_attn_head_sizes": VULKAN_FLASH_ATTN_HEAD_SIZES},
    "rpc": {"alignment": 32, "offload_min_batch": NO_OFFLOAD},
}


def apply_profile(spec: BackendSpec, profile: str) -> BackendSpec:
    """Sets the profile's values on a device backend (KeyError: no such profile)."""
    for key, value in PROFILES[profile].items():
        setattr(spec, key, dict(value) if isinstance(value, dict) else value)
    spec.profile = profile
    return spec
