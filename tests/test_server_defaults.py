"""Issue 30 (1): ggmlrun's defaults are llama-server's (SPEC section 5): `--flash-attn auto`
resolved as llama_context::resolve_fused_ops resolves it, and `-np` auto (4 sequences, one
unified KV cache). Checked against tests/data/llamacpp/server_defaults.json, recorded by
scripts/llamacpp/record_server_defaults.py with llama-cpp-python 0.3.36 (the CPU alone and one
RPC device; dense, iSWA, MoE and hybrid models).

Claims: with no option given, every recorded configuration's bytes per backend, output
buffer, nodes and splits are llama.cpp's and so is the flash attention it resolved; `auto`
turns flash attention off exactly when a layer's device lacks it, and then plans the cache
llama.cpp made for it (V not transposed, read through v_cont); a quantized V makes auto on
with no probe; `--parallel N` keeps a stream per sequence unless `--kv-unified`; `--for cli`
is llama-cli's -np 1; the line to paste names -fa and -np only where they differ from the
target's defaults."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.command_line import llama_cpp_args
from ggmlrun.models.options.params import ModelOptions, kv_streams
from ggmlrun.models.reserve import measure_model

ROOT = Path(__file__).resolve().parent.parent
RECORDED = json.loads((ROOT / "tests/data/llamacpp/server_defaults.json").read_text())
CONFIGS = {c["id"]: c for c in RECORDED["configs"]}
MODELS = ROOT / "examples" / "models"


@pytest.fixture(scope="module")
def models():
    out = {}
    for name, m in RECORDED["models"].items():
        path = ROOT / m["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == m["sha256"], name
        out[name] = read_gguf(path)
    return out


@pytest.fixture(scope="module")
def backends():
    both = load_backends(ROOT / RECORDED["backends_file"])
    return {"rpc": both, "cpu": both[-1:]}


def _options(o: dict) -> ModelOptions:
    """The recorded options, llama-server's defaults left to ggmlrun's (ctx, ubatch, -fa, -np
    are not passed where they are the defaults)."""
    given = {}
    if o["flash_attn"] != "auto":
        given["flash_attn"] = o["flash_attn"]
    if (o["parallel"], o["kv_unified"]) != (4, True):
        given.update(parallel=o["parallel"], kv_unified=o["kv_unified"])
    if "type_v" in o:
        given["type_v"] = o["type_v"]
    return ModelOptions(ngl=None if o["ngl"] == "all" else o["ngl"],
                        no_kv_offload=o["no_kv_offload"], **given)


@pytest.mark.parametrize("cid", sorted(CONFIGS))
def test_figures_are_llamacpps(models, backends, cid):
    cfg = CONFIGS[cid]
    model = models[cfg["model"].removesuffix(".gguf")]
    opts = _options(cfg["options"])
    m = measure_model(model, backends[cfg["where"]], opts)
    assert (m.n_nodes, m.n_splits, m.ctx, m.ubatch) == (
        cfg["n_nodes"], cfg["n_splits"], cfg["options"]["ctx"], cfg["options"]["ubatch"])
    got = {f.name: {"weights_bytes": f.weights_bytes, "kv_bytes": f.kv_bytes + f.state_bytes,
                    "arena_bytes": f.arena_bytes} for f in m.backends}
    want = {name: {"weights_bytes": b["weights_bytes"],
                   "kv_bytes": b["kv_bytes"] + b.get("state_bytes", 0),
                   "arena_bytes": b["arena_bytes"]} for name, b in cfg["backends"].items()}
    assert got == want
    assert m.backends[-1].output_bytes == cfg["output_buffer_bytes"]
    resolved = cfg["flash_attn_resolved"]      # None: not auto (or auto enabled outright)
    assert m.flash_attn == (resolved if resolved is not None
                            else cfg["options"]["flash_attn"] is not False)


def test_defaults_are_llama_servers():
    opts = ModelOptions()
    assert (opts.flash_attn, opts.parallel) == (None, None)
    assert kv_streams(opts) == 1
    assert kv_streams(ModelOptions(parallel=4)) == 4                     # today's -np N
    assert kv_streams(ModelOptions(parallel=4, kv_unified=True)) == 1


def _no_fa(backend: BackendSpec, head_sizes=()) -> BackendSpec:
    return replace(backend, flash_attn_head_sizes=frozenset(head_sizes))


@pytest.mark.parametrize("name", ["tiny-llama-f16", "tiny-gemma3-q8_0", "tiny-qwen35-q8_0"])
def test_auto_is_off_where_a_layers_device_lacks_it(models, backends, name):
    """A device without flash attention for the model's heads: auto resolves off (the probe's
    node lands on the CPU, not the layer's device); the graph is off's plus one v_cont per
    attention layer (the cache was made for flash attention: V not transposed, stored by rows),
    its KV bytes off's. With every layer on the CPU auto stays on."""
    model = models[name]
    rpc, cpu = backends["rpc"]
    lacking = [_no_fa(rpc), cpu]
    auto = measure_model(model, lacking, ModelOptions())
    off = measure_model(model, lacking, ModelOptions(flash_attn=False))
    assert auto.flash_attn is False
    on = measure_model(model, lacking, ModelOptions(flash_attn=True))
    n_attn = sum(n.op == "flash_attn_ext" for n in on.schedule.graph.nodes)
    v_conts = [sum(n.name.startswith("v_cont-") for n in m.schedule.graph.nodes)
               for m in (auto, off)]
    assert v_conts == [n_attn, 0]
    assert [f.kv_bytes for f in auto.backends] == [f.kv_bytes for f in off.backends]
    assert measure_model(model, lacking, ModelOptions(ngl=0)).flash_attn is True
    assert measure_model(model, [rpc, cpu], ModelOptions()).flash_attn is True


