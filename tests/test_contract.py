"""The graph contract is ggml's: ggmlrun's shape rules against a plain statement of ggml's rules
(tests/ggml_rules.py, checked against real ggml by tests/conformance/test_contract.py), over
generated layouts (transposes, padded rows, strided rows) and types; and the regressions of
issue 34 one claim each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.ops import get_op, make_node
from ggmlrun.core.util.errors import InputError
from tests.contract_cases import LAYOUTS, base_cases, case_name, ours, variants
from tests.ggml_rules import verdict

ROOT = Path(__file__).resolve().parents[1]
BASES = base_cases()


@st.composite
def cases(draw):
    op, srcs, params = draw(st.sampled_from(BASES))
    new = []
    for dtype, shape, _ in srcs:
        layout = draw(st.sampled_from(LAYOUTS if len(shape) >= 2 else ("c",)))
        new.append((draw(st.sampled_from((dtype, "f32", "f16", "i32"))), shape, layout))
    if op == "cast":
        params = {"dtype": draw(st.sampled_from(("f32", "f16", "i32")))}
    return op, new, params


@given(cases())
def test_validate_says_what_ggml_says(case):
    accepted, message = ours(case)
    ok, kind, rule = verdict(case)
    assert accepted == ok, (case_name(case), message, kind, rule)


@given(cases())
def test_a_refusal_is_one_line_naming_the_node_and_a_refused_layout_says_insert_a_cont(case):
    accepted, message = ours(case)
    if accepted:
        return
    assert "\n" not in message and message.startswith("node 'y': ")
    op, srcs, params = case
    packed = (op, [(dtype, shape, "c") for dtype, shape, _ in srcs], params)
    if ours(packed)[0]:             # the same case contiguous is accepted: the layout decides
        assert "insert a cont" in message


def test_every_differential_case_agrees_with_the_rules():
    differ = [case_name(c) for c in variants() if ours(c)[0] != verdict(c)[0]]
    assert differ == []


# --- regressions (issue 34) ----------------------------------------------------------------

def leaf(name, shape, dtype="f32"):
    return Tensor(name=name, shape=tuple(shape), dtype=dtype, role="weight")


def test_mul_mat_of_a_transposed_a_is_refused_naming_node_source_and_rule():
    vt = make_node("vt", "transpose", [leaf("v", (8, 6))])
    with pytest.raises(InputError) as err:
        make_node("kq", "mul_mat", [vt, leaf("sm", (3, 8))])
    text = str(err.value)
    assert "node 'kq'" in text and "'vt'" in text and "insert a cont" in text


def test_a_view_is_bounded_by_its_element_count_as_ggml_bounds_it():
    a = leaf("a", (4,))
    with pytest.raises(InputError, match="stride-0"):       # a broadcast past the root
        make_node("v", "view", [a], {"shape": [8, 4], "strides": [0, 4]})
    make_node("v", "view", [a], {"shape": [1, 4], "strides": [0, 4]})   # inside: accepted
    x = leaf("x", (13,))        # overlapping windows whose elements fit the root: accepted
    make_node("w", "view", [x], {"shape": [4, 3], "strides": [8, 4], "offset": 4})
    with pytest.raises(InputError, match="end past"):
        make_node("w", "view", [x], {"shape": [4, 3], "strides": [8, 4], "offset": 8})


def test_reshape_of_a_view_whose_size_1_dim_has_any_stride_is_accepted():
    base = leaf("b", (6, 8))
    v = make_node("v", "view", [base], {"shape": [1, 8], "strides": [12, 4], "offset": 32})
    r = make_node("r", "reshape", [v], {"shape": [2, 4]})
    assert r.shape == (2, 4) and r.view_offset == 32


def test_get_rows_of_4_dims_picks_rows_per_batch():
    a = np.arange(2 * 3 * 5 * 4, dtype=np.float32).reshape(2, 3, 5, 4)
    b = np.array([[[4, 0], [1, 1], [2, 3]], [[0, 0], [4, 2], [3, 1]]], np.int32)
    node = make_node("g", "get_rows", [leaf("a", a.shape), leaf("b", b.shape, "i32")])
    out = np.empty(node.shape, np.float32)
    get_op("get_rows").kernel(out, a, b)
    want = np.stack([np.stack([a[i, j][b[i, j]] for j in range(3)]) for i in range(2)])
    assert node.shape == (2, 3, 2, 4) and np.array_equal(out, want)


def test_cast_from_i32_to_f32_converts_as_ggml_does():
    x = np.array([[-3, 0, 7, 2**24 + 1]], np.int32)
    node = make_node("c", "cast", [leaf("x", x.shape, "i32")], {"dtype": "f32"})
    out = np.empty(node.shape, np.float32)
    get_op("cast").kernel(out, x, dtype="f32")
    assert node.dtype == "f32" and out.tolist() == [[-3.0, 0.0, 7.0, float(2**24)]]


def test_glu_with_two_sources_refuses_swapped_which_ggml_would_ignore():
    a, b = leaf("a", (3, 8)), leaf("b", (3, 8))
    with pytest.raises(InputError, match="swapped"):
        make_node("y", "glu", [a, b], {"op": "swiglu", "swapped": True})
    assert make_node("y", "glu", [a], {"op": "swiglu", "swapped": True}).shape == (3, 4)


def test_rope_mode_24_is_named_as_the_mode_not_the_positions():
    with pytest.raises(InputError, match="mode .*24"):
        make_node("r", "rope", [leaf("x", (4, 2, 8)), leaf("p", (16,), "i32")],
                  {"n_dims": 8, "mode": 24})


def test_validate_of_a_graph_ggml_would_abort_on_exits_2_with_one_line(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("tensors:\n  v: {shape: [8, 6]}\n  sm: {shape: [3, 8]}\nnodes:\n"
                    "  - {name: vt, op: transpose, src: [v]}\n"
                    "  - {name: kq, op: mul_mat, src: [vt, sm]}\n")
    proc = subprocess.run([sys.executable, "-m", "ggmlrun", "validate", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "kq" in lines[0] and "insert a cont" in lines[0]


@pytest.mark.parametrize("op,srcs,bad", [
    ("get_rows", "t: {shape: [5, 8]}\n  i: {shape: [3], dtype: i32, values: [3, 0, 9]}", "9"),
    ("get_rows", "t: {shape: [5, 8]}\n  i: {shape: [3], dtype: i32, init: arange, start: -1}",
     "-1"),
    ("set_rows", "t: {shape: [5, 8]}\n  r: {shape: [2, 8]}\n  i: {shape: [2], dtype: i32, "
                 "init: randint, high: 6}", "5"),
    ("add_id", "a: {shape: [2, 3, 8]}\n  b: {shape: [4, 8]}\n  i: {shape: [2, 3], dtype: i32, "
               "init: full, value: 4}", "4"),
    ("mul_mat_id", "a: {shape: [4, 6, 8]}\n  b: {shape: [2, 1, 8]}\n  i: {shape: [2, 3], "
                   "dtype: i32, values: [[0, 1, 2], [3, 4, 0]]}", "4"),
])
def test_indices_the_file_gives_out_of_range_are_refused_at_load(tmp_path, op, srcs, bad):
    names = [line.split(":")[0].strip() for line in srcs.split("\n")]
    path = tmp_path / "i.yaml"
    path.write_text(f"tensors:\n  {srcs}\nnodes:\n  - {{name: y, op: {op}, src: {names}}}\n"
                    .replace("'", ""))
    proc = subprocess.run([sys.executable, "-m", "ggmlrun", "validate", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1
    assert "node 'y'" in lines[0] and f"index {bad}," in lines[0]


def case_yaml(case) -> str:
    """A graph file of a case: each source a leaf, through a transpose or a view for its
    layout, then the op; CPU only."""
    import json

    from tests.contract_cases import ITEM

    op, srcs, params = case
    tensors, nodes, names = [], [], []
    for i, (dtype, shape, layout) in enumerate(srcs):
        name = f"s{i}"
        if layout == "c":
            tensors.append(f"  {name}: {{shape: {list(shape)}, dtype: {dtype}}}")
        elif layout == "t":
            base = list(shape[:-2]) + [shape[-1], shape[-2]]
            tensors.append(f"  {name}_b: {{shape: {base}, dtype: {dtype}}}")
            nodes.append(f"  - {{name: {name}, op: transpose, src: [{name}_b]}}")
        else:
            wide = shape[-1] + 2 if layout == "pad" else 2 * shape[-1]
            base = list(shape[:-1]) + [wide]
            strides, step = [], ITEM[dtype]
            for d in reversed(base):
                strides.insert(0, step)
                step *= d
            strides[-1] = ITEM[dtype] if layout == "pad" else 2 * ITEM[dtype]
            tensors.append(f"  {name}_b: {{shape: {base}, dtype: {dtype}}}")
            nodes.append(f"  - {{name: {name}, op: view, src: [{name}_b], params: "
                         f"{{shape: {list(shape)}, strides: {strides}}}}}")
        names.append(name)
    nodes.append(f"  - {{name: y, op: {op}, src: [{', '.join(names)}], params: "
                 f"{json.dumps(params)}}}")
    return ("backends:\n  - {name: CPU, kind: cpu}\ntensors:\n" + "\n".join(tensors)
            + "\nnodes:\n" + "\n".join(nodes) + "\n")


@given(cases())
def test_fuzz_layouts_through_the_command_line_never_give_a_wrong_answer(tmp_path_factory, case):
    """A graph ggml would abort on is exit 2 at load; one it computes runs and agrees with the
    reference (`run --check`): never exit 1, never a traceback."""
    from clikit import invoke

    path = tmp_path_factory.mktemp("fuzz") / "g.yaml"
    path.write_text(case_yaml(case))
    code, _, err = invoke("run", path, "--check")
    assert code == (0 if verdict(case)[0] else 2), (case_name(case), err[-300:])
    assert "Traceback" not in err
