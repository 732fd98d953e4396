"""The graph of any registered architecture for one ubatch: the registry's Arch picks the
tensor table and the layer loop; the Decoder (models/graph/decoder.py) holds the inputs and the
shared pieces, the output head closes it. The graph builders load with the first graph, never
with a header (docs/models.md), hence the imports inside the function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.models.arch import get_arch
from ggmlrun.models.arch.base import check_tensors

if TYPE_CHECKING:
    from ggmlrun.models.graph.output import ModelGraph


def build_graph(model, n_tokens: int, n_outputs: int, n_kv: int, kv_size: int,
                flash_attn: bool, kv_type: str, shared: tuple = (),
                n_stream: int = 1, swa_size: int = 0, swa_n_kv: int = 0,
                rs_zero: int = 0, n_seqs: int = 1) -> ModelGraph:
    """The graph llama.cpp builds for `model` (any registered architecture) and one ubatch,
    over caches of these sizes: `kv_size` cells per stream, `n_stream` KV streams (-np N
    without -kvu: one per sequence), `swa_size` the SWA cache's cells (default the full
    cache's); the rest as graph_over."""
    from ggmlrun.models.memory.caches import create_memory

    memory = create_memory(model.hparams, kv_type=kv_type, cells=kv_size,
                           flash_attn=flash_attn, n_stream=n_stream, swa_cells=swa_size,
                           n_seq_max=n_seqs)
    return graph_over(model, memory, n_tokens, n_outputs, n_kv, swa_n_kv=swa_n_kv,
                      shared=shared, rs_zero=rs_zero, n_seqs=n_seqs)


def graph_over(model, memory, n_tokens: int, n_outputs: int, n_kv: int, *,
               swa_n_kv: int = 0, shared: tuple = (), rs_zero: int = 0,
               n_seqs: int = 1) -> ModelGraph:
    """The graph over caches already sized (models/memory/caches.py): its layout (cells,
    streams, type, V transposed) is the memory's. `n_kv` (`swa_n_kv`) cells are attended over;
    `shared`: (name, each layer's representative layer) for the per-layer duplicated tensors
    (Placement.shared_copies; without it every layer gets its own copy); `n_seqs`: the
    ubatch's sequences (a reserve's n_seq_max), equal splits of n_tokens, a hybrid model's
    state rows all seen by the graph (the whole memory, as in a reserve)."""
    from ggmlrun.models.graph.decoder import Decoder
    from ggmlrun.models.graph.output import output_head

    where = model.label if model.path or model.source else None
    arch = get_arch(model.arch, where)
    table = check_tensors(arch, model.hparams, model.tensors, where)
    d = Decoder(model, arch, memory, n_tokens, n_outputs, n_kv, table=table, swa_n_kv=swa_n_kv,
                shared=shared, rs_zero=rs_zero, n_seqs=n_seqs)
    return output_head(d, arch.build(d), rows_after_norm=arch.rows_after_norm,
                       rows_before_norm=arch.rows_before_norm)
