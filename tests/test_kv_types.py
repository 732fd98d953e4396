"""Issue 30 (3): every KV cache type llama.cpp takes, K and V apart (`-ctk T -ctv T`, SPEC
section 5), against llama.cpp's own figures: tests/data/llamacpp/kv_types.json, recorded by
scripts/llamacpp/record_kv_types.py with llama-cpp-python 0.3.36 (a CPU and one RPC device).

Claims: for every recorded pair of types (all nine with K = V, K and V apart, with and without
flash attention, on the CPU alone and offloaded; dense, rotated 64-wide heads, iSWA, MLA) the
KV bytes per backend, the compute bytes, the nodes and the splits are llama.cpp's; `run`'s
logits are within SPEC's tolerance once per distinct path through the cache (each type as K
and as V, rotated or not, K quantized without flash attention, iSWA, MLA); each pair llama.cpp
refuses is refused with its words, exit 2 and one line."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from clikit import invoke
from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.params import ModelOptions
from ggmlrun.models.reserve import measure_model
from ggmlrun.models.run import run_model

ROOT = Path(__file__).resolve().parent.parent
RECORDED = json.loads((ROOT / "tests/data/llamacpp/kv_types.json").read_text())
CONFIGS = {c["id"]: c for c in RECORDED["configs"]}
sys.path.insert(0, str(ROOT / "scripts" / "llamacpp"))
from make_tiny_gguf import TinyModel, write_model  # noqa: E402

# common/arg.cpp's kv_cache_types: each is recorded as K and as V
RECORDED_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# SPEC section 5: 2e-3 of the largest logit for float weights, 2e-2 for quantized ones
TOLERANCE = {"f16": 2e-3, "q8_0": 2e-2}
# one configuration per distinct path through the cache (ids of kv_types.json)
LOGITS = [f"tiny-llama-h64-q8_0/ctk-{t}/ctv-{t}/fa1/nglall"            # each type, K and V,
          for t in RECORDED_TYPES] + [                                                        # rotated where quantized
    "tiny-llama-h64-q8_0/ctk-q4_1/ctv-iq4_nl/fa1/nglall",     # K and V of two block types
    "tiny-llama-h64-q8_0/ctk-f16/ctv-q4_0/fa1/nglall",        # V alone quantized and rotated
    "tiny-llama-h64-q8_0/ctk-iq4_nl/ctv-f32/fa0/nglall",      # K quantized, no flash attention
    "tiny-qwen3-f16/ctk-q4_1/ctv-q4_1/fa1/nglall",            # heads of 32: no rotation
    "tiny-qwen3-f16/ctk-iq4_nl/ctv-iq4_nl/fa1/nglall",
    "tiny-qwen3-f16/ctk-q5_1/ctv-f16/fa0/nglall",
    "tiny-gemma3-q8_0/ctk-iq4_nl/ctv-q5_1/fa1/nglall",        # the iSWA pair of caches
    "tiny-gemma3-q8_0/ctk-q5_0/ctv-bf16/fa0/nglall",
    "tiny-deepseek2-f16/ctk-bf16/ctv-bf16/fa1/nglall",        # MLA's K-only cache
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The recorded models, the written ones written again (byte-identical: the sha256)."""
    out = {}
    for name, m in RECORDED["models"].items():
        path = (ROOT / m["file"] if "file" in m
                else write_model(TinyModel(**m["tiny"]), tmp_path_factory.mktemp("kv")))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == m["sha256"], name
        out[name] = (path, read_gguf(path))
    return out


@pytest.fixture(scope="module")
def backends():
    return load_backends(ROOT / RECORDED["backends_file"])


def _options(o: dict) -> ModelOptions:
    return ModelOptions(ctx=o["ctx"], ubatch=o["ubatch"], flash_attn=o["flash_attn"],
                        ngl=None if o["ngl"] == "all" else o["ngl"], type_k=o["type_k"],
                        type_v=o["type_v"], parallel=1)      # recorded with n_seq_max 1


def _model(models, cfg):
    return models[cfg["model"].removesuffix(".gguf")]


