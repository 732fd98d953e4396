"""Reruns real llama.cpp for two configurations and checks the committed figures still hold.

figures.json is only as good as the recording: this reruns scripts/llamacpp/record.py (an RPC
server, the shim, llama.cpp itself) for two configurations and compares bytes, counts, logits
and the graph dumps with what is committed. Slow, and needs llama-cpp-python 0.3.36 built with
-DGGML_RPC=ON and a C compiler; skipped with the reason when they are missing.
"""

import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.test_llamacpp_figures import CONFIGS, FIGURES, REPO

pytestmark = pytest.mark.slow

LIVE_IDS = ["tiny-llama-f16/c256/ub32/fa1/ngl2", "tiny-llama-q8_0/c1024/ub512/fa0/ngl0"]
COMMITTED_GRAPHS = REPO / "tests" / "data" / "llamacpp" / "graphs"


def _why_not_live() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama_cpp is not importable (pip install llama-cpp-python==0.3.36 with -DGGML_RPC=ON)"
    if shutil.which("cc") is None:
        return "no C compiler (cc) to build scripts/llamacpp/shim.c"
    lib = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
    if not (lib / "libggml-rpc.so.0").exists():
        return "llama_cpp was built without GGML_RPC (no libggml-rpc.so.0)"
    return None


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    reason = _why_not_live()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("live")
    for config_id in LIVE_IDS:
        subprocess.run([sys.executable, str(REPO / "scripts" / "llamacpp" / "record.py"),
                        "--only", config_id, "--out", str(out / "figures.json"),
                        "--graphs", str(out / "graphs"), "--committed-graphs", str(out / "committed")],
                       check=True, capture_output=True, timeout=600)
    return out


def _nodes(dump: dict, label: str) -> list[tuple]:
    graph = next(g for g in dump["graphs"] if g.get("label") == label)
    return [(n["name"], n["op"], tuple(n["shape"]), n["backend"], tuple(s or "" for s in n["src"]))
            for n in graph["nodes"]]


@pytest.mark.parametrize("config_id", LIVE_IDS)
def test_llamacpp_still_gives_the_committed_figures(live, config_id):
    recorded = next(c for c in CONFIGS if c["id"] == config_id)
    rerun = next(c for c in json.loads((live / "figures.json").read_text())["configs"]
                 if c["id"] == config_id)
    assert (rerun["n_nodes"], rerun["n_splits"]) == (recorded["n_nodes"], recorded["n_splits"])
    assert rerun["backends"] == recorded["backends"]
    want, got = np.asarray(recorded["logits"]), np.asarray(rerun["logits"])
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.parametrize("config_id", LIVE_IDS)
def test_llamacpp_still_builds_the_committed_graphs(live, config_id):
    stem = config_id.replace("/", "_")
    committed = json.loads(gzip.decompress((COMMITTED_GRAPHS / f"{stem}.json.gz").read_bytes()))
    rerun = json.loads(gzip.decompress((live / "committed" / f"{stem}.json.gz").read_bytes()))
    for label in ("pp", "tg"):
        assert _nodes(rerun, label) == _nodes(committed, label)
    assert FIGURES["ggml"] == "0.25.3"
