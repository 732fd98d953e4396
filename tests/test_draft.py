"""A draft model (-md) beside the target: its buffers per backend equal llama.cpp's, recorded
with both models in one process as llama-server loads them (scripts/llamacpp/record_draft.py
-> tests/data/llamacpp/draft.json); each backend's totals are both models'; fit leaves room
for it; `draft` in the JSON as SPEC section 5 names it; a draft llama.cpp would not speculate
with is refused."""

from __future__ import annotations

import json
import struct
from functools import lru_cache
from pathlib import Path

import pytest

from clikit import invoke
from ggufkit import kv_bytes, layout, patch, pstr, rebuild
from ggmlrun import api
from ggmlrun.core.util.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
DATA = json.loads((ROOT / "tests" / "data" / "llamacpp" / "draft.json").read_text())
MODELS = ROOT / "examples" / "models"
FIGURES = ("weights_bytes", "kv_bytes", "arena_bytes")
TARGET, DRAFT = MODELS / "tiny-llama-f16.gguf", MODELS / "tiny-llama-q8_0.gguf"
# the numbers depend on these: given, never ggmlrun's defaults
PLAIN = {"ctx": 256, "ubatch": 32, "flash_attn": False, "parallel": 1, "kv_unified": False}


@lru_cache(maxsize=None)
def _measure(cfg_id: str) -> dict:
    cfg = next(c for c in DATA["configs"] if c["id"] == cfg_id)
    o = cfg["options"]
    devices = max(1, len(o["tensor_split"]))
    return api.measure(MODELS / cfg["target"], backends=ROOT / DATA["backends_files"][str(devices)],
                       model_draft=str(MODELS / cfg["draft"]), ctx=o["ctx"],
                       ubatch=o["ubatch"], flash_attn=o["flash_attn"], ngl=o["ngl"],
                       ngl_draft=o["ngl_draft"], parallel=o["parallel"],
                       kv_unified=o["kv_unified"], tensor_split=o["tensor_split"] or None,
                       overrides=[tuple(r) for r in o["overrides"]], type_k=o["type_k"],
                       type_v=o["type_v"], type_k_draft=o["type_k_draft"],
                       type_v_draft=o["type_v_draft"], devices_draft=o["devices_draft"])


CONFIGS = [c["id"] for c in DATA["configs"]]


@pytest.mark.parametrize("cfg_id", CONFIGS)
def test_draft_buffers_equal_llama_cpp(cfg_id):
    """The draft's weights, KV and compute bytes on every backend, its nodes and splits and
    its context (the target's llama_n_ctx) are llama.cpp's; each backend's figures are the
    target's plus the draft's."""
    cfg = next(c for c in DATA["configs"] if c["id"] == cfg_id)
    got = _measure(cfg_id)
    draft = {b["name"]: b for b in got["draft"]["backends"]}
    want_d, want_t = cfg["draft_figures"], cfg["target_figures"]
    assert {n: {k: draft[n][k] for k in FIGURES} for n in want_d["backends"]} == \
        {n: {k: f[k] for k in FIGURES} for n, f in want_d["backends"].items()}
    assert (got["draft"]["n_nodes"], got["draft"]["n_splits"], got["draft"]["ctx"]) == \
        (want_d["n_nodes"], want_d["n_splits"], cfg["n_ctx_draft"])
    both = {b["name"]: {k: b[k] for k in FIGURES} for b in got["backends"]}
    none = dict.fromkeys(FIGURES, 0)           # -devd: no buffer on the other devices
    assert both == {n: {k: want_t["backends"][n][k] + want_d["backends"].get(n, none)[k]
                        for k in FIGURES} for n in want_t["backends"]}
    assert all(draft[n][k] == 0 for n in draft if n not in want_d["backends"] for k in FIGURES)