def test_bytes_nodes_and_splits_are_llama_cpp_s_for_every_pair(models, backends):
    checked = [c for c in CONFIGS.values() if not c.get("unchecked")]
    assert {c["options"]["type_k"] for c in checked} == set(RECORDED_TYPES)
    assert {c["options"]["type_v"] for c in checked} == set(RECORDED_TYPES)
    diffs = []
    for cfg in checked:
        got = measure_model(_model(models, cfg)[1], backends, _options(cfg["options"]))
        diffs += [f"{cfg['id']} {key}: ggmlrun {getattr(got, key)} llama.cpp {cfg[key]}"
                  for key in ("n_nodes", "n_splits") if getattr(got, key) != cfg[key]]
        by_name = {b.name: b for b in got.backends}
        diffs += [f"{cfg['id']} {name}.{key}: ggmlrun {getattr(by_name[name], key)} "
                  f"llama.cpp {value}"
                  for name, want in cfg["backends"].items() for key, value in want.items()
                  if getattr(by_name[name], key) != value]
    assert not diffs, "\n".join(diffs)


@pytest.mark.parametrize("cid", LOGITS)
def test_run_gives_llama_cpp_logits(models, backends, cid):
    cfg = CONFIGS[cid]
    path, model = _model(models, cfg)
    logits, _ = run_model(model, backends, _options(cfg["options"]), RECORDED["tokens"])
    want = np.asarray(cfg["logits"], dtype=np.float32)
    error = np.abs(logits[0] - want).max() / np.abs(want).max()
    weights = "f16" if cfg["model"].endswith("-f16.gguf") else "q8_0"
    assert error <= TOLERANCE[weights], error


REFUSED = RECORDED["refused"] + [
    {**c["options"], "model": c["model"].removesuffix(".gguf"), "llama_cpp": None}
    for c in CONFIGS.values() if c.get("unchecked")]


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: f"{c['model']}-{c['type_k']}-"
                         f"{c['type_v']}-fa{int(c['flash_attn'])}")
def test_what_llama_cpp_refuses_is_refused_in_its_words(models, backends, case):
    """llama.cpp's line inside ggmlrun's; the pair llama.cpp takes unchecked (a quantized K
    whose blocks its heads split, without flash attention) is refused here too."""
    model = models[case["model"]][1]
    opts = ModelOptions(ctx=256, ubatch=32, flash_attn=case["flash_attn"],
                        type_k=case["type_k"], type_v=case["type_v"], parallel=1)
    with pytest.raises(InputError) as err:
        measure_model(model, backends, opts)
    assert "\n" not in str(err.value)
    if case["llama_cpp"]:
        assert case["llama_cpp"] in str(err.value)


def test_the_command_line_refuses_with_exit_2_and_one_line(models):
    """-ctk/-ctv spelled as llama.cpp spells them, on `measure` and `run`."""
    path = models["tiny-deepseek2-f16"][0]
    for command, extra in (("measure", []), ("run", ["--tokens", "1,2"])):
        code, _, err = invoke(command, path, "-ctk", "bf16", "-ctv", "f16", *extra)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err


def test_kv_type_sets_both_and_the_line_writes_each(models, backends):
    """--kv-type T is -ctk T -ctv T; -ctk/-ctv given beside it win; the JSON options say each
    type, the line to paste each one away from llama.cpp's f16; the bytes are the recorded
    pair's."""
    path = models["tiny-qwen3-f16"][0]
    cfg = CONFIGS["tiny-qwen3-f16/ctk-q8_0/ctv-f16/fa1/nglall"]
    code, out, err = invoke("measure", path, "--json", "--backends",
                            ROOT / RECORDED["backends_file"], "--ctx", 256, "--ubatch", 32,
                            "--flash-attn", "on", "--kv-type", "q8_0", "-ctv", "f16")
    assert code == 0, err
    record = json.loads(out)
    assert (record["options"]["type_k"], record["options"]["type_v"]) == ("q8_0", "f16")
    assert record["options"]["kv_type"] is None
    assert "-ctk q8_0" in record["command"] and "-ctv" not in record["command"]  # f16: default
    kv = {b["name"]: b["kv_bytes"] for b in record["backends"]}
    assert kv == {name: b["kv_bytes"] for name, b in cfg["backends"].items()}
