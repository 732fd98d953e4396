"""The second round of load speed-ups must change no result: the fast reader's runs of flow
lines (taken a run at a time) read exactly as line by line and as the full parser; the Tensor
layout cache gives what computing the layout gives; gguf's type table read alone is gguf's;
and `import ggmlrun.cli` (every command's start-up) loads no rich, no gguf package, no
allocator, executor or model code."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tests.test_load_fast import ROOT, _same_both_ways, _taken
from ggmlrun.core.ir import graph as ir_graph
from ggmlrun.core.ir.graph import Tensor, contiguous_strides
from ggmlrun.core.ir.types import TYPES

NODE = "{name: n%d, op: relu, src: [x]}"
TENSOR = "{shape: [2, 3], init: randn, scale: 0.5}"


def _doc(nodes: list[str], tensors: list[str] | None = None) -> str:
    tensors = tensors if tensors is not None else ["  x: " + TENSOR]
    return "name: g\ntensors:\n" + "\n".join(tensors) + "\nnodes:\n" + "\n".join(nodes) + "\n"


@pytest.mark.parametrize("nodes", [
    ["  - " + NODE % i for i in range(50)],                                 # one long run
    ["  - " + NODE % i for i in range(5)] + ["  # a comment"]
    + ["  - " + NODE % i for i in range(5, 9)],                             # split by a comment
    ["  - " + NODE % i for i in range(3)] + [""] + ["  - " + NODE % 3],     # by a blank line
    ["  - " + NODE % 0 + "  # c", "  - " + NODE % 1],                       # a comment after one
    ["  - " + NODE % 0 + "   ", "  - " + NODE % 1],                         # trailing spaces
    ["  -   " + NODE % 0, "  - " + NODE % 1],                               # a wider marker
    ["  - " + NODE % 0, "  - plain", "  - " + NODE % 1],                    # a plain item
    ["  - " + NODE % 0, "    - " + NODE % 1],                               # a deeper indent
    ["  - " + NODE % 0, "- " + NODE % 1],                                   # back to column 0
    ["  - " + NODE % 0, "  k: " + NODE % 1],                                # an entry among items
    ["  - {name: n0, op: relu, src: [" + ", ".join(["x"] * 330) + "]}",
     "  - " + NODE % 1],                                                    # a line over 1000
    ["  - {name: n0, op: relu, src: [x]", "  - " + NODE % 1],               # unbalanced
    ["  - {name: n0, op: relu, src: [x]}}", "  - " + NODE % 1],
    ["  - [[[[x]]]]" + "", "  - " + NODE % 1],
    ["  - " + "[" * 61 + "]" * 61, "  - " + NODE % 1],                      # nested too deep
    ["  - {name: n0, name: n1}", "  - " + NODE % 1],                        # a duplicate flow key
])
def test_item_runs_read_as_the_full_parser_reads(nodes, tmp_path, monkeypatch):
    path = tmp_path / "g.yaml"
    path.write_text(_doc(nodes))
    _same_both_ways(path, monkeypatch)


@pytest.mark.parametrize("tensors", [
    [f"  t{i}: " + TENSOR for i in range(40)],
    ["  x: " + TENSOR, "  x: " + TENSOR],                                   # a duplicate key
    ["  x: " + TENSOR, "  y: " + TENSOR, "  # c", "  x: " + TENSOR],       # across two runs
    ["  yes: " + TENSOR, "  x: " + TENSOR],                                 # a key read as bool
    ["  1: " + TENSOR, "  x: " + TENSOR],                                   # a key read as int
    ["  null: " + TENSOR, "  x: " + TENSOR],
    ["  norm: " + TENSOR, "  output: " + TENSOR, "  x: " + TENSOR],         # strings after all
    ["  x: " + TENSOR, "  y:  " + TENSOR],                                  # a wider gap
    ["  x: " + TENSOR, "  -y: " + TENSOR],
    ["  x: " + TENSOR, "  2001-01-01: " + TENSOR],                          # a timestamp key
])
def test_entry_runs_read_as_the_full_parser_reads(tensors, tmp_path, monkeypatch):
    path = tmp_path / "g.yaml"
    path.write_text(_doc(["  - {name: y, op: relu, src: [x]}"], tensors))
    _same_both_ways(path, monkeypatch)


def test_long_runs_take_the_fast_path():
    text = _doc(["  - " + NODE % i for i in range(200)],
                [f"  t{i}: " + TENSOR for i in range(200)] + ["  x: " + TENSOR])
    assert _taken(text)


NAMES = st.sampled_from(["x", "y", "n1", "norm", "yes", "on", "null", "1", "0x1", "a.b", "_k"])
FLOWS = st.sampled_from(["{a: 1}", "[x, y]", "{name: n, src: [x]}", "[]", "{}", "{a: yes}",
                         "[1, 2.5, -3]", "{a: [b, {c: d}]}", "[x", "{a: 1}}", "[a: b]"])


@given(st.lists(st.tuples(st.sampled_from(["item", "entry", "comment", "blank", "plain"]),
                          NAMES, FLOWS, st.sampled_from(["  ", "   "])), max_size=12))
def test_generated_blocks_read_the_same(tmp_path_factory, lines):
    body = []
    for kind, name, flow, indent in lines:
        body.append({"item": f"{indent}- {flow}", "entry": f"{indent}{name}: {flow}",
                     "comment": f"{indent}# c", "blank": "", "plain": f"{indent}- {name}"}[kind])
    path = tmp_path_factory.mktemp("doc") / "doc.yaml"
    path.write_text("name: g\nblock:\n" + "\n".join(body) + "\nend: 1\n")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _same_both_ways(path, monkeypatch)


# --- Tensor layouts --------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 3), [2, 3], (2.0, 3), (np.int64(2), np.int32(3)),
                                   (True, 3), (4,), (1, 1, 1, 1)])
@pytest.mark.parametrize("dtype", ["f32", "f16", "i32", "q4_0"])
def test_cached_layouts_are_the_computed_ones(shape, dtype):
    if dtype == "q4_0":
        shape = tuple(shape[:-1]) + (32,)
    gtype = TYPES[dtype]
    ints = tuple(int(d) for d in shape)
    for _ in range(2):                       # the first builds the entry, the second reads it
        t = Tensor(name="t", shape=shape, dtype=dtype)
        assert t.shape == ints and all(type(d) is int for d in t.shape)
        assert t.strides == contiguous_strides(ints, gtype.type_size, gtype.block_size)
        assert t.is_contiguous


def test_layout_errors_are_the_conversions_errors():
    with pytest.raises(TypeError, match="int"):
        Tensor(name="t", shape=([2], 3))
    with pytest.raises(ValueError):
        Tensor(name="t", shape=("x", 3))
    with pytest.raises(KeyError):
        Tensor(name="t", shape=(2, 3), dtype="nope")
    assert Tensor(name="t", shape=(2, 3), dtype="nope", strides=(12, 4)).strides == (12, 4)


def test_the_layout_cache_stays_bounded():
    for n in range(ir_graph.MAX_LAYOUTS + 10):
        Tensor(name="t", shape=(n + 1, 7))
    assert len(ir_graph._LAYOUTS) <= ir_graph.MAX_LAYOUTS


# --- start-up ----------------------------------------------------------------------------------
def test_gguf_type_table_is_ggufs():
    from gguf.constants import GGML_QUANT_SIZES

    assert {t.id: (t.block_size, t.type_size) for t in TYPES.values()} == \
           {int(k): v for k, v in GGML_QUANT_SIZES.items()}


def test_the_command_line_starts_without_what_validate_never_uses():
    """rich, the gguf package, the allocator, the executor and the model code load when a
    command uses them; a graph file's validate needs none of them to load and check."""
    probe = ("import sys, ggmlrun.cli; "
             "print(sorted(m for m in ('rich', 'gguf', 'ggmlrun.core.memory.alloc', "
             "'ggmlrun.core.run.exec', 'ggmlrun.models.reserve', 'ggmlrun.models.fit') "
             "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]"
