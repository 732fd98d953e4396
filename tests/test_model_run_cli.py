"""`run MODEL` honours --repeat, --warmup, --threads, --trace and --profile as graph runs do,
refuses what does not apply, and names its top tokens and the ctx, -ngl and splits it used."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.models.gguf.vocab import token_texts

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples/models/tiny-llama-q8_0.gguf"


def _run(*args):
    code, out, err = invoke("run", TINY, "--tokens", "1,72,101", *args)
    assert code == 0, err
    return out, err


def test_repeat_warmup_threads():
    out, _ = _run("--repeat", "3", "--warmup", "2", "--threads", "1", "--json")
    data = json.loads(out)
    assert data["timings"]["repeat"] == 3 and len(data["timings"]["per_run"]["runs_s"]) == 3
    assert data["timings"]["warmup"] == 2 and data["timings"]["threads"] == 1
    out, _ = _run("--repeat", "3", "--warmup", "1")
    assert "3 timed runs after 1 warm-up" in out and "mean of 3 runs" in out


def test_trace_is_written(tmp_path):
    trace = tmp_path / "t.json"
    _, err = _run("--trace", trace, "--repeat", "2")
    assert f"wrote {trace}" in err
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


def test_profile_tables_and_json():
    """The table and the JSON list the ops that ran (which two are the slowest is the
    machine's: under load any op can be)."""
    out, _ = _run("--profile", "--top", "2")
    assert "profile: compute by op" in out
    out, _ = _run("--profile", "--json")
    ops = json.loads(out)["profile"]["ops"]
    assert "mul_mat" in {op["op"] for op in ops}


@pytest.mark.parametrize("args, flag", [
    (("--check",), "--check"), (("--input", "x=y.npy"), "--input"),
    (("--planner", "ggml"), "--planner"), (("--policy", "cost"), "--policy cost"),
    (("--remap", "SIM0=CPU"), "--remap"), (("--offload-min-batch", "4"), "--offload-min-batch")])
def test_refuses_what_does_not_apply(args, flag):
    code, out, err = invoke("run", TINY, "--tokens", "1,2", *args)
    assert code == 2 and out == ""
    assert err.startswith("ggmlrun: error: ") and err.count("\n") == 1 and flag in err


def test_top_tokens_ctx_ngl_splits():
    out, _ = _run("--json", "--ngl", "2")
    data = json.loads(out)
    top = data["top_tokens"]
    assert len(top) == 5 and [t["logit"] for t in top] == sorted(
        (t["logit"] for t in top), reverse=True)
    from gguf import GGUFReader

    field = GGUFReader(TINY).fields["tokenizer.ggml.tokens"]
    for t in top:
        assert t["text"] == bytes(field.parts[field.data[t["id"]]]).decode()
    assert (data["ctx"], data["ngl"], data["n_layer"]) == (2048, 2, 4)
    assert data["n_splits"] == len(data["splits"]) >= 2
    assert {s["backend"] for s in data["splits"]} == {"SIM0", "CPU"}
    out, _ = _run("--ngl", "2")
    assert "ran 3 tokens: ctx 2048, -ngl 2 of 5;" in out and "top 5 tokens" in out


def test_token_texts_bounded_by_the_file(tmp_path):
    """A file cut anywhere gives None for what it cannot reach, never an error."""
    data = TINY.read_bytes()
    assert token_texts(TINY, [1, 2])[1] == "<s>"
    for cut in (0, 3, 10, 40, 200, 1000, 3000):
        short = tmp_path / "short.gguf"
        short.write_bytes(data[:cut])
        assert set(token_texts(short, [1, 300])) == {1, 300}
    huge = bytearray(data)           # a token length claiming more than the file holds
    at = data.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8
    huge[at:at + 8] = struct.pack("<Q", 2**62)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(huge))
    assert token_texts(bad, [0, 5]) == {0: None, 5: None}
    assert token_texts(TINY, [10**9]) == {10**9: None}


def test_token_texts_of_a_large_vocabulary(tmp_path):
    """Chunked reads cross chunk edges: every asked id reads back, ids past the end are None."""
    import numpy as np
    from gguf import GGUFWriter

    tokens = [f"t{i}" + "é" * (i % 5) + "x" * (i % 300) for i in range(40000)]
    path = tmp_path / "vocab.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_token_list(tokens)
    writer.add_tensor("a", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ids = [0, 1, 4095, 20000, 39998, 39999, 40000]
    got = token_texts(path, ids)
    for i in ids[:-1]:
        want = tokens[i].encode()[:256].decode("utf-8", "replace")
        assert got[i] == want, i
    assert got[40000] is None
