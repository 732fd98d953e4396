"""The projector's buffers as libmtmd allocates them (tools/mtmd/clip.cpp, clip_ctx):

- Backends: the main device (the first non-CPU backend: ggml_backend_init_by_type(GPU), or
  llama-server's first --device), then the CPU; the CPU alone with --no-mmproj-offload. Its
  own ggml_backend_sched over them (op offload on, no pipeline parallelism).
- Weights: one buffer of the device's (or the CPU's) default type holding every tensor
  load_tensors asks for, each ggml_backend_buft_get_alloc_size padded to the alignment; never
  memory-mapped.
- Compute buffers: the warm-up graph (the projector type's warm-up image) reserved on that
  sched. Flash attention auto tries it on and keeps it when the device supports
  flash_attn_ext, else reserves again with it off (the allocator only grows: each backend's
  buffer is the larger of the two). The raw image is a graph input, which ggml's sched puts
  on the CPU: the CPU holds a compute buffer even when everything else is on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.memory.alloc import GraphAllocator
from ggmlrun.core.memory.sequence import allocation_sequence
from ggmlrun.core.sched.scheduler import Scheduler
from ggmlrun.core.util.fmt import align_up
from ggmlrun.models.projector import gemma3, qwen3vl
from ggmlrun.models.projector.clip import ClipModel
from ggmlrun.models.projector.loaded import requested
from ggmlrun.models.projector.vit import ClipGraph

BUILDERS = {"gemma3": gemma3.build, "qwen3vl_merger": qwen3vl.build}


@dataclass(frozen=True)
class ProjectorFigures:
    name: str
    projector_type: str
    backend: str                  # where its weights and most of its compute buffer are
    weights_bytes: int
    arena: dict[str, int]         # its compute buffer per backend of its sched
    n_nodes: int
    n_splits: int
    flash_attn: bool              # as libmtmd resolved it
    image_size: int               # the warm-up image's side

    @property
    def arena_bytes(self) -> int:
        return self.arena.get(self.backend, 0)

    def bytes_on(self, name: str) -> int:
        """Everything of the projector's on backend `name`."""
        return (self.weights_bytes if name == self.backend else 0) + self.arena.get(name, 0)


def projector_backends(backends: list[BackendSpec], offload: bool) -> list[BackendSpec]:
    cpu = backends[-1]
    device = next((b for b in backends if b.kind != "cpu"), None)
    return [device, cpu] if offload and device is not None else [cpu]


def weights_bytes(model: ClipModel, spec: BackendSpec) -> int:
    total = 0
    for name in requested(model.hparams.projector_type, model.hparams.n_layer):
        t = model.tensors.get(name)
        if t is not None:
            nbytes = TYPES[t.dtype].contiguous_bytes(t.shape)
            total += align_up(spec.alloc_size(t.dtype, t.shape, nbytes), spec.alignment)
    return total


def flash_attn_mode(value) -> str:
    """The text model's -fa as llama-server hands it to mtmd: on, off or auto."""
    if value is None or value == "auto":
        return "auto"
    return "on" if value in (True, "on") else "off"


def measure_projector(model: ClipModel, backends: list[BackendSpec], offload: bool = True,
                      flash_attn="auto", ggml: str = "0.25") -> ProjectorFigures:
    own = projector_backends(backends, offload)
    scheduler = Scheduler(own, op_offload=True, ggml=ggml)
    allocator = GraphAllocator([b.alignment for b in own], ggml=ggml,
                               sizers=[b.alloc_size if b.row_padding else None for b in own])
    build = BUILDERS[model.hparams.projector_type]
    mode = flash_attn_mode(flash_attn)
    tries = [mode == "on"] if mode != "auto" else [True]
    arena = [0] * len(own)
    while True:
        fa = tries[-1]
        graph, _ = build(ClipGraph(model, fa))
        sched = scheduler.schedule(graph, placed=_placed(graph, own[0].name))
        plan = allocator.plan(*allocation_sequence(sched))
        arena = [max(a, b) for a, b in zip(arena, plan.arena_bytes)]
        if not (mode == "auto" and fa and not own[0].supports_op("flash_attn_ext")):
            break
        tries.append(False)        # clip's warmup: not supported, reserve again without
    return ProjectorFigures(name=model.name, projector_type=model.hparams.projector_type,
                            backend=own[0].name, weights_bytes=weights_bytes(model, own[0]),
                            arena={b.name: a for b, a in zip(own, arena)},
                            n_nodes=len(graph.nodes), n_splits=len(sched.splits),
                            flash_attn=tries[-1], image_size=model.hparams.warmup_image_size)


def _placed(graph, backend: str) -> dict:
    return {t: backend for t in graph.leafs if t.role == "weight"}
