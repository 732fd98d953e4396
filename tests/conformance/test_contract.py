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

from .contract_ggml import ggml_accepts

CASES = variants()


@pytest.fixture(scope="module")
def table():
    rows = []
    for case in CASES:
        accepted, _ = ours(case)
        rows.append((case, ggml_accepts(case), accepted, verdict(case)))
    return rows


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
