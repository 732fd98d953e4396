"""Models by name (issue 29): split GGUF sets, http(s) URLs and hf:// names, read header-only.

Every remote test runs against a real HTTP server on 127.0.0.1 started here (tests/hubkit.py):
one that honours Range, one that ignores it, and a stand-in for the Hub's resolve and tree API
at HF_ENDPOINT. Figures from a split set, a URL and an hf:// name are compared with the whole
local file's, key for key."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
from clikit import invoke
from ggufkit import MODELS, STRING, kv_bytes, pstr, rebuild
from hubkit import Server, split_gguf, write_split

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.cache import HeaderCache
from ggmlrun.models.gguf.header import read_header
from ggmlrun.models.gguf.remote import AHEAD, FIRST, HttpFile
from ggmlrun.models.gguf.stats import Stats
from ggmlrun.models.gguf.source import read_headers

BY_STEM = {m.stem: m for m in MODELS}
# one file per architecture (its tensor set is what splitting and carding touch; the weight
# type only changes the bytes, which the type table already sizes): the f16 ones, and MXFP4
PER_ARCH = [m for m in MODELS if m.stem.endswith(("-f16", "-mxfp4"))]
TIMING = ("seconds", "phases", "timings")


@pytest.fixture(autouse=True)
def hub_env(tmp_path, monkeypatch):
    """The header cache and the Hugging Face home in tmp_path; no token, online."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


def figures(*args) -> dict:
    code, out, err = invoke(*args, "--json")
    assert code in (0, 1), err
    data = json.loads(out)
    for key in TIMING:
        data.pop(key, None)
    return data


