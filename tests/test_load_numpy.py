"""NumPy on first use (core/util/lazynumpy.py, docs/architecture.md): a graph load never
imports NumPy; once NumPy is imported, by anyone, every ggmlrun module holds the real objects;
and a command in a fresh process, where all of this happens for real, computes what it
computes in a test's process (where NumPy was imported first)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.clikit import invoke
from tests.test_load_fast import ROOT

MODELS = ROOT / "examples" / "models"


def _python(code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter, NumPy not imported, running `code`."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)


_STAND_INS = """
def stand_ins():
    from ggmlrun.core.util.lazynumpy import Later
    return sorted(f"{name}.{key}" for name, module in list(sys.modules.items())
                  if name.startswith("ggmlrun.")
                  for key, value in vars(module).items() if type(value) is Later)
"""


@pytest.mark.parametrize("command", ["validate", "plan"])
@pytest.mark.parametrize("graph", ["llama_block.yaml", "kv_cache.yaml", "pins.yaml"])
def test_a_graph_file_is_checked_without_numpy(command, graph):
    probe = ("import sys\nfrom ggmlrun.cli import main\n"
             f"try:\n    main([{command!r}, {str(ROOT / 'graphs' / graph)!r}])\n"
             "except SystemExit as done:\n    assert not done.code, done.code\n"
             "print('numpy' in sys.modules, file=sys.stderr)\n")
    assert _python(probe).stderr.splitlines()[-1] == "False"


def test_importing_numpy_puts_every_value_in_place():
    """Before: stand-ins (the test would prove nothing without them). After `import numpy`,
    from outside ggmlrun: no stand-in is left in any module, copies included."""
    done = _python("import json, sys\n" + _STAND_INS + """
import ggmlrun.cli
import ggmlrun.core.ir.ops      # the command line alone no longer loads the op registry
assert "numpy" not in sys.modules
before = stand_ins()
import numpy
from ggmlrun.core.util import lazynumpy
from ggmlrun.core.ir import blockdecode
from ggmlrun.core.ir.ops import common, elementwise, nn, panels, quant
assert lazynumpy.np is numpy and common.np is numpy and quant.np is numpy
assert common.F32 is nn.F32 is panels.F32 is blockdecode.F32 is numpy.float32
assert issubclass(quant.TypedArray, numpy.ndarray)
assert elementwise._UFUNC["exp"] is numpy.exp
assert lazynumpy._Watch not in sys.meta_path
print(json.dumps({"before": before, "after": stand_ins()}))
""")
    found = json.loads(done.stdout)
    assert "ggmlrun.core.ir.ops.nn.F32" in found["before"] and len(found["before"]) > 10
    assert found["after"] == []


def test_a_stand_in_used_without_an_array_loads_numpy():
    """alibi_slopes starts from `F32(2.0)`: the stand-in's call loads NumPy, then works."""
    from ggmlrun.core.ir.ops.nn import alibi_slopes

    done = _python("import sys\n" + _STAND_INS + """
from ggmlrun.core.ir.ops.nn import alibi_slopes
assert "numpy" not in sys.modules
slopes = alibi_slopes(6, 8.0)
print(slopes.dtype, slopes.tolist(), stand_ins())
""")
    expected = alibi_slopes(6, 8.0)
    assert done.stdout.strip() == f"{expected.dtype} {expected.tolist()} []"


@pytest.mark.parametrize("args", [
    ["graphs/llama_block.yaml", "--check"],
    ["graphs/kv_cache.yaml"],
    [MODELS / "tiny-llama-q8_0.gguf", "--tokens", "1,2,3"],
    [MODELS / "tiny-llama-f16.gguf", "--tokens", "5,6"],
], ids=["llama_block", "kv_cache", "q8_0", "f16"])
def test_run_in_a_fresh_process_computes_what_it_computes_in_process(tmp_path, args):
    fresh, here = tmp_path / "fresh.npz", tmp_path / "here.npz"
    done = subprocess.run([sys.executable, "-m", "ggmlrun", "run", *map(str, args), "--json",
                           "--out", str(fresh)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    code, out, err = invoke("run", *[ROOT / a if str(a).startswith("graphs") else a
                                     for a in args], "--json", "--out", here)
    assert code == 0, err
    with np.load(fresh) as a, np.load(here) as b:
        assert sorted(a.files) == sorted(b.files) and a.files
        for name in a.files:
            assert a[name].dtype == b[name].dtype
            assert np.array_equal(a[name], b[name], equal_nan=True), name
    if "--check" in args:
        assert json.loads(done.stdout)["check"] == json.loads(out)["check"]


@pytest.mark.parametrize("model", ["tiny-llama-q8_0.gguf", "tiny-qwen3-f16.gguf", "tiny-phi3-q8_0.gguf",
                                   "tiny-qwen35-q8_0.gguf"])
def test_a_model_header_is_checked_without_numpy_or_the_gguf_package(model):
    """`validate MODEL` reads the header with ggmlrun's own reader and takes gguf's tables
    from its constants module alone (core/ir/types.gguf_constants): neither NumPy nor the gguf
    package's start-up (its reader, writer and vocab code, ~0.15 s) is paid for a header."""
    probe = ("import sys\nfrom ggmlrun.cli import main\n"
             f"try:\n    main(['validate', {str(MODELS / model)!r}])\n"
             "except SystemExit as done:\n    assert not done.code, done.code\n"
             "print('numpy' in sys.modules, 'gguf' in sys.modules, file=sys.stderr)\n")
    assert _python(probe).stderr.split()[-2:] == ["False", "False"]
