"""The reference evaluator: plain NumPy, a fresh array per tensor, no arenas, no planner.

It shares the kernels with the real executor (they are tested against independent formulas
on their own), so any disagreement with a planned run points at the schedule, the memory plan
or the binding; the ops of `reference_ops.OPS` (flash attention) it computes with its own
formula instead, so a kernel's own mistake shows too. Views alias a fresh byte buffer of their root, so `cpy` into a
view of a cache is seen by later views of that cache, as in ggml.
"""

from __future__ import annotations

import numpy as np

from ggmlrun.core.backends.runtime import strided_view
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import get_op
from ggmlrun.core.run.reference_ops import OPS as OWN_OPS


def evaluate(graph: Graph, leaf_values: dict[Tensor, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node's value (by name), computed in file order; leafs as given."""
    storage: dict[Tensor, np.ndarray] = {}   # root -> its bytes
    values: dict[Tensor, np.ndarray] = {}

    def fresh(tensor: Tensor) -> np.ndarray:
        storage[tensor] = np.zeros(max(tensor.nbytes, 1), dtype=np.uint8)
        return strided_view(storage[tensor], 0, tensor)

    for leaf in graph.leafs:
        values[leaf] = fresh(leaf)
        np.copyto(values[leaf], leaf_values[leaf])
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            spec = get_op(node.op)
            if node.is_view:
                values[node] = strided_view(storage[node.view_src], node.view_offset, node)
            else:
                values[node] = fresh(node)
            if not spec.view_op:
                kernel = OWN_OPS.get(node.op, spec.kernel)
                kernel(values[node], *[values[s] for s in node.src], **node.params)
    return {t.name: np.array(v) for t, v in values.items()}
