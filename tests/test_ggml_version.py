"""The ggml version switch (--ggml 0.15|0.25) and the new ops through the whole pipeline.

Each rule that differs between ggml 0.15.3 and 0.25.3 is shown on a graph where it decides
something: clamp in place, flash_attn_ext skipped by pass 1's weight rule, the 30-input limit.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from ggmlrun.core import engine
from ggmlrun.core.backends.spec import BackendSpec, default_cpu
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import make_node
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.ggml_version import DEFAULT_GGML, ggml_version
from clikit import invoke


def sim(name="SIM0"):
    return BackendSpec.of_kind(name, "sim")


def test_default_is_llama_cpps_ggml_and_names_are_checked():
    assert DEFAULT_GGML.release == "0.25.3"
    assert ggml_version("0.15.3").name == "0.15"
    with pytest.raises(InputError, match="unknown ggml version '0.2'"):
        ggml_version("0.2")


def test_clamp_runs_in_place_only_on_0_25():
    x = Tensor("x", (4, 8), role="input")
    a = make_node("a", "exp", [x])
    c = make_node("c", "clamp", [a], {"min": -1.0, "max": 1.0})
    c.is_output = True
    g = Graph("g", [x], [a, c], [c])
    for version, expect in (("0.25", [(c, a)]), ("0.15", [])):
        sched = engine.schedule(g, [default_cpu()], ggml=version)
        plan, _ = engine.plan_memory(sched, "ggml")
        assert [pair for pair in plan.inplace if pair[0] is c] == expect, version


def test_flash_attn_ext_skips_the_weight_rule_on_0_25():
    # k and v are weights on SIM0: 0.15.3 places the attention by them (1.wgt1),
    # 0.25.3 does not look at them and the node follows its neighbours instead
    q = Tensor("q", (1, 2, 3, 8), role="input")
    k = Tensor("k", (1, 2, 4, 8), dtype="f16", role="weight", backend="SIM0")
    v = Tensor("v", (1, 2, 4, 8), dtype="f16", role="weight", backend="SIM0")
    fa = make_node("fa", "flash_attn_ext", [q, k, v], {"scale": 0.3})
    fa.is_output = True
    g = Graph("g", [q, k, v], [fa], [fa])
    old = engine.schedule(g, [sim(), default_cpu()], ggml="0.15")
    new = engine.schedule(g, [sim(), default_cpu()], ggml="0.25")
    assert old.cause[fa] == "1.wgt1" and old.backend_of[fa] == 0
    assert not new.cause[fa].startswith("1.wgt")


def test_split_input_limit_only_on_0_15():
    # 31 CPU inputs consumed by one chain on SIM0: 0.15.3 cuts a split at 30 inputs
    xs = [Tensor(f"x{i}", (4,), role="input") for i in range(31)]
    w = Tensor("w", (4,), role="weight", backend="SIM0")
    nodes, cur = [], make_node("h0", "mul", [xs[0], w])
    nodes.append(cur)
    for i, x in enumerate(xs[1:], 1):
        cur = make_node(f"h{i}", "add", [cur, x])
        nodes.append(cur)
    cur.is_output = True
    g = Graph("g", xs + [w], nodes, [cur])
    old = engine.schedule(g, [sim(), default_cpu()], ggml="0.15")
    new = engine.schedule(g, [sim(), default_cpu()], ggml="0.25")
    assert max(len(s.inputs) for s in old.splits) == 30
    assert len(new.splits) == len(old.splits) - 1
    assert max(len(s.inputs) for s in new.splits) == 31


GRAPH = textwrap.dedent("""\
    name: llm_ops
    seed: 3
    tensors:
      x:      {shape: [4, 16], role: input}
      rows:   {shape: [4], dtype: i32, role: input, values: [2, 3, 4, 5]}
      mask:   {shape: [1, 1, 8, 8], dtype: f16, init: zeros}
      kcache: {shape: [1, 8, 2, 8], dtype: f16, init: zeros}
      wq:     {shape: [16, 16], init: randn, scale: 0.2}
      wk:     {shape: [16, 16], init: randn, scale: 0.2}
      wg:     {shape: [32, 16], init: randn, scale: 0.2}
    nodes:
      - {name: k,     op: mul_mat, src: [wk, x]}
      - {name: k3,    op: reshape, src: [k], params: {shape: [4, 16]}}
      - {name: kc2,   op: view, src: [kcache], params: {shape: [8, 16]}}
      - {name: store, op: set_rows, src: [kc2, k3, rows]}
      - {name: q,     op: mul_mat, src: [wq, x]}
      - {name: q4,    op: reshape, src: [q], params: {shape: [1, 4, 2, 8]}}
      - {name: qp,    op: permute, src: [q4], params: {axes: [0, 2, 1, 3]}}
      - {name: kv,    op: view, src: [kcache], params: {shape: [1, 8, 2, 8]}}
      - {name: kp,    op: permute, src: [kv], params: {axes: [0, 2, 1, 3]}}
      - {name: fa,    op: flash_attn_ext, src: [qp, kp, kp, mask], params: {scale: 0.35}}
      - {name: flat,  op: cont, src: [fa], params: {shape: [4, 16]}}
      - {name: gate,  op: mul_mat, src: [wg, flat]}
      - {name: out,   op: glu, src: [gate], params: {op: swiglu}}
    outputs: [out, store]
    """)


@pytest.mark.parametrize("version", ["0.25", "0.15"])
def test_kv_write_and_flash_attention_run_and_match_the_reference(tmp_path, version):
    path = tmp_path / "llm_ops.yaml"
    path.write_text(GRAPH)
    code, out, err = invoke("run", str(path), "--check", "--json", "--ggml", version)
    assert code == 0, err
    assert json.loads(out)


def test_unknown_ggml_version_is_a_usage_error(tmp_path):
    path = tmp_path / "llm_ops.yaml"
    path.write_text(GRAPH)
    code, _, err = invoke("measure", str(path), "--ggml", "0.3")
    assert code == 2 and "0.3" in err
