"""llama-server's host growth (issue 30 item 1; models/memory/host_share.py), llama-cli's
too (the same server in a thread, one slot): the context checkpoints of SWA, recurrent and
hybrid models and the prompt cache, upper bounds the server grows into after it starts. A
checkpoint's bytes and a sequence's full state are llama.cpp's own
(llama_state_seq_get_size_ext with and without LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, recorded by
scripts/llamacpp/record_host_share.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest
from clikit import invoke

from ggmlrun.models.memory.caches import model_memory
from ggmlrun.models.memory.host_share import (MIB, checkpoint_bytes, host_growth,
                                              sequence_bytes, server_growth)
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.command_line import llama_cpp_line, options_from_line, parse_llama_args
from ggmlrun.models.options.params import ModelOptions

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples/models"
RECORDED = json.loads((ROOT / "tests/data/llamacpp/host_share.json").read_text())["entries"]


@lru_cache(maxsize=None)
def _hp(name: str):
    return read_gguf(MODELS / f"{name}.gguf").hparams


def _memory(name: str, **kw):
    return model_memory(_hp(name), ModelOptions(**{"ctx": 1024, "ubatch": 512, **kw}))


@pytest.mark.parametrize("e", RECORDED, ids=lambda e: f"{e['model']}-fa{int(e['flash_attn'])}"
                                                      f"-{e['kv_type']}")
def test_state_bytes_are_llama_cpps(e):
    """A checkpoint is the sequence's partial state (the SWA window or the recurrent state)
    and a prompt-cache entry its full state, to the byte; a model whose memory can drop a
    sequence's tail (a dense llama) makes no checkpoint."""
    hp = _hp(e["model"])
    mem = model_memory(hp, ModelOptions(ctx=e["ctx"], ubatch=512, flash_attn=e["flash_attn"],
                                        kv_type=e["kv_type"], parallel=e["parallel"],
                                        kv_unified=True))
    makes = mem.recurrent is not None or mem.swa is not None
    assert checkpoint_bytes(hp, mem, e["tokens"]) == (e["partial_bytes"] if makes else 0)
    assert sequence_bytes(hp, mem, e["tokens"]) == e["full_bytes"]


