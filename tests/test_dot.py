"""`ggmlrun dot`: Graphviz DOT of the schedule; clusters per split, copies as dashed edges."""

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from ggmlrun.core import engine
from ggmlrun.core.observe.dot import quote
from ggmlrun.core.frontend.loader import load_graph
from tests.clikit import invoke

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = sorted((ROOT / "graphs").glob("*.yaml"))

QUOTED = r'"((?:[^"\\]|\\.)*)"'
NODE = re.compile(rf"^\s*{QUOTED} \[(.*)\];$")
EDGE = re.compile(rf"^\s*{QUOTED} -> {QUOTED}(?: \[(.*)\])?;$")
CLUSTER = re.compile(r"^\s*subgraph (cluster_\w+) \{$")



def parse(text):
    """A strict reading of the subset of DOT `to_dot` writes: every line is a known statement."""
    nodes, edges, clusters = {}, [], {}
    current = None
    depth = 0
    lines = text.strip().splitlines()
    assert re.match(rf"^digraph {QUOTED} \{{$", lines[0]) and lines[-1] == "}"
    for line in lines[1:-1]:
        if m := CLUSTER.match(line):
            current = m.group(1)
            clusters[current] = {"nodes": [], "label": None}
            depth += 1
        elif line.strip() == "}":
            depth -= 1
            current = None
        elif m := EDGE.match(line):
            edges.append((m.group(1), m.group(2), m.group(3) or ""))
        elif m := NODE.match(line):
            assert m.group(1) not in nodes, f"node {m.group(1)} declared twice"
            nodes[m.group(1)] = m.group(2)
            if current:
                clusters[current]["nodes"].append(m.group(1))
        elif re.match(r"^\s*(graph|node|edge) \[.*\];$", line):
            if current and (lab := re.search(rf"label={QUOTED}", line)):
                clusters[current]["label"] = lab.group(1)
        else:
            raise AssertionError(f"unexpected DOT line: {line!r}")
    assert depth == 0
    return nodes, edges, clusters


def dot_of(graph, *extra):
    code, out, err = invoke("dot", graph, *extra)
    assert code == 0, err
    return out


def test_mlp_structure():
    nodes, edges, clusters = parse(dot_of(ROOT / "graphs/mlp.yaml"))
    assert clusters["cluster_0"]["label"] == "split 0: SIM0"
    assert clusters["cluster_1"]["label"] == "split 1: CPU"
    assert clusters["cluster_0"]["nodes"] == ["SIM0#x", "h", "a", "y0"]
    assert clusters["cluster_1"]["nodes"] == ["CPU#y0", "y"]
    copy_edges = [(a, b, attrs) for a, b, attrs in edges if "dashed" in attrs]
    assert copy_edges == [("x", "SIM0#x", 'style="dashed,bold", label="64.00 KiB", color="#555555"'),
                          ("y0", "CPU#y0", 'style="dashed,bold", label="64.00 KiB", color="#555555"')]
    # leafs shaped apart from ops, outputs double-bordered, colours by backend
    assert 'shape="cylinder"' in nodes["w1"] and 'shape="invhouse"' in nodes["x"]
    assert 'shape="box"' in nodes["h"] and 'peripheries="2"' in nodes["y"]
    colour = lambda n: re.search(r'fillcolor="(#\w+)"', nodes[n]).group(1)   # noqa: E731
    assert colour("h") == colour("w1") == colour("SIM0#x") != colour("y") == colour("x")


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda p: p.stem)
def test_every_graph_one_node_per_tensor_a_cluster_per_split_and_a_copy_edge_per_copy(graph):
    nodes, edges, clusters = parse(dot_of(graph))
    g = load_graph(graph)
    sched = engine.schedule(g, engine.resolve_backends(g, None))
    tensors = [t.name for t in g.leafs + g.nodes] + [c.name for s in sched.splits for c in s.copies]
    legend = {n for n in nodes if n.startswith("backend ")}
    assert sorted(set(nodes) - legend) == sorted(tensors)
    splits = {k: v for k, v in clusters.items() if re.fullmatch(r"cluster_\d+", k)}
    assert len(splits) == len(sched.splits)
    for k, split in enumerate(sched.splits):
        cluster = splits[f"cluster_{k}"]
        assert cluster["label"] == f"split {k}: {sched.backends[split.backend].name}"
        assert cluster["nodes"] == [c.name for c in split.copies] + [n.name for n in split.nodes]
    for a, b, _ in edges:
        assert a in nodes and b in nodes, (a, b)
    copy_edges = [(a, b, attrs) for a, b, attrs in edges if "dashed" in attrs]
    assert len(copy_edges) == sched.copy_count
    for a, b, attrs in copy_edges:
        assert b.endswith("#" + a) and re.search(r'label="\d+(\.\d+)? (B|KiB|MiB|GiB)"', attrs)
    # data edges: one per source a node reads
    assert len(edges) - len(copy_edges) == sum(len(sched.srcs_of[n]) for n in g.nodes)


