"""`run MODEL.gguf`: the weights mapped once from one descriptor and checked against the header;
a file cut short or rewritten before or while it is read is one line and exit 1 (never SIGBUS's
silent 135 or an internal error); memory is checked before anything is computed. The host's
memory and limits are injected, never read."""

from __future__ import annotations

import mmap
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from ggmlrun.core.util import ram
from ggmlrun.models import load
from ggmlrun.models.gguf import mapped
from ggmlrun.models import run as model_run
from tests.clikit import invoke
from tests.ggufkit import MODELS, ROOT

Q8 = next(m for m in MODELS if m.name == "tiny-llama-q8_0.gguf")
GiB = 1 << 30


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A copy of the q8_0 model, on a host with 8 GiB available and no address-space limit."""
    monkeypatch.setattr(ram, "available_bytes", lambda: 8 * GiB)
    monkeypatch.setattr(model_run, "address_space", lambda: None)
    path = tmp_path / "m.gguf"
    shutil.copyfile(Q8, path)
    return path


def after_header(monkeypatch, change):
    """Run `change(path)` right after the header is read."""
    real = load.read_gguf

    def read(path):
        found = real(path)
        change(path)
        return found

    monkeypatch.setattr(load, "read_gguf", read)


def failed(code, err, *words):
    assert code == 1, err
    lines = err.strip().splitlines()    # warnings (a context past training) may come first
    assert lines[-1].startswith("ggmlrun: error: "), err
    assert all(line.startswith("ggmlrun: warning: ") for line in lines[:-1]), err
    assert "internal error" not in err and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


def test_run_maps_the_file_once(model, monkeypatch):
    maps = []
    real = mmap.mmap

    def counted(*args, **kw):
        maps.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(mapped.mmap, "mmap", counted)
    code, out, err = invoke("run", model, "--tokens", "1,2,3", "--json")
    assert code == 0, err
    assert len(maps) == 1


@pytest.mark.parametrize("size", [0, 200_000, 264_895])
def test_file_truncated_between_load_and_run(model, monkeypatch, size):
    after_header(monkeypatch, lambda path: os.truncate(path, size))
    code, _, err = invoke("run", model, "--tokens", "1,2,3")
    failed(code, err, str(model), "changed since its header was read",
           f"truncated at byte {size} of 264896")


def test_file_rewritten_between_load_and_run(model, monkeypatch):
    def rewrite(path):
        stat = os.stat(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))

    after_header(monkeypatch, rewrite)
    code, _, err = invoke("run", model, "--tokens", "1,2,3")
    failed(code, err, "changed since its header was read", "modification time")


def test_file_replaced_between_load_and_run(model, monkeypatch, tmp_path):
    def replace(path):
        other = tmp_path / "other.gguf"
        shutil.copyfile(path, other)
        os.replace(other, path)

    after_header(monkeypatch, replace)
    code, _, err = invoke("run", model, "--tokens", "1,2,3")
    failed(code, err, "changed since its header was read", "inode")


def test_file_rewritten_while_it_is_read(model, monkeypatch):
    real = model_run.execute

    def touch_then_execute(*args, **kw):
        stat = os.stat(model)
        os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        return real(*args, **kw)

    monkeypatch.setattr(model_run, "execute", touch_then_execute)
    code, _, err = invoke("run", model, "--tokens", "1,2,3")
    failed(code, err, "changed while it was read")


def test_a_failed_map_is_cannot_map(model, monkeypatch):
    def refuse(*args, **kw):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mapped.mmap, "mmap", refuse)
    code, _, err = invoke("run", model, "--tokens", "1,2,3")
    failed(code, err, "cannot map the model file", "Cannot allocate memory")
    assert "not a readable GGUF" not in err


def test_sigbus_while_reading_is_one_line_and_exit_1(model):
    """The file cut to nothing after it was mapped, before the weights are read: the reads
    fault (SIGBUS), which killed the process with no message (exit 135)."""
    script = textwrap.dedent("""
        import os, sys
        from ggmlrun.models import run
        real, path = run.execute, sys.argv.pop(1)
        def cut_then_execute(*args, **kw):
            os.truncate(path, 0)
            return real(*args, **kw)
        run.execute = cut_then_execute
        from ggmlrun.cli import main
        main()
    """)
    done = subprocess.run([sys.executable, "-c", script, str(model), "run", str(model),
                           "--tokens", "1,2,3"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "the model file changed while it was read" in done.stderr
    assert str(model) in done.stderr and "Traceback" not in done.stderr


def test_memory_is_checked_before_computing(model, monkeypatch):
    """`run --ctx 20000` with 20,000 tokens computed for seconds up to 3.5 GB before "out of
    memory": now refused up front, naming what it needs (as one ubatch of 20,000: in ubatches of
    512 it would need far less)."""
    monkeypatch.setattr(ram, "available_bytes", lambda: 512 << 20)

    def never(*args, **kw):
        raise AssertionError("computed before the memory check")

    monkeypatch.setattr(model_run, "execute", never)
    monkeypatch.setattr(model_run, "weight_values", never)
    tokens = ",".join(["1"] * 20_000)
    code, _, err = invoke("run", model, "--ctx", "20000", "--ubatch", "20000", "--tokens", tokens)
    failed(code, err, "running this model", "needs", "512.00 MiB")


def test_address_space_limit_is_checked(model, monkeypatch):
    monkeypatch.setattr(model_run, "address_space", lambda: (300 << 20, 299 << 20))
    monkeypatch.setattr(model_run, "execute", lambda *a, **k: pytest.fail("computed"))
    code, _, err = invoke("run", model, "--tokens", "1,2,3")
    failed(code, err, "RLIMIT_AS", "ulimit -v")


def test_enough_memory_runs(model, monkeypatch):
    monkeypatch.setattr(ram, "available_bytes", lambda: 64 << 20)
    monkeypatch.setattr(model_run, "address_space", lambda: (16 * GiB, 1 * GiB))
    code, out, err = invoke("run", model, "--tokens", "1,2,3")
    assert code == 0, err


def test_zero_length_file(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    for command in (["validate"], ["run", "--tokens", "1"]):
        code, _, err = invoke(command[0], empty, *command[1:])
        assert code == 2 and "empty" in err and "internal error" not in err, err