def test_draft_record_as_spec_names_it():
    """`draft`: name, backend (where most of it is), and that backend's bytes; the line to
    paste names the draft and its -ngld."""
    got = _measure(CONFIGS[0])
    draft = got["draft"]
    assert {"name", "backend", "weights_bytes", "kv_bytes", "arena_bytes"} <= set(draft)
    top = next(b for b in draft["backends"] if b["name"] == draft["backend"])
    assert (draft["name"], draft["backend"]) == ("tiny-llama-q8_0", "RPC0")
    assert all(draft[k] == top[k] for k in FIGURES)
    assert f"-md {MODELS / 'tiny-llama-q8_0.gguf'} -ngld all" in got["command"]
    on_cpu = _measure(next(c for c in CONFIGS if "ngl_draft=0" in c))["draft"]
    assert on_cpu["backend"] == "CPU"


def test_fit_leaves_room_for_the_draft():
    """On devices the target alone fills, fit with a draft puts fewer layers there and every
    backend still fits with both models; the JSON carries the draft; the draft's options
    come back in the line to paste."""
    args = ["fit", TARGET, "--gpu", "1MiB", "--ram", "4GiB", "--margin", "0", "--json",
            "--ctx", "256", "--ubatch", "32", "--flash-attn", "off", "--parallel", "1"]
    code, out, _ = invoke(*args)
    alone = json.loads(out)
    code_d, out_d, _ = invoke(*args, "-md", DRAFT, "-ngld", "3")
    both = json.loads(out_d)
    assert (code, code_d) == (0, 0)
    assert both["ngl"] < alone["ngl"]
    assert all(b["fits"] and b["total_bytes"] <= b["memory_bytes"] for b in both["backends"])
    assert both["draft"]["name"] == "tiny-llama-q8_0" and both["draft"]["backend"] == "GPU0"
    assert (both["draft"]["without"]["ngl"], both["draft"]["without"]["ctx"]) == \
        (alone["ngl"], alone["ctx"])
    assert f"-md {DRAFT} -ngld 3" in both["command"]


def _write(tmp_path, name: str, raw: bytes) -> Path:
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(raw)
    return path


def _with_kv(raw: bytes, key: str, value: bytes, gtype: int) -> bytes:
    return rebuild(rebuild(raw, drop_key=key), extra_kv=kv_bytes(key, gtype, value))


def incompatible(tmp_path) -> dict[str, Path]:
    """tiny-llama-q8_0 changed in one thing llama.cpp compares."""
    raw = DRAFT.read_bytes()
    lay = layout(raw)
    at_bos = lay.keys["tokenizer.ggml.bos_token_id"][1] + 4
    at_token = raw.index(pstr("<0x04>"))       # token 7: from id 5 on, the texts must match
    out = {"vocab type": _with_kv(raw, "tokenizer.ggml.model", pstr("bert"), 8),
           "BOS id": patch(raw, at_bos, "<I", 3),
           "add EOS": rebuild(raw, extra_kv=kv_bytes("tokenizer.ggml.add_eos_token", 7,
                                                     b"\x01")),
           "token text": patch(raw, at_token + 8, "6s", b"<0x44>")}
    paths = {k: _write(tmp_path, k.replace(" ", "_"), v) for k, v in out.items()}
    card = (tmp_path / "tiny.yaml")
    card.write_text("architecture: llama\nname: far\nhparams: {n_layer: 2, n_embd: 64, "
                    "n_head: 4, n_head_kv: 2, n_ff: 192, n_vocab: 600, n_ctx_train: 2048}\n"
                    "weights: f16\n")
    paths["vocab size"] = card
    return paths