def test_quantized_v_turns_auto_on_without_a_probe(models, backends):
    rpc, cpu = backends["rpc"]
    m = measure_model(models["tiny-qwen3-f16"], [_no_fa(rpc), cpu], ModelOptions(type_v="q8_0"))
    assert m.flash_attn is True            # llama.cpp: enabled outright; the node goes where it can


def test_paste_line_names_what_differs(backends):
    both = backends["rpc"]

    def args(**given):
        return llama_cpp_args(ModelOptions(**given), both, ngl=3, ctx=2048)

    assert "-fa" not in args() and "-np" not in args() and "-kvu" not in args()
    for fa, word in ((False, "off"), (True, "on")):
        line = args(flash_attn=fa)
        assert line[line.index("-fa") + 1] == word
    line = args(parallel=2)
    assert line[line.index("-np") + 1] == "2" and "-kvu" not in line
    line = args(parallel=4, kv_unified=True)           # auto's own pair: nothing to say
    assert "-np" not in line and "-kvu" not in line
    line = args(parallel=4, kv_unified=True, target="cli")    # llama-cli's default is -np 1
    assert line[line.index("-np") + 1] == "4" and "-kvu" in line
    assert "-np" not in args(target="cli") and "-np" not in args(parallel=1, target="cli")


def test_for_cli_is_one_sequence():
    model = MODELS / "tiny-llama-f16.gguf"
    for given, want, program in (
            ((), (4, True, True, "auto"), "llama-server"),
            (("--flash-attn", "auto"), (4, True, True, "auto"), "llama-server"),
            (("--for", "cli"), (1, False, True, "auto"), "llama-cli"),
            (("--parallel", "2", "--flash-attn", "off"), (2, False, False, "off"), "llama-server")):
        code, out, _ = invoke("measure", model, *given, "--json")
        record = json.loads(out)
        o = record["options"]
        assert code == 0
        assert (o["parallel"], o["kv_unified"], o["flash_attn"], o["flash_attn_mode"]) == want
        assert record["program"] == program
        code, out, _ = invoke("measure", model, *given)
        assert out.splitlines()[-1] == f"{program} -m {model} {record['command']}"
