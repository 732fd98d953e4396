"""Which ggml's scheduler and allocator rules to follow: 0.15.3 or 0.25.3 (the default).

llama.cpp (as vendored by llama-cpp-python 0.3.36) ships ggml 0.25.3; the conformance suite
runs the real ggml 0.15.3 (ggml-python 0.0.45). Their ggml-alloc.c and ggml-backend.cpp differ
in a few rules, and each difference is one field here, read where the rule is applied:

- `not_inplace`: ops the op registry marks in place that this ggml does not reuse a parent's
  memory for (0.15.3's ggml_op_can_inplace lacks CLAMP; the registry follows 0.25.3).
- `weight_rule_skips`: ops pass 1 does not place by a weight source (ROPE in both: its
  frequency-factor tensor is too small to choose a backend; 0.25.3 adds FLASH_ATTN_EXT, whose
  sinks tensor is as small).
- `max_split_inputs`: 0.15.3 starts a new split when one reaches 30 inputs
  (GGML_SCHED_MAX_SPLIT_INPUTS); 0.25.3 grows the input array instead (None: no limit).
- `leafs_first`: 0.25.3's ggml_gallocr_alloc_graph_impl allocates every leaf of the graph, in
  the graph's own leaf order (ggml_visit_parents' discovery order), before anything else;
  0.15.3 allocates the INPUT tensors as the nodes meet them (first use). For a graph built
  node by node in execution order the two orders are the same; for llama.cpp's graphs
  (expanded from a few roots, depth first) they are not.

Pipeline-parallel copies (n_copies > 1) are the scheduler's (`Scheduler(n_copies=...)`);
0.25.3 copies every INPUT leaf too (its pass 6), which is what models use. Backends adding
allocation dependencies in graph_optimize: none on CPU and RPC, ggml-cuda's fusions in the
`cuda` profile (core/sched/fusion_deps.py); the failed-reserve return changes nothing ggmlrun
models: see docs/format.md, "ggml versions".
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlrun.core.util.errors import InputError


@dataclass(frozen=True)
class GgmlVersion:
    name: str
    release: str
    not_inplace: frozenset[str]
    weight_rule_skips: frozenset[str]
    max_split_inputs: int | None
    leafs_first: bool = False
    # pipeline parallelism (n_copies > 1) copies every INPUT leaf too (0.25.3's pass 6), not
    # only the split inputs
    copies_graph_inputs: bool = False


GGML_VERSIONS = {
    "0.15": GgmlVersion("0.15", "0.15.3", not_inplace=frozenset({"clamp"}),
                        weight_rule_skips=frozenset({"rope"}), max_split_inputs=30),
    "0.25": GgmlVersion("0.25", "0.25.3", not_inplace=frozenset(),
                        weight_rule_skips=frozenset({"rope", "flash_attn_ext"}),
                        max_split_inputs=None, leafs_first=True, copies_graph_inputs=True),
}
DEFAULT_GGML = GGML_VERSIONS["0.25"]


def ggml_version(name: str | GgmlVersion | None) -> GgmlVersion:
    """The rules for a version name ("0.15", "0.25", or the full "0.25.3"); None: default."""
    if name is None:
        return DEFAULT_GGML
    if isinstance(name, GgmlVersion):
        return name
    for version in GGML_VERSIONS.values():
        if str(name) in (version.name, version.release):
            return version
    raise InputError(f"unknown ggml version '{name}'; known: {', '.join(GGML_VERSIONS)}")