def test_incompatible_drafts_refused(tmp_path):
    """Each difference common_speculative_are_compatible refuses is exit 2, one line naming
    the draft; a token below id 5 differing (llama.cpp starts comparing at 5) and a card whose
    vocabulary is at most 128 tokens off are taken."""
    said = set()
    for what, path in incompatible(tmp_path).items():
        code, out, err = invoke("measure", TARGET, "-md", path, "--gpu", "1GiB", "--ram",
                                "4GiB", "--ctx", "256", "--ubatch", "32", "--flash-attn", "off",
                                "--parallel", "1")
        assert code == 2, (what, err)
        assert len(err.strip().splitlines()) == 1 and "draft" in err, (what, err)
        said.add(err)
    assert len(said) == 5                       # each its own reason
    raw = DRAFT.read_bytes()
    low = _write(tmp_path, "low", patch(raw, raw.index(pstr("<0x00>")) + 8, "6s", b"<0x7F>"))
    near = tmp_path / "near.yaml"
    near.write_text("architecture: llama\nname: near\nhparams: {n_layer: 2, n_embd: 64, "
                    "n_head: 4, n_head_kv: 2, n_ff: 192, n_vocab: 448, n_ctx_train: 2048}\n"
                    "weights: f16\n")
    for path in (low, near):
        got = api.measure(TARGET, gpu="1GiB", ram="4GiB", model_draft=str(path), **PLAIN)
        assert got["draft"]["weights_bytes"] > 0


def test_draft_options_need_a_draft():
    with pytest.raises(InputError):
        api.measure(TARGET, gpu="1GiB", ram="4GiB", ngl_draft=2, **PLAIN)
    code, _, err = invoke("measure", TARGET, "-cd", "512", "--gpu", "1GiB")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_the_drafts_cache_types_are_refused_as_its_own():
    """-ctkd/-ctvd get llama.cpp's refusals of -ctk/-ctv, on the draft's head size, named as
    the draft's flags; the target's -ctk does not reach the draft."""
    code, _, err = invoke("measure", MODELS / "tiny-qwen3-f16.gguf", "-md", TARGET, "-ctkd",
                          "q8_0", "--flash-attn", "on", "--gpu", "1GiB", "--ram", "4GiB")
    assert code == 2 and "--cache-type-k-draft q8_0" in err and len(err.splitlines()) == 1
    got = api.measure(MODELS / "tiny-qwen3-f16.gguf", gpu="1GiB", ram="4GiB",
                      model_draft=str(TARGET), kv_type="q8_0", **{**PLAIN, "flash_attn": True})
    assert got["draft"]["kv_bytes"] > 0          # the 16-wide heads' f16 cache, taken


def test_ctx_draft_sets_the_drafts_context():
    """-cd: the draft's cache for that many cells (a what-if the vendored llama.cpp cannot
    ask for), the target's untouched."""
    base = api.measure(TARGET, gpu="1GiB", ram="4GiB", model_draft=str(DRAFT), **PLAIN)
    big = api.measure(TARGET, gpu="1GiB", ram="4GiB", model_draft=str(DRAFT), ctx_draft=1024,
                      **PLAIN)
    assert (base["draft"]["ctx"], big["draft"]["ctx"]) == (256, 1024)
    assert big["draft"]["kv_bytes"] == 4 * base["draft"]["kv_bytes"]
    assert big["ctx"] == base["ctx"] == 256


def test_a_remote_draft_is_the_local_one(tmp_path, monkeypatch):
    """-md takes MODEL in any form: a URL's headers (served on loopback) give the local
    file's draft figures."""
    from hubkit import Server

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    local = api.measure(TARGET, gpu="1GiB", ram="4GiB", model_draft=str(DRAFT), **PLAIN)
    with Server({"d.gguf": DRAFT.read_bytes()}) as server:
        remote = api.measure(TARGET, gpu="1GiB", ram="4GiB", model_draft=server.url("d.gguf"),
                             **PLAIN)
    assert {k: v for k, v in remote["draft"].items() if k != "name"} == \
        {k: v for k, v in local["draft"].items() if k != "name"}
    assert remote["backends"] == local["backends"]


@pytest.mark.parametrize("command", [("plan",), ("dot",), ("run", "--tokens", "1,2")],
                         ids=lambda c: c[0])
def test_commands_of_the_target_alone_refuse_a_draft(command):
    """plan, dot and run take the target's graph alone: -md there is refused, not ignored."""
    code, out, err = invoke(*command, TARGET, "-md", DRAFT)
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