@pytest.mark.parametrize("name", ["tiny-gemma3-q8_0", "tiny-gpt-oss-f16", "tiny-llama4-f16"])
def test_swa_checkpoint_grows_to_its_window(name):
    """An SWA checkpoint grows with the prompt up to the window (or the SWA cache's cells)
    and no further: the size stated is its largest; --swa-full makes none."""
    hp, mem = _hp(name), _memory(name)
    largest = checkpoint_bytes(hp, mem)
    cap = min(hp.n_swa, mem.swa.cells)
    sizes = [checkpoint_bytes(hp, mem, t) for t in (1, cap // 2, cap, cap + 1, 4 * cap)]
    assert sizes == sorted(sizes) and sizes[0] < largest == sizes[2] == sizes[-1]
    assert checkpoint_bytes(hp, _memory(name, swa_full=True)) == 0


@pytest.mark.parametrize("name,makes", [("tiny-llama-f16", False), ("tiny-gemma3-q8_0", True),
                                        ("tiny-lfm2-f16", True)])
@pytest.mark.parametrize("per_slot", [-1, 0, 5, 32])
@pytest.mark.parametrize("parallel", [None, 1, 3])
def test_checkpoints_per_slot_times_slots(name, makes, per_slot, parallel):
    """The checkpoints' bound is slots x --ctx-checkpoints x one checkpoint; none where the
    model makes none or --ctx-checkpoints is 0 or negative (llama-server's n_ctx_checkpoints
    > 0 test)."""
    opts = ModelOptions(ctx=1024, ctx_checkpoints=per_slot, parallel=parallel)
    hp = _hp(name)
    mem = model_memory(hp, opts)
    g = host_growth(hp, mem, opts)
    assert g.slots == (parallel or 4)
    kept = max(0, per_slot) if makes else 0
    assert g.checkpoints_bytes == g.slots * kept * checkpoint_bytes(hp, mem)
    assert (g.checkpoints_bytes > 0) == (makes and per_slot > 0)


@pytest.mark.parametrize("name", ["tiny-llama-f16", "tiny-gemma3-q8_0", "tiny-qwen35-q8_0"])
@pytest.mark.parametrize("parallel,unified", [(None, False), (2, False), (2, True)])
def test_prompt_cache_bound(name, parallel, unified):
    """--cache-ram N: N MiB (server_prompt_cache's limit_size); 0: off; negative: no byte
    limit, the token limit (every stream's cells) of stream-full prompts with their
    checkpoints."""
    hp = _hp(name)
    base = ModelOptions(ctx=1024, parallel=parallel, kv_unified=unified)
    mem = model_memory(hp, base)
    for ram in (1, 8192):
        g = host_growth(hp, mem, replace(base, cache_ram=ram))
        assert (g.prompt_cache_bytes, g.prompt_cache_bound) == (ram * MIB, "cache-ram")
    g = host_growth(hp, mem, replace(base, cache_ram=0))
    assert (g.prompt_cache_bytes, g.prompt_cache_bound) == (0, "off")
    for ram in (-1, -7):
        g = host_growth(hp, mem, replace(base, cache_ram=ram))
        one = sequence_bytes(hp, mem, mem.kv.cells) + g.checkpoints_per_slot * g.checkpoint_bytes
        assert g.prompt_cache_bound == "tokens"
        assert g.prompt_cache_bytes == mem.kv.n_stream * one
    assert g.total_bytes == g.prompt_cache_bytes + g.checkpoints_bytes


def test_cli_target_grows_with_its_one_slot():
    """llama-cli runs llama-server in a thread (tools/cli/cli-server.h) with -np 1: the same
    prompt cache, one slot's checkpoints."""
    hp = _hp("tiny-gemma3-q8_0")
    cli = server_growth(hp, ModelOptions(ctx=1024, target="cli"), 1024)
    server = server_growth(hp, ModelOptions(ctx=1024), 1024)
    assert (cli.slots, server.slots) == (1, 4)
    assert 4 * cli.checkpoints_bytes == server.checkpoints_bytes > 0
    assert cli.prompt_cache_bytes == server.prompt_cache_bytes
    got, out, err = invoke("measure", "--json", str(MODELS / "tiny-gemma3-q8_0.gguf"),
                           "--for", "cli", "--ram", "1GiB", "--ctx", "512")
    assert got == 0, err
    assert json.loads(out)["host_growth"]["slots"] == 1


def test_options_parse_in_every_form():
    """--cache-ram and --ctx-checkpoints in llama.cpp's spellings (the line parser), written
    back into the line to paste, and read from `-- llama-server ARGS` as modelled."""
    assert parse_llama_args("-cram -1 --swa-checkpoints 4") == {
        **parse_llama_args(""), "cache_ram": -1, "ctx_checkpoints": 4}
    for words in ("--cache-ram 100 -ctxcp 0", "-cram 0 --ctx-checkpoints 8"):
        fields = parse_llama_args(words)
        opts = ModelOptions(**fields)
        again = options_from_line(llama_cpp_line(opts, [], ngl=1, ctx=512))
        assert (again.cache_ram, again.ctx_checkpoints) == (opts.cache_ram, opts.ctx_checkpoints)
    got, out, err = invoke("measure", "--json", "--ram", "1GiB", "--", "llama-server", "-m",
                           str(MODELS / "tiny-gemma3-q8_0.gguf"), "-c", "512", "-cram", "100",
                           "-ctxcp", "8")
    assert got == 0, err
    data = json.loads(out)
    assert data["unmodelled"] == []
    g = data["host_growth"]
    assert (g["prompt_cache_bytes"], g["checkpoints_per_slot"]) == (100 * MIB, 8)


def test_overrun_is_a_warning_not_a_failure():
    """Only the upper bounds past the host's RAM: exit 0, `fits` false, a warning naming a
    --cache-ram that keeps them within it; within it: no warning. The text report has the
    line."""
    model = str(MODELS / "tiny-qwen35-q8_0.gguf")
    for ram, fits in (("64MiB", False), ("16GiB", True)):
        got, out, err = invoke("measure", "--json", model, "--ram", ram, "--ctx", "512")
        assert got == 0, err
        g = json.loads(out)["host_growth"]
        assert g["fits"] is fits and g["upper_bounds"] is True
        assert ("--cache-ram" in err) is not fits
    got, out, err = invoke("fit", model, "--ram", "64MiB", "--gpu", "4GiB")
    assert got == 0, err
    said = " ".join(out.split())
    assert "grows into: (llama-server, upper bounds)" in said and "--cache-ram" in err
