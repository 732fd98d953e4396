"""What a run produced: output summaries, the reference check, and the .npz written atomically."""

from __future__ import annotations



from pathlib import Path

import numpy as np

from ggmlrun.core.util.atomic import write_atomic
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.types import type_name
from ggmlrun.core.run.reference import evaluate

# relative tolerance of `run --check`, by output dtype (SPEC: f32 within 1e-5 relative)
CHECK_TOLERANCE = {"f32": 1e-5, "f16": 1e-3, "i32": 0.0}


def summarize(arr: np.ndarray) -> dict:
    wide = arr.astype(np.float64)
    return {"shape": list(arr.shape), "dtype": type_name(arr.dtype),
            "sum": float(wide.sum()), "l2": float(np.sqrt((wide * wide).sum()))}


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|, with infinities and NaNs compared exactly."""
    got = got.astype(np.float64)
    want = want.astype(np.float64)
    special = ~np.isfinite(want) | ~np.isfinite(got)
    if special.any():
        same = (np.isnan(got) & np.isnan(want)) | (got == want)
        if not same[special].all():
            return float("inf")
    finite = ~special
    if not finite.any():
        return 0.0
    scale = max(float(np.abs(want[finite]).max()), 1e-30)
    return float(np.abs(got[finite] - want[finite]).max()) / scale


def compare_with_reference(graph: Graph, leaf_values: dict[Tensor, np.ndarray],
                           inputs: dict[Tensor, np.ndarray], outputs: dict[str, np.ndarray],
                           runs: int = 1) -> dict[str, float]:
    """Errors against the reference after the same number of runs: a graph that writes into
    a weight it reads (a KV cache through cpy) sees that weight change from run to run, so
    one reference run would report a false mismatch after `--repeat N`. The reference is
    repeated only while some weight actually changes."""
    values = dict(leaf_values)
    values.update(inputs)
    want = evaluate(graph, values)
    for _ in range(runs - 1):
        updated = {leaf: want[leaf.name] for leaf in graph.leafs if leaf not in inputs}
        if all(np.array_equal(updated[leaf], values[leaf], equal_nan=True) for leaf in updated):
            break           # nothing writes into a weight: every further run is the same
        values.update(updated)
        want = evaluate(graph, values)
    return {name: relative_error(arr, want[name]) for name, arr in outputs.items()}


def check_tolerance(graph: Graph) -> dict[str, float]:
    """Each output's tolerance: its dtype's, or looser where it depends on a node the reference
    computes by the plain formula while the kernel rounds as ggml-cpu does (reference_ops)."""
    from ggmlrun.core.run.reference_ops import LOOSER, rounds

    loose: dict[Tensor, float] = {}
    for node in graph.nodes:
        up = max((loose.get(s, 0.0) for s in node.src), default=0.0)
        loose[node] = max(up, LOOSER[node.op] if rounds(node) else 0.0)
    return {t.name: max(CHECK_TOLERANCE[t.dtype], loose.get(t, 0.0)) for t in graph.outputs}


def check_passed(graph: Graph, errors: dict[str, float]) -> bool:
    tolerance = check_tolerance(graph)
    return all(err <= tolerance[name] for name, err in errors.items())


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    write_atomic(path, lambda handle: np.savez(handle, **arrays))


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda handle: handle.write(text.encode()))
