"""What a backends list says (SPEC.md section 3), before any memory exists."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from ggmlrun.core.util import host

GiB = 1024**3
NO_OFFLOAD = 2**62      # beyond any batch: a backend without offload_op (ggml-rpc)


def physical_memory() -> int:
    """The host's RAM, the CPU backend's default `memory` (core/util/host.py, GGMLRUN_HOST_RAM)."""
    return host.ram_total()


@dataclass
class BackendSpec:
    name: str
    kind: str                              # "cpu" | "sim" | "rpc"
    memory: int                            # capacity in bytes: weights + arena
    alignment: int
    threads: int | None = None             # cpu: caps BLAS threads
    supports: frozenset[str] | None = None  # None: every op not in `unsupported`
    unsupported: frozenset[str] = field(default_factory=frozenset)
    # op -> source types it refuses on this backend ("mul_mat on q4_K but not on iq2_xxs")
    unsupported_types: dict[str, frozenset[str]] = field(default_factory=dict)
    offload_min_batch: int = 32
    offload_ops: frozenset[str] | None = None   # the ops op offload moves; None: any
    flops: float = 50e12                   # sim cost model
    mem_bw: float = 1e12
    link_bw: float = 25e9
    link_latency: float = 10e-6
    # What a device's buffer type allocates beyond ggml_nbytes (core/backends/profiles.py):
    # a quantized tensor whose rows are not a multiple of `row_padding` elements is padded up to
    # it once (ggml-cuda: MATRIX_ROW_PADDING, 512); 0 pads nothing.
    row_padding: int = 0
    # head sizes (K's, V's) FLASH_ATTN_EXT runs with on this device (a set of pairs, or a rule
    # that answers `in`, core/backends/profiles.py); None: any
    flash_attn_head_sizes: Container[tuple[int, int]] | None = None
    profile: str | None = None             # the device profile the defaults came from
    # a device with a host buffer type (ggml-cuda's pinned CUDA_Host): llama.cpp puts it before
    # ggml-cpu's extra buffer types in the CPU's list, so no CPU weight is repacked beside it
    host_buffer: bool = False
    # ggml-cuda's graph_optimize: the allocation dependencies of the MoE fusions it will make
    # (core/sched/fusion_deps.py)
    fusion_alloc_deps: bool = False
    # cpu: which weight types ggml-cpu repacks into CPU_REPACK (core/backends/repack.py):
    # avx2 | avx512 | neon | none; None: this host's CPU flags
    repack: str | None = None
    # rpc: the ggml rpc-server (host:port) and its device index; its largest buffer
    endpoint: str | None = None
    rpc_device: int = 0
    max_buffer_size: int | None = None
    line: int | None = None

    @property
    def repack_kind(self) -> str:
        """The repack in force: the backend's own, else the host's CPU flags'."""
        if self.repack is not None:
            return self.repack
        from ggmlrun.core.backends.repack import host_repack

        return host_repack()

    @classmethod
    def of_kind(cls, name: str, kind: str, line: int | None = None) -> "BackendSpec":
        """A backend with its kind's defaults (SPEC.md section 3).

        The CPU's cost model (100 GFLOP/s, 20 GB/s) is ggmlrun's own estimate for a small
        machine, used only by `--policy cost` and the modeled columns; override with `flops`
        and `mem_bw`.
        """
        if kind == "cpu":
            return cls(name=name, kind=kind, memory=physical_memory(), alignment=64,
                       flops=100e9, mem_bw=20e9, line=line)
        if kind == "rpc":    # no op offload (the RPC backend has no offload_op)
            # copies cross the network: 1 Gbit/s Ethernet and a LAN round trip by default
            return cls(name=name, kind=kind, memory=16 * GiB, alignment=32,
                       offload_min_batch=NO_OFFLOAD, link_bw=125e6, link_latency=200e-6, line=line)
        return cls(name=name, kind=kind, memory=16 * GiB, alignment=128, line=line)

    def supports_op(self, op: str, src_dtypes: tuple[str, ...] = ()) -> bool:
        """Whether this backend computes `op` on sources of these ggml types.

        ggml asks the same of a backend per node (supports_op sees the tensor, types included):
        a device may run mul_mat on q4_K but not on iq2_xxs. Without `src_dtypes` the answer
        is by op name alone. View ops compute nothing, so every backend "runs" them: they
        follow their source.
        """
        from ggmlrun.core.ir.ops import OPS

        if op in OPS and OPS[op].view_op:
            return True
        if op in self.unsupported:
            return False
        if self.supports is not None and op not in self.supports:
            return False
        refused = self.unsupported_types.get(op)
        return not (refused and any(dtype in refused for dtype in src_dtypes))


    def alloc_size(self, dtype: str, shape, nbytes: int) -> int:
        """ggml_backend_buft_get_alloc_size: the bytes this backend's buffer type takes for a
        tensor of this type, NumPy-order shape and ggml_nbytes, before alignment."""
        if not self.row_padding or not shape:
            return nbytes
        from ggmlrun.core.ir.types import TYPES

        t = TYPES.get(dtype)
        ne0 = shape[-1]
        if t is None or not t.is_block or ne0 % self.row_padding == 0:
            return nbytes
        return nbytes + t.row_bytes(self.row_padding - ne0 % self.row_padding)

    def supports_node(self, node) -> bool:
        """supports_op, plus what depends on shapes: FLASH_ATTN_EXT's head sizes."""
        if not self.supports_op(node.op, tuple(s.dtype for s in node.src)):
            return False
        if node.op == "flash_attn_ext" and self.flash_attn_head_sizes is not None:
            k, v = node.src[1], node.src[2]
            return (k.shape[-1], v.shape[-1]) in self.flash_attn_head_sizes
        return True


def default_cpu(name: str = "CPU") -> BackendSpec:
    return BackendSpec.of_kind(name, "cpu")


def default_sim(name: str = "SIM0") -> BackendSpec:
    return BackendSpec.of_kind(name, "sim")


def default_backends() -> list[BackendSpec]:
    """SPEC.md's default set: a simulated device first, then the CPU."""
    return [default_sim(), default_cpu()]