def test_names_with_dots_and_dashes_are_quoted(tmp_path):
    (tmp_path / "g.yaml").write_text(
        "tensors:\n  in-put.0: {shape: [4, 8], role: input}\n  w.a-b: {shape: [8, 8]}\n"
        "nodes:\n  - {name: l0.out-1, op: mul_mat, src: [w.a-b, in-put.0]}\n"
        "  - {name: _r.2, op: relu, src: [l0.out-1]}\n")
    text = dot_of(tmp_path / "g.yaml")
    nodes, edges, _ = parse(text)
    assert {"in-put.0", "w.a-b", "l0.out-1", "_r.2"} <= set(nodes)
    assert ("l0.out-1", "_r.2", "") in edges
    assert quote('a"b\\c') == '"a\\"b\\\\c"'
    assert quote("two\nlines") == '"two\\nlines"'


def test_out_dot_file_and_svg_fallback_without_graphviz(tmp_path, monkeypatch):
    code, out, err = invoke("dot", ROOT / "graphs/mlp.yaml", "-o", tmp_path / "g.dot")
    assert code == 0 and out == "" and "wrote" in err
    assert (tmp_path / "g.dot").read_text().startswith('digraph "mlp" {')
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, out, err = invoke("dot", ROOT / "graphs/mlp.yaml", "-o", tmp_path / "h.svg")
    assert code == 0 and out == "" and "not on PATH" in err
    assert (tmp_path / "h.dot").exists() and not (tmp_path / "h.svg").exists()
    # the fallback it wrote is its own to replace; a DOT file of the user's is kept
    code, _, err = invoke("dot", ROOT / "graphs/mlp.yaml", "-o", tmp_path / "h.svg")
    assert code == 0 and "not on PATH" in err
    code, _, err = invoke("dot", ROOT / "graphs/mlp.yaml", "-o", tmp_path / "g.svg")
    assert code == 1 and "left as it is" in err
    assert (tmp_path / "g.dot").read_text().startswith('digraph "mlp" {')


def _fake_dot(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir()
    exe = bin_dir / "dot"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def test_svg_is_rendered_by_dot_on_path(tmp_path, monkeypatch):
    _fake_dot(tmp_path / "bin", '[ "$1" = "-Tsvg" ] || exit 3\nprintf "<svg>"; wc -l; printf "</svg>"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code, out, err = invoke("dot", ROOT / "graphs/mlp.yaml", "-o", tmp_path / "g.svg")
    assert code == 0 and out == "", err
    text = (tmp_path / "g.svg").read_text()
    assert text.startswith("<svg>") and text.endswith("</svg>") and int(text[5:-6]) > 10


def test_failing_graphviz_is_one_line_exit_1(tmp_path, monkeypatch):
    _fake_dot(tmp_path / "bin", 'echo "Error: syntax error in line 1" >&2\nexit 1\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code, _, err = invoke("dot", ROOT / "graphs/mlp.yaml", "-o", tmp_path / "g.svg")
    assert code == 1 and "syntax error" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "g.svg").exists()


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz not installed")
@pytest.mark.parametrize("graph", ["mlp.yaml", "llama_block.yaml", "kv_cache.yaml"])
def test_real_graphviz_accepts_the_output(graph):
    text = dot_of(ROOT / "graphs" / graph)
    proc = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Warning" not in proc.stderr and "<svg" in proc.stdout
