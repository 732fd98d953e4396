"""llama.cpp's own node lists (dumped by the oracle's recorder from llama.cpp 0.3.36 with
GGML_RPC) against the graph ggmlrun builds and schedules: per reserve graph (pp, tg, pp again),
node for node, the name, op, shape, type, sources and backend, and the node and split counts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.sched.scheduler import Scheduler
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.params import ModelOptions, kv_size, ubatch_size
from ggmlrun.models.memory.placement import place
from ggmlrun.models.memory.caches import model_memory
from ggmlrun.models.reserve import model_graph, placed_tensors

ROOT = Path(__file__).parents[1]
DUMPS = sorted((ROOT / "tests" / "data" / "llamacpp" / "graphs").glob("*.json*"))
GiB = 1 << 30
GGML_OPS = {"SWIGLU": "glu", "GEGLU": "glu", "SWIGLU_OAI": "glu"}   # and CPY: ggml_cast (its own result a source) or ggml_cpy


def options(o: dict) -> ModelOptions:
    """A recorded config's options (the oracle's figures.json and dumps share the form)."""
    return ModelOptions(ctx=o["ctx"], ubatch=o["ubatch"], flash_attn=o["flash_attn"],
                        ngl=None if o["ngl"] in ("all", None, -1) else o["ngl"],
                        kv_type=o.get("kv_type", "f16"),
                        no_kv_offload=o.get("no_kv_offload", False),
                        overrides=tuple(tuple(x) for x in o.get("overrides", [])),
                        swa_full=o.get("swa_full", False),
                        cpu_moe=o.get("cpu_moe", False), n_cpu_moe=o.get("n_cpu_moe", 0),
                        parallel=o.get("parallel", 1), kv_unified=o.get("kv_unified", False))


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def _shape(shape) -> list[int]:
    """ggml's ne drops trailing ones where NumPy keeps leading ones: compare without them."""
    shape = list(shape)
    while len(shape) > 1 and shape[0] == 1:
        shape.pop(0)
    return shape


def _sources(node) -> list[str]:
    srcs = node.src if node.op != "set_rows" else node.src[1:] + node.src[:1]   # ggml's order
    return [s.name for s in srcs]


def test_the_graph_dumps_are_here():
    """A committed fixture gone missing is a failure, never an empty parametrization."""
    assert len(DUMPS) == 34      # 26, then qwen3vl, qwen3vlmoe, the two lfm2 files and the
    #                              four Mamba-2 hybrid files


@pytest.mark.parametrize("path", DUMPS, ids=[p.name.split(".")[0] for p in DUMPS])
def test_graph_equals_llama_cpps(path):
    dump = _load(path)
    o = dump["options"]
    model = read_gguf(ROOT / "examples" / "models" / (dump["id"].split("/")[0] + ".gguf"))
    opts = options(o)
    backends = [BackendSpec(name="RPC0", kind="sim", memory=64 * GiB, alignment=32,
                            offload_min_batch=1 << 40),
                BackendSpec(name="CPU", kind="cpu", memory=64 * GiB, alignment=32)]
    hp = model.hparams
    kv = kv_size(opts, hp.n_ctx_train)
    n_tokens = min(kv, ubatch_size(opts, hp.n_ctx_train))
    placement = place(hp, model.tensors, backends, opts)
    reserves = [g for g in dump["graphs"] if g.get("kind") == "reserve"]
    assert [g["label"] for g in reserves] == ["pp", "tg", "pp_again"]
    for g in reserves:
        tokens = 1 if g["label"] == "tg" else n_tokens
        mg = model_graph(model, model_memory(hp, opts), tokens, tokens)
        sched = Scheduler(backends, op_offload=opts.op_offload, ggml=opts.ggml).schedule(
            mg.graph, placed=placed_tensors(mg, placement, backends))
        assert (len(mg.graph.nodes), len(sched.splits)) == (g["n_nodes"], g["n_splits"])
        for ours, theirs in zip(mg.graph.nodes, g["nodes"]):
            mine = (ours.name, ours.op, _shape(ours.shape), ours.dtype, _sources(ours),
                    sched.backend_name(ours))
            # ggml_cast lists its own result as its destination source; ggmlrun's cast has none
            srcs = [s for s in theirs["src"] if theirs["op"] != "CPY" or s != theirs["name"]]
            op = GGML_OPS.get(theirs["op"], theirs["op"].lower())
            if op == "cpy" and theirs["name"] in theirs["src"]:
                op = "cast"
            want = (theirs["name"], op,
                    _shape(theirs["shape"]), theirs["type"], srcs, theirs["backend"])
            assert mine == want, f"{g['label']} node #{theirs['i']}"
