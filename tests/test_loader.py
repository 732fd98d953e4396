"""The loader: every key of SPEC.md sections 1 and 3, and a catalogue of malformed files.

Each file under bad_graphs/ and bad_backends/ starts with `# expect: <substring>` (what the
error must say) and, where the culprit has one, `# line: <n>` (the YAML line it must name).
"""

from __future__ import annotations

import pickle
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.backends.spec import GiB, physical_memory
from ggmlrun.core.util.errors import InputError
from ggmlrun.core.frontend.backends_file import load_backends, parse_backends, parse_size
from ggmlrun.core.frontend.loader import load_graph

HERE = Path(__file__).parent
BAD_GRAPHS = sorted((HERE / "bad_graphs").glob("*.yaml"))
BAD_BACKENDS = sorted((HERE / "bad_backends").glob("*.yaml"))
ROOT = HERE.parent


def write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def npy_fixtures(folder: Path) -> None:
    """The .npy files the bad graphs refer to, made fresh (a pickle is never checked in)."""
    np.save(folder / "f32.npy", np.arange(12, dtype=np.float32).reshape(4, 3))
    np.save(folder / "f64.npy", np.arange(12, dtype=np.float64).reshape(4, 3))
    np.save(folder / "objects.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with open(folder / "pickle.npy", "wb") as fh:
        pickle.dump([1.0, 2.0], fh)
    whole = (folder / "f32.npy").read_bytes()
    (folder / "truncated.npy").write_bytes(whole[:-8])


def expectations(path: Path) -> tuple[str, int | None]:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# expect: "), f"{path.name}: first line must be '# expect: ...'"
    expect = lines[0][len("# expect: "):]
    line = None
    if len(lines) > 1 and lines[1].startswith("# line: "):
        line = int(lines[1][len("# line: "):])
    return expect, line


def assert_bad(path: Path, loader) -> InputError:
    expect, line = expectations(path)
    with pytest.raises(InputError) as info:
        loader(path)
    message = str(info.value)
    assert "\n" not in message, message
    assert str(path) in message, message
    assert expect in message, message
    if line is not None:
        assert message.startswith(f"{path}:{line}: "), message
    assert info.value.exit_code == 2
    return info.value


# --- the catalogue --------------------------------------------------------------------------
def test_catalogue_is_big_enough():
    assert len(BAD_GRAPHS) >= 35
    assert len(BAD_BACKENDS) >= 5


@pytest.mark.parametrize("path", BAD_GRAPHS, ids=lambda p: p.stem)
def test_bad_graph(path, tmp_path):
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    npy_fixtures(tmp_path)
    assert_bad(copy, load_graph)


@pytest.mark.parametrize("path", BAD_BACKENDS, ids=lambda p: p.stem)
def test_bad_backends(path):
    assert_bad(path, load_backends)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(InputError, match="no such file") as info:
        load_graph(path)
    assert str(path) in str(info.value)


def test_directory(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        load_graph(tmp_path)


def test_binary_file(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match="not UTF-8"):
        load_graph(path)


def test_file_as_given_in_messages(tmp_path, monkeypatch):
    write(tmp_path, "tensors: {x: {shape: [0]}}\nnodes: [{name: y, op: relu, src: [x]}]\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as info:
        load_graph("g.yaml")
    assert str(info.value).startswith("g.yaml:1: tensor 'x': ")


# --- happy paths ----------------------------------------------------------------------------
def test_spec_example_mlp():
    graph = load_graph(ROOT / "graphs" / "mlp.yaml")
    assert graph.name == "mlp" and graph.seed == 0 and graph.backends is None
    assert [t.name for t in graph.leafs] == ["x", "w1", "w2"]
    assert [t.name for t in graph.nodes] == ["h", "a", "y0", "y"]
    assert [t.name for t in graph.outputs] == ["y"] and graph.tensor("y").is_output
    assert graph.tensor("h").shape == (32, 2048)
    assert graph.tensor("y").shape == (32, 512)
    assert graph.tensor("y").backend == "CPU"
    assert graph.tensor("w1").backend == "SIM0" and graph.tensor("x").backend is None
    assert graph.tensor("w2").dtype == "f16"
    assert [t.name for t in graph.inputs] == ["x"]
    assert graph.tensor("x").data.init == "randn"
    assert graph.tensor("w1").data.keys == {"mean": 0.0, "scale": 0.02}
    assert graph.tensor("h").src == [graph.tensor("w1"), graph.tensor("x")]


def test_every_key(tmp_path):
    np.save(tmp_path / "emb.npy", np.ones((10, 4), np.float32))
    path = write(tmp_path, """
        name: every
        seed: 7
        backends:
          - {name: SIM0, kind: sim, memory: 8GiB, alignment: 256, flops: 50e12, mem_bw: 1e12,
             link_bw: 25e9, link_latency: 10e-6, unsupported: [argmax, get_rows],
             offload_min_batch: 8}
          - {name: CPU, kind: cpu, threads: 2, memory: 1073741824, alignment: 32}
        tensors:
          x:   {shape: [2, 4], role: input}
          w:   {shape: [4, 4], dtype: f16, init: randn, mean: 1, scale: 0.5, backend: SIM0}
          u:   {shape: [4], init: uniform, low: -1, high: 1}
          z:   {shape: [4], init: zeros}
          o:   {shape: [4], init: ones}
          f:   {shape: [4], init: full, value: 3}
          r:   {shape: [4], init: arange, start: 1, step: 2}
          pos: {shape: [2], dtype: i32, init: arange}
          ids: {shape: [3], dtype: i32, init: randint, low: 0, high: 10}
          tbl: {shape: [2, 3], values: [[1, 2, 3], [4, 5, 6.5]]}
          emb: {shape: [10, 4], file: emb.npy, role: weight}
        nodes:
          - {name: h, op: mul_mat, src: [w, x]}
          - {name: s, op: scale, src: [h], params: {s: 2.0}, backend: CPU}
          - {name: g, op: get_rows, src: [emb, ids]}
        outputs: [s, h, tbl]
        """)
    graph = load_graph(path)
    assert graph.name == "every" and graph.seed == 7
    assert graph.backends_line == 3
    sim, cpu = graph.backends
    assert (sim.name, sim.kind, sim.memory, sim.alignment) == ("SIM0", "sim", 8 * GiB, 256)
    assert (sim.flops, sim.mem_bw, sim.link_bw, sim.link_latency) == (50e12, 1e12, 25e9, 10e-6)
    assert sim.unsupported == {"argmax", "get_rows"} and sim.supports is None
    assert sim.offload_min_batch == 8 and sim.line == 4
    assert (cpu.kind, cpu.threads, cpu.memory, cpu.alignment) == ("cpu", 2, 2**30, 32)
    t = graph.tensor
    assert t("x").role == "input" and t("w").role == "weight"
    assert t("w").data.keys == {"mean": 1.0, "scale": 0.5}
    assert t("u").data.keys == {"low": -1.0, "high": 1.0}
    assert t("f").data.keys == {"value": 3.0}
    assert t("r").data.keys == {"start": 1.0, "step": 2.0}
    assert t("pos").data.init == "arange" and t("pos").data.keys == {"start": 0, "step": 1}
    assert t("ids").data.keys == {"low": 0, "high": 10}
    assert t("tbl").data.values == [[1, 2, 3], [4, 5, 6.5]]
    assert t("emb").data.file == tmp_path / "emb.npy"
    assert t("s").params == {"s": 2.0} and t("s").backend == "CPU"
    assert t("g").shape == (3, 4)
    assert [o.name for o in graph.outputs] == ["s", "h", "tbl"]
    assert all(o.is_output for o in graph.outputs) and not t("g").is_output
    assert t("x").line == 9 and t("h").line == 21


def test_defaults(tmp_path):
    path = write(tmp_path, """
        tensors:
          x: {shape: [3]}
          i: {shape: [3], dtype: i32}
        nodes:
          - {name: a, op: relu, src: [x]}
          - {name: b, op: neg, src: [a]}
        """, name="my-graph.yaml")
    graph = load_graph(path)
    assert graph.name == "my-graph" and graph.seed == 0 and graph.backends is None
    assert graph.backends_line is None
    x, i = graph.leafs
    assert (x.dtype, x.role, x.backend, x.data.init) == ("f32", "weight", None, "randn")
    assert x.data.keys == {"mean": 0.0, "scale": 1.0}
    assert (i.data.init, i.data.keys) == ("zeros", {})
    assert [o.name for o in graph.outputs] == ["b"]
    assert graph.tensor("b").is_output and not graph.tensor("a").is_output


def test_output_may_name_a_tensor(tmp_path):
    path = write(tmp_path, """
        tensors: {x: {shape: [3]}}
        nodes: [{name: a, op: relu, src: [x]}]
        outputs: [x]
        """)
    graph = load_graph(path)
    assert graph.outputs == [graph.tensor("x")] and graph.tensor("x").is_output


def test_yaml_floats_without_a_dot(tmp_path):
    """PyYAML reads 1e-5 as a string; the loader reads it as YAML 1.2 does."""
    path = write(tmp_path, """
        tensors: {x: {shape: [2, 3], scale: 2e-2, mean: 1E3}}
        nodes: [{name: a, op: norm, src: [x], params: {eps: 1e-5}}]
        """)
    graph = load_graph(path)
    assert graph.tensor("x").data.keys == {"mean": 1000.0, "scale": 0.02}
    assert graph.tensor("a").params["eps"] == 1e-5


def test_anchors_and_merge_keys(tmp_path):
    path = write(tmp_path, """
        tensors:
          a: &w {shape: [4, 4], scale: 0.1}
          b: {<<: *w, dtype: f16}
        nodes: [{name: y, op: add, src: [b, a]}]
        """)
    graph = load_graph(path)
    assert graph.tensor("b").dtype == "f16" and graph.tensor("b").shape == (4, 4)
    assert graph.tensor("b").data.keys["scale"] == 0.1


def test_src_may_repeat(tmp_path):
    path = write(tmp_path, """
        tensors: {x: {shape: [3]}}
        nodes: [{name: y, op: mul, src: [x, x]}]
        """)
    graph = load_graph(path)
    assert graph.tensor("y").src == [graph.tensor("x"), graph.tensor("x")]


def test_error_line_points_at_the_key(tmp_path):
    path = write(tmp_path, """
        tensors:
          x:
            shape: [4, 8]
            init: randint
            low: 0
            high: zero
        nodes: [{name: y, op: relu, src: [x]}]
        """)
    with pytest.raises(InputError) as info:
        load_graph(path)
    assert str(info.value).startswith(f"{path}:6: tensor 'x': 'high' must be an integer")


# --- backends files ---------------------------------------------------------------------
def test_load_backends_defaults(tmp_path):
    path = write(tmp_path, """
        backends:
          - {name: SIM0, kind: sim}
          - {name: SIM1, kind: sim, supports: [mul_mat, add], memory: 512MiB}
          - {name: CPU, kind: cpu}
        """, name="b.yaml")
    sim0, sim1, cpu = load_backends(path)
    assert (sim0.memory, sim0.alignment, sim0.offload_min_batch) == (16 * GiB, 128, 32)
    assert (sim0.flops, sim0.mem_bw, sim0.link_bw, sim0.link_latency) == (
        50e12, 1e12, 25e9, 10e-6)
    assert sim0.supports is None and sim0.unsupported == frozenset()
    assert sim1.supports == {"mul_mat", "add"} and sim1.memory == 512 * 2**20
    assert sim1.supports_op("add") and not sim1.supports_op("gelu")
    assert (cpu.memory, cpu.alignment, cpu.threads) == (physical_memory(), 64, None)
    assert [s.line for s in (sim0, sim1, cpu)] == [2, 3, 4]


def test_parse_backends_without_lines():
    specs = parse_backends([{"name": "CPU", "kind": "cpu"}], "inline")
    assert specs[0].kind == "cpu"
    with pytest.raises(InputError, match="^inline: backend 'S': the last backend"):
        parse_backends([{"name": "S", "kind": "sim"}], "inline")


def test_cost_model_accepts_quoted_numbers(tmp_path):
    path = write(tmp_path, """
        backends:
          - {name: S, kind: sim, flops: "50e12", link_latency: 0}
          - {name: CPU, kind: cpu}
        """)
    sim, _ = load_backends(path)
    assert sim.flops == 50e12 and sim.link_latency == 0.0


@pytest.mark.parametrize("text, size", [
    (4096, 4096), ("4096", 4096), ("64KiB", 64 * 1024), ("512MiB", 512 * 2**20),
    ("8GiB", 8 * 2**30), ("8 gib", 8 * 2**30), ("1.5GiB", 3 * 2**29), ("1TiB", 2**40),
    ("100B", 100), (1.6e10, 16_000_000_000),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["8GB", "lots", "", "-1", 0, -5, True, None, [8], "8 XiB"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_deep_nesting_is_an_input_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("tensors: " + "[" * 50000 + "]" * 50000 + "\n")
    with pytest.raises(InputError) as info:
        load_graph(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_nothing_in_a_file_is_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(HERE / "bad_graphs" / "python_tag.yaml", tmp_path / "g.yaml")
    with pytest.raises(InputError):
        load_graph("g.yaml")
    assert not (tmp_path / "pwned.txt").exists()


@pytest.mark.parametrize("path", sorted((ROOT / "graphs").glob("*.yaml")), ids=lambda p: p.stem)
def test_c_and_python_parsers_agree(path, monkeypatch):
    """libyaml's parser is used for speed; it must see what the pure-Python one sees."""
    import ggmlrun.core.frontend.yamlfile as yamlfile

    monkeypatch.setattr(yamlfile, "FAST", False)     # the line reader is compared in test_load_fast
    fast = yamlfile.read_yaml(path)
    monkeypatch.setattr(yamlfile, "PARSER", yamlfile._SafeLoader)
    slow = yamlfile.read_yaml(path)
    assert fast[0] == slow[0]
    assert fast[1].lines == slow[1].lines
