"""The third round of load speed-ups: `validate` answers without rich when nothing is drawn,
the ggmlrun process leaves without the interpreter's teardown (cli/main.py `_exit_now`), and a
command that computes nothing starts NumPy's BLAS with one thread, and `validate` and `plan`
run without the cyclic GC (ggmlrun/__init__.py).
What must not change: the answer line, the error line, the exit codes, and output that reaches
a pipe whole; a call of `main([...])` from a program (tests/clikit.py) still returns to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.clikit import invoke
from tests.test_load_fast import ROOT

GRAPH = ("name: g\ntensors:\n  x: {shape: [2, 3], init: randn}\n"
         "nodes:\n  - {name: y, op: relu, src: [x]}\n")


def _user_env() -> dict:
    """Buffered streams, as a user's shell gives them (this project's sandboxes unbuffer)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONUNBUFFERED")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _ggmlrun(*args) -> subprocess.CompletedProcess:
    """The command as a user runs it: its own process, stdout and stderr pipes."""
    return subprocess.run([sys.executable, "-m", "ggmlrun", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, env=_user_env())


def test_validate_answers_without_loading_rich(tmp_path):
    """Into a pipe, with no --progress, nothing is drawn: the answer line is click's echo."""
    path = tmp_path / "g.yaml"
    path.write_text(GRAPH)
    probe = ("import sys\nfrom ggmlrun.cli import main\n"
             f"try:\n    main(['validate', {str(path)!r}])\nexcept SystemExit:\n    pass\n"
             "print('rich loaded' if 'rich' in sys.modules else 'no rich', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.stdout == f"{path}: ok (1 tensors, 1 nodes, outputs: y)\n"
    assert done.stderr.strip() == "no rich"


def test_the_command_line_starts_without_a_thread_pool_or_hashlib():
    """The panel products' thread pool (concurrent.futures, logging) loads with the first
    split product, hashlib with the first generated data: neither with the command line."""
    probe = ("import sys, ggmlrun.cli; print(sorted(m for m in ('concurrent.futures', "
             "'logging', 'hashlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_process_answer_and_exit_codes_are_as_in_process(tmp_path):
    """The quick exit flushes first: a pipe gets every line, and the code is the command's."""
    good, bad = tmp_path / "g.yaml", tmp_path / "bad.yaml"
    good.write_text(GRAPH)
    bad.write_text(GRAPH.replace("op: relu", "op: relux"))
    for args in (["validate", good], ["validate", "--json", good], ["validate", bad],
                 ["validate", tmp_path / "missing.yaml"], ["plan", good], ["--version"],
                 ["validate"]):
        done = _ggmlrun(*args)
        code, out, err = invoke(*args)
        assert (done.returncode, done.stdout) == (code, out), args
        assert done.stderr.splitlines()[-1:] == err.splitlines()[-1:], args
    assert _ggmlrun("validate", bad).returncode == 2


def test_a_long_answer_reaches_a_pipe_whole(tmp_path):
    """An answer far over a pipe's buffer (64 KiB) still arrives whole before the exit."""
    nodes = "".join(f"  - {{name: y{i}, op: relu, src: [x]}}\n" for i in range(3000))
    path = tmp_path / "wide.yaml"
    path.write_text(GRAPH.split("nodes:")[0] + "nodes:\n" + nodes)
    done = _ggmlrun("plan", "--json", path)
    assert done.returncode == 0
    assert len(done.stdout) > 64 * 1024
    assert done.stdout.rstrip().endswith("}")


@pytest.mark.skipif(not hasattr(os, "pipe"), reason="needs a pipe")
def test_a_closed_pipe_takes_the_usual_exit(tmp_path):
    """A reader that went away: the flush fails and the process exits as Python always did,
    never hangs or claims success."""
    path = tmp_path / "g.yaml"
    path.write_text(GRAPH)
    proc = subprocess.Popen([sys.executable, "-m", "ggmlrun", "validate", "--json", str(path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_user_env())
    proc.stdout.close()
    proc.stderr.read()
    assert proc.wait(timeout=60) != 0


@pytest.mark.parametrize("argv, user_value, expected", [
    (["validate", "g.yaml"], None, "1"),       # computes nothing: one BLAS thread
    (["plan", "g.yaml"], None, "1"),
    (["validate", "g.yaml"], "3", "3"),        # the user's choice stays
    (["run", "g.yaml"], None, None),           # computes: BLAS as configured
    (["--version"], None, None),
])
def test_blas_starts_one_thread_for_commands_that_compute_nothing(tmp_path, argv, user_value,
                                                                  expected):
    """As the ggmlrun command (a script named `ggmlrun`, as the console script is), before
    NumPy loads; a program importing ggmlrun is never affected (tests import it all the time)."""
    script = tmp_path / "ggmlrun"
    script.write_text("import os, ggmlrun.cli, numpy\n"
                      "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    env = _user_env()
    env.pop("OPENBLAS_NUM_THREADS", None)
    if user_value is not None:
        env["OPENBLAS_NUM_THREADS"] = user_value
    done = subprocess.run([sys.executable, str(script), *argv], cwd=ROOT, capture_output=True,
                          text=True, env=env, check=True)
    assert done.stdout.strip() == str(expected)


def test_blas_pool_is_one_thread_under_validate(tmp_path):
    """The pool NumPy's BLAS actually started (threadpoolctl asks the library itself), where
    `validate` loads NumPy at all (a model does; a graph file does not: test_load_numpy.py)."""
    script = tmp_path / "ggmlrun"
    script.write_text("import ggmlrun.cli, numpy, threadpoolctl\n"
                      "print([i['num_threads'] for i in threadpoolctl.threadpool_info() "
                      "if i['user_api'] == 'blas'])\n")
    env = _user_env()
    env.pop("OPENBLAS_NUM_THREADS", None)
    done = subprocess.run([sys.executable, str(script), "validate", "g.yaml"], cwd=ROOT,
                          capture_output=True, text=True, env=env, check=True)
    assert set(json.loads(done.stdout)) == {1}


@pytest.mark.parametrize("argv, enabled", [
    (["validate", "g.yaml"], False),           # one graph, then the exit: no cyclic GC
    (["plan", "g.yaml"], False),
    (["measure", "g.yaml"], True),
    (["run", "g.yaml"], True),
    (["--version"], True),
])
def test_validate_and_plan_run_without_the_cyclic_gc(tmp_path, argv, enabled):
    """Only the ggmlrun command's own process, and only for validate and plan; a program that
    imports ggmlrun keeps its GC (the last case of the probe)."""
    script = tmp_path / "ggmlrun"
    script.write_text("import gc, ggmlrun.cli\nprint(gc.isenabled())\n")
    done = subprocess.run([sys.executable, str(script), *argv], cwd=ROOT, capture_output=True,
                          text=True, env=_user_env(), check=True)
    assert done.stdout.strip() == str(enabled)
    program = subprocess.run([sys.executable, "-c", "import gc, ggmlrun.cli; "
                              "print(gc.isenabled())", *argv], cwd=ROOT, capture_output=True,
                             text=True, env=_user_env(), check=True)
    assert program.stdout.strip() == "True"
