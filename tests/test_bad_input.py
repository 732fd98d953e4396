"""Bad input end to end: every malformed file through the command line.

Each must exit 2 (1 for failures while running) with exactly one line on stderr naming the
culprit, no traceback, and no output file left behind, whole or half; stdout holds nothing, or
with --json exactly the error object (SPEC section 4).
"""

import json

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.frontend.loader import load_graph
from tests.test_loader import expectations, npy_fixtures
from tests.clikit import invoke

HERE = Path(__file__).parent
ROOT = HERE.parent
BAD_GRAPHS = sorted((HERE / "bad_graphs").glob("*.yaml"))
BAD_BACKENDS = sorted((HERE / "bad_backends").glob("*.yaml"))
BAD_PLANS = sorted((HERE / "bad_plans").glob("*.yaml"))



def assert_one_line_failure(code, out, err, expected_code, tmp_path, must_contain=()):
    assert code == expected_code, err
    if out:     # --json: exactly one object, the error, with the message stderr shows
        error = json.loads(out)["error"]
        assert error["exit"] == expected_code and f"ggmlrun: error: {error['message']}" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for text in must_contain:
        assert text in err, err
    leftovers = [p.name for p in tmp_path.iterdir() if p.suffix in (".npz", ".tmp")]
    assert leftovers == [], leftovers


def test_catalogue_holds_at_least_sixty_files():
    assert len(BAD_GRAPHS) + len(BAD_BACKENDS) + len(BAD_PLANS) >= 60


@pytest.mark.parametrize("path", BAD_GRAPHS, ids=lambda p: p.stem)
def test_bad_graph_through_run(path, tmp_path):
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    npy_fixtures(tmp_path)
    expect, _ = expectations(path)
    result = invoke("run", copy, "--json", "--out", tmp_path / "out.npz")
    assert_one_line_failure(*result, 2, tmp_path, (expect, path.name))


@pytest.mark.parametrize("path", BAD_BACKENDS, ids=lambda p: p.stem)
def test_bad_backends_through_run(path, tmp_path):
    expect, _ = expectations(path)
    result = invoke("run", ROOT / "graphs/mlp.yaml", "--backends", path, "--out", tmp_path / "o.npz")
    assert_one_line_failure(*result, 2, tmp_path, (expect, path.name))


@pytest.mark.parametrize("path", BAD_PLANS, ids=lambda p: p.stem)
@pytest.mark.parametrize("command", ["validate", "plan", "measure", "run"])
def test_bad_plans_fail_in_every_command_that_schedules(path, command, tmp_path):
    expect, line = expectations(path)
    code, out, err = invoke(command, path)
    assert_one_line_failure(code, out, err, 2, tmp_path, (expect, f"{path}:{line}: "))


def test_input_of_the_wrong_shape_dtype_or_pickled(tmp_path):
    np.save(tmp_path / "shape.npy", np.zeros((2, 2), dtype=np.float32))
    np.save(tmp_path / "dtype.npy", np.zeros((32, 512), dtype=np.float64))
    np.save(tmp_path / "obj.npy", np.array([None], dtype=object), allow_pickle=True)
    for name, text in (("shape.npy", "shape"), ("dtype.npy", "dtype"), ("obj.npy", "obj.npy")):
        result = invoke("run", ROOT / "graphs/mlp.yaml", "--input", f"x={tmp_path / name}",
                        "--out", tmp_path / "o.npz")
        assert_one_line_failure(*result, 2, tmp_path, (text,))
    result = invoke("run", ROOT / "graphs/mlp.yaml", "--input", "x")
    assert_one_line_failure(*result, 2, tmp_path, ("NAME=FILE",))


def test_running_failures_exit_1(tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text("backends:\n  - {name: SIM0, kind: sim, memory: 64KiB}\n  - {name: CPU, kind: cpu}\n")
    result = invoke("run", ROOT / "graphs/mlp.yaml", "--backends", small, "--out", tmp_path / "o.npz")
    assert_one_line_failure(*result, 1, tmp_path, ("SIM0", "65536", "largest tensors", "mlp.yaml"))
    rows = tmp_path / "rows.yaml"
    rows.write_text("tensors:\n  t: {shape: [4, 3]}\n  i: {shape: [2], dtype: i32, role: input}\n"
                    "nodes:\n  - {name: g, op: get_rows, src: [t, i]}\n")
    np.save(tmp_path / "i.npy", np.array([1, 9], np.int32))   # indices the file does not give
    result = invoke("run", rows, "--input", f"i={tmp_path / 'i.npy'}", "--out", tmp_path / "o.npz")
    assert_one_line_failure(*result, 1, tmp_path, ("while executing node 'g'",))


def test_unwritable_out_is_one_line(tmp_path):
    """Checked before any work, as bad input (docs/robustness.md)."""
    result = invoke("run", ROOT / "graphs/mlp.yaml", "--out", tmp_path / "no" / "such" / "dir.npz")
    code, out, err = result
    assert code == 2 and "--out" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# --- fuzz: whatever the file holds, the loader answers with an InputError or a graph ---------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=8), st.sampled_from(["f32", "f16", "i32", "randn", "input",
                                                         "x", "w", "mul_mat", "add", "SIM0"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(
        ["shape", "dtype", "role", "init", "values", "file", "name", "op", "src", "params",
         "backend", "scale", "high", "kind", "memory", "x", "w"]), inner, max_size=4)),
    max_leaves=12)
graphs = st.fixed_dictionaries({}, optional={
    "name": values, "seed": values, "backends": values, "outputs": values,
    "tensors": st.one_of(values, st.dictionaries(st.sampled_from(["x", "w", "b"]), values, max_size=3)),
    "nodes": st.one_of(values, st.lists(values, max_size=4)),
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(graphs)
def test_loader_fuzz_never_escapes_with_a_traceback(tmp_path, data):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    try:
        load_graph(path)
    except InputError as err:
        assert "\n" not in str(err)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10**6), st.binary(min_size=1, max_size=4))
def test_loader_fuzz_on_damaged_real_files(tmp_path, data_pos, junk):
    text = (ROOT / "graphs/kv_cache.yaml").read_bytes()
    pos = data_pos % len(text)
    path = tmp_path / "damaged.yaml"
    path.write_bytes(text[:pos] + junk + text[pos + len(junk):])
    try:
        load_graph(path)
    except InputError as err:
        assert "\n" not in str(err)