def one_line_error(args, code=2) -> str:
    got, _, err = invoke(*args)
    assert got == code, err
    lines = [line for line in err.splitlines() if line.startswith("ggmlrun: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def n_shards(model) -> int:
    return min(3, len(read_header(model).tensors))


# --- local split sets --------------------------------------------------------------------------
@pytest.mark.parametrize("model", PER_ARCH, ids=lambda m: m.stem)
def test_a_local_split_set_measures_as_the_whole_file(model, tmp_path):
    shards = write_split(model, tmp_path, n_shards(model))
    gpu = ("--gpu", "16GiB")     # every weight there (the CPU maps each shard apart: below)
    whole = figures("measure", model, *gpu)
    assert figures("measure", shards[0], *gpu) == whole
    assert figures("measure", shards[-1], *gpu) == whole          # any shard names the set


def boundary_padding(model, n: int) -> int:
    """The whole file's padding after the last tensor of each shard but the last."""
    tensors = read_header(model).tensors
    per = -(-len(tensors) // n)
    return sum(tensors[i].offset - (tensors[i - 1].offset + tensors[i - 1].nbytes)
               for i in range(per, len(tensors), per))


def without_host_free(growth: dict) -> dict:
    """llama-server's host growth but what depends on the host's free bytes after start."""
    return {k: v for k, v in growth.items() if k not in ("host_free_bytes", "fits")}


def assert_same_but_shard_mapping(split: dict, whole: dict) -> None:
    """Equal, but for the CPU's mapped range: llama.cpp maps each shard apart, so where the
    CPU's tensors span a shard boundary what lies between (the padding, tensors on a device or
    repacked) is not mapped (test_the_cpu_maps_each_shard_apart: exactly how much)."""
    cpu_s, cpu_w = split["backends"][-1], whole["backends"][-1]
    less = cpu_w["mapped_bytes"] - cpu_s["mapped_bytes"]
    assert 0 <= less < cpu_w["mapped_bytes"]
    for key, sign in (("mapped_bytes", 1), ("weights_bytes", 1), ("total_bytes", 1),
                      ("free_bytes", -1)):
        assert cpu_s[key] == cpu_w[key] - sign * less
    grow_s, grow_w = split.pop("host_growth", None), whole.pop("host_growth", None)
    if grow_w is not None:      # llama-server's growth is told against the host's free bytes
        assert grow_s["host_free_bytes"] == grow_w["host_free_bytes"] + less
        assert without_host_free(grow_s) == without_host_free(grow_w)
    same = lambda d: {**d, "backends": d["backends"][:-1]}
    assert same(split) == same(whole)
    assert {k: v for k, v in cpu_s.items() if k not in ("mapped_bytes", "weights_bytes",
            "total_bytes", "free_bytes")} == {k: v for k, v in cpu_w.items() if k not in (
            "mapped_bytes", "weights_bytes", "total_bytes", "free_bytes")}


@pytest.mark.parametrize("stem", ["tiny-llama-f16", "tiny-qwen3moe-q8_0", "tiny-gemma3-f16",
                                  "tiny-qwen35-q8_0"])
def test_a_local_split_set_fits_as_the_whole_file(stem, tmp_path):
    model = BY_STEM[stem]
    first = write_split(model, tmp_path, 3)[0]
    for devices in (["--gpu", "1GiB"], ["--gpu", "300KiB"], ["--gpu", "600KiB", "--ctx", "auto"]):
        args = ("fit", "--ram", "8GiB", "--margin", "0", *devices)
        assert_same_but_shard_mapping(figures(*args[:1], first, *args[1:]),
                                      figures(*args[:1], model, *args[1:]))


@pytest.mark.parametrize("stem", ["tiny-llama-f16", "tiny-llama-f32", "tiny-qwen3-f16"])
def test_the_cpu_maps_each_shard_apart(stem, tmp_path):
    """llama.cpp maps each file of a set and counts, per file, the range from its first to
    the end of its last CPU tensor: the whole file's range less the padding at each boundary."""
    model = BY_STEM[stem]
    shards = write_split(model, tmp_path, 3)
    gaps = boundary_padding(model, 3)
    cpu = lambda path: figures("measure", path, "--ngl", "0")["backends"][-1]["mapped_bytes"]
    assert cpu(shards[0]) == cpu(model) - gaps


def test_a_split_set_runs_as_the_whole_file(tmp_path):
    import numpy as np

    model = BY_STEM["tiny-llama-q8_0"]
    first = write_split(model, tmp_path, 3)[0]
    outs = []
    for path in (model, first):
        out = tmp_path / f"{len(outs)}.npz"
        code, _, err = invoke("run", path, "--tokens", "1,72,101", "--out", out)
        assert code == 0, err
        outs.append(np.load(out)["result_output"])
    assert np.array_equal(*outs)


def _set(tmp_path, stem="tiny-llama-f16", n=3):
    return write_split(BY_STEM[stem], tmp_path, n)


def test_a_missing_shard_is_named(tmp_path):
    shards = _set(tmp_path)
    shards[1].unlink()
    line = one_line_error(("validate", shards[0]))
    assert shards[1].name in line


def test_a_duplicate_shard_is_named(tmp_path):
    shards = _set(tmp_path)
    shutil.copy(shards[0], shards[1])
    line = one_line_error(("validate", shards[0]))
    assert shards[1].name in line and "split file idx" in line


def test_shards_out_of_order_are_named(tmp_path):
    shards = _set(tmp_path)
    b1, b2 = shards[1].read_bytes(), shards[2].read_bytes()
    shards[1].write_bytes(b2)
    shards[2].write_bytes(b1)
    line = one_line_error(("validate", shards[0]))
    assert shards[1].name in line and "expected 1" in line


def test_a_shard_of_another_set_is_named(tmp_path):
    shards = _set(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    two = _set(other, "tiny-llama-f16", 2)
    shutil.copy(two[1], shards[1])              # split.no 1, but of a set of 2
    line = one_line_error(("validate", shards[0]))
    assert shards[1].name in line and "another set" in line


def test_a_wrong_tensor_count_is_corruption(tmp_path):
    model = BY_STEM["tiny-llama-f16"]
    blobs = split_gguf(model, 2)
    at = blobs[0].rfind(b"split.tensors.count") + len(b"split.tensors.count") + 4
    real = struct.unpack_from("<i", blobs[0], at)[0]
    first = tmp_path / "m-00001-of-00002.gguf"
    first.write_bytes(blobs[0][:at] + struct.pack("<i", real + 1) + blobs[0][at + 4:])
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(blobs[1])
    line = one_line_error(("validate", first))
    assert f"{real + 1} tensors expected" in line and first.name in line


def test_a_shard_not_named_as_one_is_refused(tmp_path):
    shards = _set(tmp_path)
    renamed = tmp_path / "model.gguf"
    shards[0].rename(renamed)
    line = one_line_error(("validate", renamed))
    assert "split.count" in line and "00001-of-00003" in line


def test_naming_a_later_shard_says_which_is_first(tmp_path):
    shards = _set(tmp_path)
    code, _, err = invoke("validate", shards[2])
    assert code == 0 and shards[0].name in err and "shard 3 of 3" in err


# --- URLs ----------------------------------------------------------------------------------------
def big_vocab(model, tokens: int = 40000) -> bytes:
    """The model with a long string array in its metadata (tokenizer.ggml.merges: no shape
    depends on it), so its header is a megabyte, as a real vocabulary's is."""
    items = b"".join(pstr(f"tok{i:06d} merge") for i in range(tokens))
    payload = struct.pack("<iQ", STRING, tokens) + items
    return rebuild(model.read_bytes(), extra_kv=kv_bytes("tokenizer.ggml.merges", 9, payload))


@pytest.mark.parametrize("stem", ["tiny-llama-q8_0", "tiny-gemma4moe-f16", "tiny-gpt-oss-mxfp4"])
def test_a_url_measures_as_the_local_file(stem, tmp_path):
    model = BY_STEM[stem]
    shards = split_gguf(model, 3)
    local = write_split(model, tmp_path, 3)
    files = {"whole.gguf": model.read_bytes()} | {
        f"s/m-{i:05d}-of-00003.gguf": b for i, b in enumerate(shards, 1)}
    with Server(files) as server:
        gpu = ("--gpu", "16GiB")     # every weight there (the CPU maps each shard apart)
        whole = figures("measure", model, *gpu)
        assert figures("measure", server.url("whole.gguf"), *gpu) == whole
        assert figures("measure", server.url("s/m-00002-of-00003.gguf"), *gpu) == whole
        assert figures("plan", server.url("whole.gguf"), "--ngl", "2") == figures(
            "plan", model, "--ngl", "2")
        code, dot, _ = invoke("dot", server.url("s/m-00001-of-00003.gguf"), "--ngl", "1")
        assert code == 0 and dot == invoke("dot", model, "--ngl", "1")[1]
        for fit in (("--gpu", "300KiB"), ("--gpu", "1GiB", "--ctx", "auto")):
            fit += ("--ram", "8GiB", "--margin", "0")
            assert figures("fit", server.url("whole.gguf"), *fit) == figures("fit", model, *fit)
            assert figures("fit", server.url("s/m-00001-of-00003.gguf"), *fit) == figures(
                "fit", local[0], *fit)


def test_only_the_header_travels(tmp_path):
    raw = big_vocab(BY_STEM["tiny-llama-q8_0"]) + bytes(4 << 20)     # and a big data section
    local = tmp_path / "big.gguf"
    local.write_bytes(raw)
    header = read_header(local)
    with Server({"big.gguf": raw}) as server:
        stats = Stats()
        got = read_headers(server.url("big.gguf"), stats=stats).shards[0].header
        assert got.tensors == header.tensors and got.kv == header.kv
        assert header.header_end > 900_000
        assert stats.bytes <= 1.5 * header.header_end
        assert stats.bytes <= header.data_offset + AHEAD           # never the data section
        assert server.counts.bytes <= stats.bytes


def test_a_server_that_ignores_ranges_is_refused_before_any_body_byte(tmp_path):
    """Exit 2 with one line: the whole file was on its way, and ggmlrun never downloads it."""
    raw = BY_STEM["tiny-qwen3-f16"].read_bytes() + b"\0" * (16 << 20)
    with Server({"m.gguf": raw}, ranges=False) as server:
        stats = Stats()
        with pytest.raises(InputError, match="ignores Range"):
            read_headers(server.url("m.gguf"), stats=stats)
        assert stats.bytes == 0
        code, out, err = invoke("measure", server.url("m.gguf"))
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    with Server({"x.gguf": b"<html>not a model</html>" * 100}) as server:
        line = one_line_error(("validate", server.url("x.gguf")))
        assert "not a GGUF file" in line and server.url("x.gguf") in line


def test_a_missing_url_is_a_404(tmp_path):
    with Server({}) as server:
        line = one_line_error(("measure", server.url("gone.gguf")))
        assert "404" in line and "gone.gguf" in line


def test_no_server_is_no_network(tmp_path):
    with Server({}) as server:
        url = server.url("m.gguf")
    line = one_line_error(("measure", url))              # the server is gone: nothing listens
    assert "cannot reach" in line


def test_a_header_past_the_bound_is_refused(tmp_path):
    raw = big_vocab(BY_STEM["tiny-llama-f16"], 20000)
    with Server({"m.gguf": raw}) as server:
        from ggmlrun.models.gguf.header import read_header_from

        handle = HttpFile(server.url("m.gguf"), limit=256 << 10)
        with pytest.raises(InputError, match="header runs past 256.0 KiB"):
            read_header_from(handle.open(), handle.size, "m", chunk=16 << 10)
        assert server.counts.bytes <= 256 << 10


# --- the header cache ----------------------------------------------------------------------------
def test_a_second_ask_costs_no_download_and_refresh_fetches_again(tmp_path, monkeypatch):
    model = BY_STEM["tiny-qwen3-q8_0"]
    with Server({"m.gguf": model.read_bytes()}) as server:
        first = figures("measure", server.url("m.gguf"))
        assert server.counts.bytes > 0
        assert list((tmp_path / "cache" / "ggmlrun" / "headers").glob("*.hdr"))  # XDG_CACHE_HOME
        server.counts.reset()
        assert figures("measure", server.url("m.gguf")) == first
        assert server.counts.requests == 0                 # fresh: not even asked
        monkeypatch.setenv("GGMLRUN_HEADER_MAX_AGE", "0")
        assert figures("measure", server.url("m.gguf")) == first
        assert server.counts.requests == 1 and server.counts.bytes == 0    # a HEAD
        figures("measure", server.url("m.gguf"), "--refresh")
        assert server.counts.bytes > 0


@pytest.mark.parametrize("max_age", ["0", "600"])
def test_a_changed_file_is_fetched_again_once_its_entry_is_stale(max_age, monkeypatch):
    llama, qwen = BY_STEM["tiny-llama-f16"], BY_STEM["tiny-qwen3-f16"]
    monkeypatch.setenv("GGMLRUN_HEADER_MAX_AGE", max_age)
    with Server({"m.gguf": llama.read_bytes()}) as server:
        assert figures("measure", server.url("m.gguf")) == figures("measure", llama)
        server.files["m.gguf"] = qwen.read_bytes()          # a new ETag
        now = figures("measure", server.url("m.gguf"))
        assert now == figures("measure", qwen if max_age == "0" else llama)
        assert figures("measure", server.url("m.gguf"), "--refresh") == figures(
            "measure", qwen)


def test_the_cache_is_bounded(tmp_path):
    cache = HeaderCache(tmp_path / "c", max_bytes=10_000)
    for i in range(10):
        cache.put(f"u{i}", "v", bytes(3000), 1 << 20)
    kept = [i for i in range(10) if cache.get(f"u{i}", "v") is not None]
    assert kept == [7, 8, 9]
    assert sum(p.stat().st_size for p in (tmp_path / "c").glob("*.hdr")) <= 10_000


def test_two_processes_writing_one_entry_leave_it_whole(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "c"
    script = (f"import sys; from ggmlrun.models.gguf.cache import HeaderCache\n"
              f"c = HeaderCache({str(root)!r})\n"
              f"blob = bytes([int(sys.argv[1])]) * 200000\n"
              f"for _ in range(40): c.put('u', 'v', blob, 7)\n")
    import os
    from pathlib import Path

    root_dir = str(Path(__file__).resolve().parent.parent)       # this checkout's ggmlrun
    env = {**os.environ, "PYTHONPATH": root_dir + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(k)], env=env) for k in (1, 2)]
    cache = HeaderCache(root)
    seen = set()
    while any(p.poll() is None for p in procs):
        got = cache.get("u", "v")
        if got is not None:
            blob, size = got
            assert size == 7 and len(blob) == 200000 and len(set(blob)) == 1
            seen.add(blob[0])
    assert all(p.wait() == 0 for p in procs)
    blob, _ = cache.get("u", "v")
    assert len(blob) == 200000 and len(set(blob)) == 1
    assert not [p for p in root.iterdir() if not p.name.endswith((".hdr", ".json"))]


# --- the Hub -------------------------------------------------------------------------------------
def hub_repos():
    q4, q8 = BY_STEM["tiny-qwen3moe-f16"], BY_STEM["tiny-qwen3moe-q8_0"]
    split = {f"tiny-Q4_K_M-{i:05d}-of-00003.gguf": b for i, b in enumerate(split_gguf(q4, 3), 1)}
    return {"org/tiny-GGUF": split | {"Q8_0/tiny-Q8_0.gguf": q8.read_bytes(),
                                      "mmproj-tiny-Q8_0.gguf": q8.read_bytes(),
                                      "README.md": b"# tiny"},
            "org/two-GGUF": {"a-Q8_0.gguf": q8.read_bytes(), "b-Q8_0.gguf": q8.read_bytes()},
            "org/gated-GGUF": {"g-Q4_K_M.gguf": q4.read_bytes()}}


@pytest.fixture
def hub(monkeypatch):
    with Server(repos=hub_repos(), gated={"org/gated-GGUF"}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def test_hf_names_measure_as_the_local_files(hub):
    q4, q8 = BY_STEM["tiny-qwen3moe-f16"], BY_STEM["tiny-qwen3moe-q8_0"]
    assert figures("measure", "hf://org/tiny-GGUF") == figures("measure", q4)   # Q4_K_M default
    assert figures("measure", "hf://org/tiny-GGUF:q8_0") == figures("measure", q8)
    assert figures("measure", "hf://org/tiny-GGUF/Q8_0/tiny-Q8_0.gguf@main") == figures(
        "measure", q8)
    fit = ("--gpu", "400KiB", "--ram", "8GiB", "--margin", "0", "--ctx", "auto")
    assert figures("fit", "hf://org/tiny-GGUF:Q4_K_M", *fit) == figures("fit", q4, *fit)


def test_only_headers_come_from_the_hub(hub):
    files = hub.repos["org/tiny-GGUF"]
    heads = [read_header_bytes(files[f"tiny-Q4_K_M-{i:05d}-of-00003.gguf"]) for i in (1, 2, 3)]
    invoke("validate", "hf://org/tiny-GGUF")
    sent_files = sum(1 for p in hub.counts.paths if p.startswith("/cdn/"))
    assert sent_files >= 3
    assert hub.counts.bytes <= sum(max(FIRST, 1.5 * h) for h in heads) + 2000   # + the listing


def read_header_bytes(blob: bytes) -> int:
    import io

    from ggmlrun.models.gguf.header import read_header_from

    return read_header_from(io.BytesIO(blob), len(blob), "x").header_end


def test_a_quant_no_file_carries_lists_those_present(hub):
    line = one_line_error(("validate", "hf://org/tiny-GGUF:Q5_K_S"))
    assert "Q5_K_S" in line and "Q4_K_M" in line and "Q8_0" in line


def test_a_quant_several_files_carry_lists_them(hub):
    line = one_line_error(("validate", "hf://org/two-GGUF:Q8_0"))
    assert "a-Q8_0.gguf" in line and "b-Q8_0.gguf" in line


def test_hub_errors_are_one_line_each(hub, monkeypatch):
    assert "no repository org/none" in one_line_error(("validate", "hf://org/none"))
    line = one_line_error(("validate", "hf://org/tiny-GGUF/nope.gguf"))
    assert "org/tiny-GGUF" in line and "nope.gguf" in line
    line = one_line_error(("validate", "hf://org/gated-GGUF"))
    assert "HF_TOKEN" in line and "licence" in line
    monkeypatch.setenv("HF_TOKEN", hub.token)
    assert invoke("validate", "hf://org/gated-GGUF")[0] == 0


def test_offline_answers_from_the_cache_only(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = one_line_error(("validate", "hf://org/tiny-GGUF"))
    assert "offline" in line
    monkeypatch.delenv("HF_HUB_OFFLINE")
    online = figures("measure", "hf://org/tiny-GGUF")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.counts.reset()
    assert figures("measure", "hf://org/tiny-GGUF") == online
    assert hub.counts.requests == 0


def test_no_hub_is_no_network(monkeypatch):
    with Server() as server:
        endpoint = server.endpoint
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    assert "cannot reach" in one_line_error(("validate", "hf://org/tiny-GGUF"))


# --- run, cards, progress ------------------------------------------------------------------------
def test_run_refuses_a_remote_model_unless_told_to_download(tmp_path):
    import numpy as np

    model = BY_STEM["tiny-llama-q8_0"]
    files = {f"m-{i:05d}-of-00002.gguf": b for i, b in enumerate(split_gguf(model, 2), 1)}
    with Server(files) as server:
        url = server.url("m-00001-of-00002.gguf")
        line = one_line_error(("run", url, "--tokens", "1,2"))
        assert "--download" in line and server.counts.bytes == 0
        outs = []
        for path in (model, url):
            out = tmp_path / f"{len(outs)}.npz"
            extra = ("--download",) if path == url else ()
            code, _, err = invoke("run", path, "--tokens", "1,72,101", "--out", out, *extra)
            assert code == 0, err
            outs.append(np.load(out)["result_output"])
        assert np.array_equal(*outs)


def test_run_downloads_from_the_hub(hub, tmp_path):
    import numpy as np

    outs = []
    for path in (BY_STEM["tiny-qwen3moe-q8_0"], "hf://org/tiny-GGUF:Q8_0"):
        out = tmp_path / f"{len(outs)}.npz"
        code, _, err = invoke("run", path, "--tokens", "1,2,3", "--out", out, "--download")
        assert code == 0, err
        outs.append(np.load(out)["result_output"])
    assert np.array_equal(*outs)


CARD_REFUSED = {"tiny-deepseek2-lite-f16", "tiny-deepseek2-q8_0", "tiny-gemma4-f16",
                "tiny-gemma4-q8_0", "tiny-gemma4moe-q8_0", "tiny-glm4moe-q8_0",
                "tiny-lfm2-f16", "tiny-lfm2moe-f16",   # lfm2(moe): per-layer KV heads, no card key
                "tiny-nemotronh-f16",    # nemotron_h(_moe): per-layer KV heads and FFN widths
                "tiny-nemotronhmoe-f16", "tiny-granitehybrid-f16",
                "tiny-mistral4-f16"}    # mistral4 as deepseek2: softmax gating without exp_probs_b


@pytest.mark.parametrize("model", PER_ARCH, ids=lambda m: m.stem)
def test_a_card_from_a_header_fits_as_the_file(model, tmp_path):
    card = tmp_path / "card.yaml"
    if model.stem in CARD_REFUSED:       # optional tensors the architecture's cards lack
        assert "card format cannot describe" in one_line_error(("card", model, "-o", card))
        assert not card.exists()
        return
    code, _, err = invoke("card", model, "-o", card)
    assert code == 0, err
    everything = ("--gpu", "1GiB", "--ram", "8GiB", "--margin", "0", "--ctx", "auto")
    assert figures("fit", card, *everything) == figures("fit", model, *everything)
    # with weights on the CPU, a file's mapped range spans what lies between its CPU tensors
    # (tensors on a device, repacked ones), which a card (no offsets) cannot know: the answer
    # and every device's figures are the same, the CPU's mapped bytes may differ
    small = ("--gpu", "300KiB", "--ram", "8GiB", "--margin", "0")
    on_card, on_file = figures("fit", card, *small), figures("fit", model, *small)
    cpu_card, cpu_file = on_card["backends"].pop(), on_file["backends"].pop()
    grow_card, grow_file = on_card.pop("host_growth"), on_file.pop("host_growth")
    assert without_host_free(grow_card) == without_host_free(grow_file)
    assert on_card == on_file
    assert (cpu_card["kv_bytes"], cpu_card["arena_bytes"]) == (cpu_file["kv_bytes"],
                                                               cpu_file["arena_bytes"])
    on_card, on_file = figures("measure", card, "--ngl", "2"), figures("measure", model,
                                                                       "--ngl", "2")
    for key in ("n_nodes", "n_splits", "n_copies"):
        assert on_card[key] == on_file[key]
    assert on_card["backends"][:-1] == on_file["backends"][:-1]


def test_a_card_from_the_hub_is_the_local_files_card(hub, tmp_path):
    texts = []
    for name in (BY_STEM["tiny-qwen3moe-f16"], "hf://org/tiny-GGUF"):
        code, out, err = invoke("card", name)
        assert code == 0, err
        texts.append(out.split("\n", 1)[1])          # past the comment naming the source
    assert texts[0] == texts[1]


def test_progress_draws_one_line_only_after_half_a_second():
    import io
    import time

    from ggmlrun.cli.fetching import FetchProgress

    stats = Stats()
    stats.add(requests=3, nbytes=5 << 20, files=3, done=1)
    quiet, off, late = io.StringIO(), io.StringIO(), io.StringIO()
    FetchProgress(True, quiet)(stats)                 # just started: nothing yet
    slow = FetchProgress(False, off)
    slow.start -= 1
    slow(stats)                                       # disabled (--json, not a terminal)
    drawn = FetchProgress(True, late)
    drawn.start -= 1
    drawn(stats)
    drawn.finish(stats)
    assert quiet.getvalue() == off.getvalue() == ""
    text = late.getvalue()
    assert "5.0 MiB" in text and "shard 2 of 3" in text and text.count("\n") == 1
    assert time.monotonic() >= drawn.start


@pytest.mark.parametrize("name,repo,path,quant,rev", [
    ("hf://a/b", "a/b", None, None, None),
    ("hf://a/b:q4_k_m", "a/b", None, "q4_k_m", None),
    ("hf://a/b:Q8_0@v1.0", "a/b", None, "Q8_0", "v1.0"),
    ("hf://a/b/sub/x-Q8_0.gguf@0123abc", "a/b", "sub/x-Q8_0.gguf", None, "0123abc"),
])
def test_hf_names_parse(name, repo, path, quant, rev):
    from ggmlrun.models.gguf.hub import parse_hf

    got = parse_hf(name)
    assert (got.repo, got.path, got.quant, got.revision) == (repo, path, quant, rev)
    assert got.shown == name


@pytest.mark.parametrize("name", ["hf://a", "hf://a/b/readme.md", "hf://a/b@"])
def test_bad_hf_names_are_refused(name):
    assert name in one_line_error(("validate", name))


def test_a_server_that_never_answers_times_out():
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)                        # connections queue, nothing is ever answered
    try:
        handle = HttpFile(f"http://127.0.0.1:{silent.getsockname()[1]}/m.gguf", timeout=0.3)
        with pytest.raises(InputError, match="timed out"):
            handle.open()
    finally:
        silent.close()


def test_a_file_named_like_a_first_shard_but_not_split_is_one_file(tmp_path):
    model = BY_STEM["tiny-llama-f16"]
    named = tmp_path / "m-00001-of-00003.gguf"           # no split keys, no other shards
    shutil.copy(model, named)
    assert figures("measure", named) == figures("measure", model)
