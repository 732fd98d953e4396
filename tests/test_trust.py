"""Issue 19, the core and the command line: one line and the right exit code for every case the
attack run found (a tag PyYAML cannot read, sizes past int64, a generator asked for 10^8 layers,
NumPy warnings, a full or closed stdout, SIGHUP/SIGQUIT mid-write, an output replaced as root)."""

import json
import os
import signal
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.cli.main import CLEANUP_SIGNALS
from tests.hang import no_hang

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "graphs" / "mlp.yaml"
GRAPH = """tensors:
  x: {shape: [4]}
nodes:
  - {name: y, op: relu, src: [x]}
"""


def one_line(code, err, want_code, *fragments):
    assert code == want_code, err
    assert "Traceback" not in err and "internal error" not in err and "Warning" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    for text in fragments:
        assert text in err, err


def ggmlrun(*args, timeout=120, **kwargs):
    if "stdout" not in kwargs:
        kwargs["capture_output"] = True
    return subprocess.run([sys.executable, "-m", "ggmlrun", *map(str, args)], cwd=ROOT,
                          text=True, timeout=timeout, **kwargs)


@pytest.mark.parametrize("text, line", [
    ("name: !!int 3#no\n" + GRAPH, 1),
    ("name: !!bool maybe\n" + GRAPH, 1),
    ("seed: !!timestamp 2020-13-45\n" + GRAPH, 1),
    (GRAPH.replace("[4]", "[!!float x4]"), 2),
])
def test_a_tag_pyyaml_cannot_read_is_exit_2_with_its_line(tmp_path, text, line):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    code, _, err = invoke("validate", path)
    one_line(code, err, 2, f"{path}:{line}: YAML error: cannot read")


def test_a_2_160_element_result_is_refused_at_load(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(GRAPH + "  - {name: z, op: repeat, src: [x], params: {shape: "
                    "[1099511627776, 1099511627776, 1099511627776, 1099511627776]}}\n")
    for command in ("validate", "measure", "plan", "run"):
        code, _, err = invoke(command, path)
        one_line(code, err, 2, f"{path}:5: node 'z': result shape", "1 EiB")


def test_results_that_together_pass_int64_do_not_fit_exit_1(tmp_path):
    """Each node under the 1 EiB bound, twelve of them past 2**63 together: the plan does not
    fit (exit 1), and no packer or picture overflows an int64 on the way."""
    lines = [GRAPH] + [f"  - {{name: r{i}, op: repeat, src: [x], params: {{shape: "
                       f"[268435456, 1073741824]}}}}\n" for i in range(12)]
    path = tmp_path / "g.yaml"
    path.write_text("".join(lines) + f"outputs: [{', '.join(f'r{i}' for i in range(12))}]\n")
    for args in (("measure",), ("measure", "--planner", "best"), ("plan",), ("run",)):
        proc = ggmlrun(*args, path, "--no-op-offload")
        one_line(proc.returncode, proc.stderr, 1, "needs 13835058055282163840 bytes")


def test_gen_refuses_a_huge_file_up_front():
    with no_hang("gen --layers 100000000"):
        code, out, err = invoke("gen", "mlp", "--layers", 100_000_000)
    one_line(code, err, 2, "--layers 100000000", "at most 200,000")
    assert out == ""
    code, _, err = invoke("gen", "llama", "--layers", 1_000_000)
    one_line(code, err, 2, "--layers 6250")
    code, _, err = invoke("gen", "mlp", "--dim", 2**20, "--hidden", 2**20)
    one_line(code, err, 2, "1 TiB")


def test_numpy_warnings_never_reach_stderr(monkeypatch):
    """A RuntimeWarning raised anywhere during a command (here: in the pipeline, as a NaN sum
    or an overflowing cast would) is silenced at the command line's edge."""
    import numpy as np

    from ggmlrun.core import engine

    real = engine.run_pipeline

    def overflowing(*args, **kwargs):
        np.float32(3e38) * np.float32(10)                   # RuntimeWarning: overflow
        np.array([np.inf, -np.inf], dtype=np.float32).sum()  # RuntimeWarning: invalid value
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "run_pipeline", overflowing)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code, _, err = invoke("run", MLP)
    assert code == 0 and "Warning" not in err, err
    assert [w for w in seen if issubclass(w.category, RuntimeWarning)] == []


def test_numpy_warnings_stay_off_stderr_in_a_fresh_process(tmp_path):
    """The occupancy picture of a 2**63-byte arena overflows an int64 subtraction (NumPy warns)."""
    lines = [GRAPH] + [f"  - {{name: r{i}, op: repeat, src: [x], params: {{shape: "
                       f"[268435456, 1073741824]}}}}\n" for i in range(12)]
    path = tmp_path / "g.yaml"
    path.write_text("".join(lines) + f"outputs: [{', '.join(f'r{i}' for i in range(12))}]\n")
    proc = ggmlrun("measure", path, "--planner", "ggml")
    assert "Warning" not in proc.stderr, proc.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [("validate", MLP), ("plan", MLP, "--json"), ("run", MLP),
                                  ("ops",), ("gen", "mlp")])
def test_a_full_stdout_is_one_line_exit_1(args):
    with open("/dev/full", "w") as full:
        proc = ggmlrun(*args, stdout=full, stderr=subprocess.PIPE)
    one_line(proc.returncode, proc.stderr, 1, "cannot write to standard output")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_json_error_into_a_full_stdout_is_still_one_line(tmp_path):
    """--json puts the error object on stdout too; when stdout is full, stderr still has the
    one line and the exit code is the error's."""
    path = tmp_path / "g.yaml"
    path.write_text("name: !!int 3#no\n" + GRAPH)
    with open("/dev/full", "w") as full:
        proc = ggmlrun("plan", path, "--json", stdout=full, stderr=subprocess.PIPE)
    one_line(proc.returncode, proc.stderr, 2, "cannot read '3#no' as !!int")


def test_a_closed_stdout_is_no_internal_error():
    proc = subprocess.Popen([sys.executable, "-m", "ggmlrun", "run", str(MLP)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "internal error" not in err and "Exception" not in err, err


@pytest.mark.parametrize("signame", [n for n in CLEANUP_SIGNALS if hasattr(signal, n)])
def test_ending_signals_leave_no_temporary_file(tmp_path, signame):
    """A write that never finishes, ended by a signal: the temp file beside it goes."""
    signum = getattr(signal, signame)
    script = tmp_path / "slow.py"
    script.write_text(
        "import sys, time\nsys.path.insert(0, %r)\n" % str(ROOT) +
        "from ggmlrun.cli.main import _install_signal_handlers\n"
        "from ggmlrun.core.util.atomic import write_atomic\n"
        "_install_signal_handlers()\n"
        "def slow(handle):\n    handle.write(b'x'); print('ready', flush=True); time.sleep(60)\n"
        f"write_atomic({str(tmp_path / 'out.txt')!r}, slow)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signum)
    assert proc.wait(timeout=20) == 128 + signum
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slow.py"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_an_output_replaced_as_root_keeps_owner_group_and_mode(tmp_path):
    out = tmp_path / "o.npz"
    out.write_bytes(b"old")
    os.chown(out, 12345, 23456)
    out.chmod(0o640)
    code, _, err = invoke("run", MLP, "--out", out)
    assert code == 0, err
    info = os.stat(out)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (12345, 23456, 0o640)
    assert out.read_bytes()[:2] == b"PK"
    fresh = tmp_path / "new.npz"                      # a new file stays root's
    assert invoke("run", MLP, "--out", fresh)[0] == 0 and os.stat(fresh).st_uid == 0
