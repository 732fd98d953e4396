"""The fast YAML reader (yamlfast.py) must read every file exactly as the full parser does: the
same data, the same line for every key and item, and for a file it gives up on, nothing at all
(the full parser then reads it). Each test compares the two on the same text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import ggmlrun.core.frontend.yamlfile as yamlfile
from ggmlrun.core.frontend.gen import LlamaShape, llama
from ggmlrun.core.frontend.loader import load_graph
from ggmlrun.core.frontend.yamlfast import NotMine
from ggmlrun.core.util.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for d in ("graphs", "tests/bad_graphs", "tests/bad_backends", "tests/bad_plans",
                           "examples") for p in (ROOT / d).rglob("*.yaml"))


def _canonical(value):
    """Data as comparable text: types kept (1 vs 1.0 vs True), NaN equal to itself."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, dict):
        return ("dict", [(_canonical(k), _canonical(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_canonical(v) for v in value])
    return (type(value).__name__, repr(value))


def _read(path, fast: bool, monkeypatch):
    monkeypatch.setattr(yamlfile, "FAST", fast)
    try:
        data, doc = yamlfile.read_yaml(path)
    except InputError as err:
        return "error", str(err)
    return _canonical(data), sorted(doc.all_lines().items(), key=repr)


def _same_both_ways(path, monkeypatch):
    assert _read(path, True, monkeypatch) == _read(path, False, monkeypatch)


def _taken(text: str) -> bool:
    try:
        yamlfile._flow_reader().read(text)
    except NotMine:
        return False
    return True


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_file_reads_the_same(path, monkeypatch):
    _same_both_ways(path, monkeypatch)


@pytest.mark.parametrize("path", [p for p in FILES if "bad_" in str(p.parent)],
                         ids=lambda p: p.stem)
def test_every_bad_graph_gives_the_same_error(path, monkeypatch, tmp_path):
    outcomes = []
    for fast in (True, False):
        monkeypatch.setattr(yamlfile, "FAST", fast)
        try:
            graph = load_graph(path)
            outcomes.append(("ok", len(graph.nodes), [t.line for t in graph.leafs + graph.nodes]))
        except InputError as err:
            outcomes.append(("error", str(err)))
    assert outcomes[0] == outcomes[1]


def test_generated_graphs_take_the_fast_path(tmp_path, monkeypatch):
    text = llama(LlamaShape(layers=3, dim=32, heads=4, ffn=48, batch=4, context=8, offload=1))
    path = tmp_path / "g.yaml"
    path.write_text(text)
    assert _taken(text)
    _same_both_ways(path, monkeypatch)
    graphs = []
    for fast in (True, False):
        monkeypatch.setattr(yamlfile, "FAST", fast)
        graphs.append(load_graph(path))
    fast_graph, slow_graph = graphs
    assert [(t.name, t.shape, t.dtype, t.op, t.line, t.params, [s.name for s in t.src])
            for t in fast_graph.nodes] == \
           [(t.name, t.shape, t.dtype, t.op, t.line, t.params, [s.name for s in t.src])
            for t in slow_graph.nodes]
    assert [(t.name, t.line, t.data) for t in fast_graph.leafs] == \
           [(t.name, t.line, t.data) for t in slow_graph.leafs]


def test_shipped_graphs_take_the_fast_path():
    """Not only equal by falling back: the fast reader itself reads them."""
    for path in sorted((ROOT / "graphs").glob("*.yaml")):
        assert _taken(path.read_text()), path


@pytest.mark.parametrize("text", [
    "a: 1\na: 2\n",                                  # duplicate top-level key
    "t:\n  x: {a: 1}\n  x: {a: 2}\n",                # duplicate block key
    "n:\n  - {a: 1, a: 2}\n",                        # duplicate flow key
    "a: [b, c,]\n",                                  # trailing comma
    "a: {b, c}\n",                                   # keys without values
    "a: [b: c]\n",                                   # a single-pair mapping in a sequence
    "a: [b], [c]\n",                                 # two flows on one line
    "a: {b:c}\n",                                    # `b:c` is one scalar in YAML
    "a: 2001-01-01\n",                               # a timestamp
    "a: &x 1\nb: *x\n",                              # anchors and aliases
    "a: !!str 1\n",                                  # an explicit tag
    "a: 'q'\n",                                      # a quoted scalar
    "a: -\n",                                        # an indicator alone
    "a: ...\n",
    "a:\n  - [x,\n     y]\n",                        # a flow over two lines
    "a: b\n  c\n",                                   # a multi-line plain scalar
    "a:\n- x\n",                                     # a sequence at its key's indent
    "a:\n  b:\n    c: 1\n",                          # two block levels
    "1: x\n",                                        # a key that is not a string
    "a: {1: x}\n",
    "yes: x\n",
    "a: [" + ", ".join(["x"] * 400) + "]\n",          # a line past the simple-key limit
    "a: " + "[" * 70 + "]" * 70 + "\n",              # deep nesting
    "a:\tb\n",                                       # a tab
    "a: b\r\n",                                      # CR
    "\ufeffa: b\n",                                  # a BOM
    "# only a comment\n",
    "",
    "--- \na: 1\n",
    "- a\n- b\n",
])
def test_files_outside_the_subset_go_to_the_full_parser(text, tmp_path, monkeypatch):
    assert not _taken(text)
    path = tmp_path / "x.yaml"
    path.write_bytes(text.encode())
    _same_both_ways(path, monkeypatch)


# --- generated documents --------------------------------------------------------------------
SCALARS = ["x", "l0.q", "mul_mat", "yes", "No", "on", "OFF", "true", "False", "null", "Null",
           "~", "y", "n", "0", "-0", "12", "+12", "010", "0x1F", "0b11", "1_000", "1:30",
           "1.5", "-1.5", "1.", ".5", "1e-5", "50e12", "1.5e+3", "1E5", ".inf", "-.inf", ".NaN",
           "2001-12-14", "2001-12-14t21:59:43.10-05:00", "<<", "=", "-x", "+x", ".x", "a-b",
           "a+b", "_a", "Foo", "-", "--", "...", "'q'", '"d"', "a b", "a:b", "a#b", "&a", "*a",
           "!!int 3", "é"]
KEYS = ["name", "op", "src", "params", "x", "yes", "1", "on", "a.b", "-k", "null", "name"]
SPACES = st.sampled_from(["", " ", "  "])


@st.composite
def flows(draw, depth=0):
    if depth >= 3 or draw(st.integers(0, 2)) == 0:
        return draw(st.sampled_from(SCALARS))
    gap = draw(SPACES)
    if draw(st.booleans()):
        items = draw(st.lists(flows(depth + 1), max_size=3))
        return "[" + gap + f",{draw(SPACES)} ".join(items) + gap + "]"
    pairs = draw(st.lists(st.tuples(st.sampled_from(KEYS), flows(depth + 1)), max_size=3))
    return "{" + gap + ", ".join(f"{k}:{draw(SPACES)} {v}" for k, v in pairs) + gap + "}"


@st.composite
def documents(draw):
    lines = []
    for key in draw(st.lists(st.sampled_from(KEYS + ["tensors", "nodes"]), min_size=1,
                             max_size=4)):
        comment = draw(st.sampled_from(["", "  # c", " #x", "#no"]))
        kind = draw(st.integers(0, 3))
        if kind == 0:
            lines.append(f"{key}: {draw(flows())}{comment}")
        elif kind == 1:
            lines.append(f"{key}:{comment}")
        else:
            lines.append(f"{key}:{comment}")
            indent = " " * draw(st.integers(1, 4))
            for _ in range(draw(st.integers(0, 3))):
                if draw(st.sampled_from(["", "#"])):
                    lines.append(indent + "# a comment")
                head = "- " if kind == 2 else f"{draw(st.sampled_from(KEYS))}: "
                lines.append(indent + head + draw(flows()))
        if draw(st.integers(0, 5)) == 0:
            lines.append("")
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


@given(documents())
def test_generated_documents_read_the_same(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("doc") / "doc.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _same_both_ways(path, monkeypatch)


def test_generated_documents_mostly_take_the_fast_path():
    """The generator above must exercise the fast reader, not only the fallback."""
    plain = "name: g\nseed: 0\ntensors:\n  x: {shape: [2, 3], init: randn, scale: 0.5}\n" \
            "nodes:\n  - {name: y, op: relu, src: [x]}  # c\n  - {name: z, op: scale, " \
            "src: [y], params: {s: 1e-5}}\noutputs: [z]\n"
    assert _taken(plain)


def test_lines_answer_lookups_like_the_full_parser(tmp_path, monkeypatch):
    text = ("# head\nname: g\ntensors:\n  x: {shape: [2, 3]}\n\nnodes:\n"
            "  - {name: y, op: relu, src: [x]}\n  - {name: z, op: add, src: [y, x]}\n"
            "outputs: [z]\nempty:\n")
    path = tmp_path / "g.yaml"
    path.write_text(text)
    docs = {}
    for fast in (True, False):
        monkeypatch.setattr(yamlfile, "FAST", fast)
        docs[fast] = yamlfile.read_yaml(path)[1]
    probes = [(), ("name",), ("tensors", "x", "shape", 1), ("tensors", "x", "shape", 2),
              ("nodes", 1, "src", 1), ("nodes", 1, "src", True), ("nodes", 1, "src", 1.0),
              ("nodes", 2), ("nodes", 1, "op", 0), ("outputs", 0), ("empty",), ("empty", 0),
              ("nope",), ("tensors", "y")]
    for probe in probes:
        assert docs[True].lines.get(probe) == docs[False].lines.get(probe), probe
        assert (probe in docs[True].lines) == (probe in docs[False].lines), probe
        assert docs[True].line(probe) == docs[False].line(probe), probe
