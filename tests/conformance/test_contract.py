"""The graph contract against real ggml: every case of tests/contract_cases.py (each op, each
source in every layout and type) is built and computed in real ggml 0.15.3 in a child process
and checked with ggmlrun's `validate` (the shape rules) and with tests/ggml_rules.py.

Claims, over every case:
- ggml aborts => ggmlrun refuses (no graph ggmlrun accepts crashes ggml), and ggml_rules.py
  names an assertion;
- ggml computes => ggmlrun accepts, unless ggml_rules.py names the case as one ggml's release
  build computes wrongly ("wrong") or one ggmlrun keeps refusing on purpose ("kept");
- ggmlrun's verdict is ggml_rules.py's on every case.
"""

from __future__ import annotations

import collections

import pytest

from tests.contract_cases import case_name, ours, variants
from tests.ggml_rules import verdict

from .contract_ggml import ggml_verdicts

CASES = variants()


@pytest.fixture(scope="module")
def table():
    return [(case, in_ggml, ours(case)[0], verdict(case))
            for case, in_ggml in zip(CASES, ggml_verdicts(CASES), strict=True)]


def test_nothing_ggmlrun_accepts_makes_ggml_abort(table):
    bad = [case_name(c) for c, g, o, _ in table if o and not g]
    assert bad == []


def test_every_abort_is_an_assertion_the_rules_name(table):
    unnamed = [case_name(c) for c, g, _, (ok, kind, _) in table if not g and kind != "assert"]
    assert unnamed == []


def test_what_ggml_computes_is_accepted_unless_wrong_or_kept(table):
    refused = [(case_name(c), kind) for c, g, o, (_, kind, _) in table
               if g and not o and kind not in ("wrong", "kept")]
    assert refused == []


def test_ggmlrun_and_the_rules_agree(table):
    differ = [case_name(c) for c, _, o, (ok, _, _) in table if o != ok]
    assert differ == []


def test_counts(table):
    """The differential's counts (printed with -s): every class is exercised."""
    counts = collections.Counter()
    for _, g, o, (_, kind, _) in table:
        counts["cases"] += 1
        counts["both refuse" if not g and not o else "both accept" if g and o
               else "accepted, ggml aborts" if o else f"refused, ggml computes ({kind})"] += 1
    print(dict(counts))
    assert counts["accepted, ggml aborts"] == 0
    assert counts["both refuse"] > 100 and counts["both accept"] > 100
    assert counts["refused, ggml computes (wrong)"] > 0


def _truth(case, arrays):
    """The op's answer, by ggmlrun's kernel on contiguous copies (the layout changes nothing
    of the meaning), or the reference formula for flash attention."""
    import numpy as np

    from ggmlrun.core.ir.graph import Tensor
    from ggmlrun.core.ir.ops import get_op, make_node
    from ggmlrun.core.run import reference_ops

    op, srcs, params = case
    if op == "flash_attn_ext":
        q, k, v, mask = arrays
        out = np.empty((q.shape[0], q.shape[2], q.shape[1], v.shape[-1]))
        reference_ops.flash_attn_ext(out, q.astype(np.float32), k, v, mask, scale=1.0,
                                     max_bias=0.0, logit_softcap=0.0, prec="f32")
        return out
    leafs = [Tensor(name=f"s{i}", shape=a.shape, dtype=d, role="weight")
             for i, ((d, _, _), a) in enumerate(zip(srcs, arrays))]
    node = make_node("y", op, leafs, dict(params))
    out = np.empty(node.shape, node.np_dtype)
    get_op(op).kernel(out, *arrays, **node.params)
    return out


def test_what_release_ggml_computes_wrongly_is_wrong():
    """Each case the rules call "wrong" (ggml computes it without complaint), computed in real
    ggml from random values: its answer differs from the op's."""
    import numpy as np

    from .contract_ggml import ggml_values

    rng = np.random.default_rng(34)
    wrong = [c for c in CASES if verdict(c)[1] == "wrong"]
    assert wrong
    for case in wrong:
        op, srcs, _ = case
        arrays = []
        for i, (dtype, shape, _) in enumerate(srcs):
            if dtype == "i32":
                rows = srcs[0][1][-2]
                arrays.append(rng.integers(0, rows, size=shape).astype(np.int32))
            else:
                arrays.append(rng.standard_normal(shape).astype({"f32": np.float32,
                                                                 "f16": np.float16}[dtype]))
        got = ggml_values(case, arrays)
        want = _truth((op, [(d, s, "c") for d, s, _ in srcs], case[2]), arrays)
        assert got.size == want.size, case_name(case)
        assert not np.allclose(got.astype(np.float64), want.astype(np.float64).ravel(),
                               rtol=1e-3, atol=1e-3), case_name(case)
