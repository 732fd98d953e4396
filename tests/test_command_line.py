"""The llama.cpp line `fit` and `measure` print reproduces the answer: printed for every model
option, parsed back (llama.cpp's spelling) and measured again, it gives the same figures."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.models.options.command_line import (llama_cpp_args, llama_cpp_line, options_from_line,
                                         parse_llama_args, split_text)
from ggmlrun.models.load import load_model
from ggmlrun.models.options.params import ModelOptions, split_proportions
from ggmlrun.models.reserve import measure_model

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples/models/tiny-llama-f16.gguf"
TINY_MOE = ROOT / "examples/models/tiny-qwen3moe-f16.gguf"    # for the expert options
TINY_SWA = ROOT / "examples/models/tiny-gemma3-f16.gguf"     # sliding-window layers
# a q8_0 cache needs a head size its 32-value blocks divide: tiny qwen3's heads are 32 wide
# (the tiny llama's 16, which llama.cpp refuses)
TINY_HEAD_32 = ROOT / "examples/models/tiny-qwen3-f16.gguf"
CARD_70B = ROOT / "ggmlrun/models/cards/llama-3-70b-q4_k_m.yaml"
MMPROJ = str(ROOT / "tests/data/llamacpp/tiny-mmproj-gemma3-f16.gguf")   # a gemma3 projector
DRAFT = ROOT / "examples/models/tiny-llama-q8_0.gguf"           # a draft for the tiny llama

MiB = 2**20


def two_devices():
    return [dataclasses.replace(BackendSpec.of_kind("GPU0", "sim"), memory=3 * MiB),
            dataclasses.replace(BackendSpec.of_kind("GPU1", "sim"), memory=1 * MiB),
            BackendSpec.of_kind("CPU", "cpu")]


def one_device():
    return [BackendSpec.of_kind("SIM0", "sim"), BackendSpec.of_kind("CPU", "cpu")]


# Every ModelOptions field, with a value that changes the figures; a field added to
# ModelOptions without a case here fails test_every_option_has_a_case.
CASES = {
    "ctx": dict(ctx=512),
    "ubatch": dict(ubatch=32),
    "ubatch_past_batch": dict(ubatch=4096, ctx=4096),
    "flash_attn": dict(flash_attn=True),
    "ngl": dict(ngl=2),
    "no_kv_offload": dict(no_kv_offload=True),
    "kv_type": dict(kv_type="q8_0", flash_attn=True),
    "kv_type_f32": dict(kv_type="f32"),
    "type_k": dict(type_k="q4_1", flash_attn=True),      # -ctk and -ctv apart
    "type_v": dict(type_v="iq4_nl", flash_attn=True),
    "type_k_bf16": dict(type_k="bf16", type_v="f32"),
    "overrides": dict(overrides=(("ffn_.*", "CPU"), (r"blk\.1\..*", "GPU1"))),
    "tensor_split": dict(tensor_split=split_proportions((3, 1)), ngl=4),
    "tensor_split_odd": dict(tensor_split=split_proportions((0.3, 0.7)), ngl=4),
    "op_offload": dict(op_offload=False, ngl=2),
    "ggml": dict(ggml="0.15"),       # ggml's own rules: not a llama.cpp option
    "cpu_moe": dict(cpu_moe=True),                   # measured on the qwen3moe model
    "n_cpu_moe": dict(n_cpu_moe=2, ngl=4),
    "n_cpu_moe_and_ot": dict(n_cpu_moe=3, overrides=((r"blk\.1\.ffn_up", "GPU0"),)),
    # ggml's GGML_SCHED_MAX_COPIES: a build option, not a command-line one (every layer over
    # two devices is where it changes the figures)
    "sched_copies": dict(sched_copies=1),
    "no_mmap": dict(no_mmap=True, ngl=2),
    "parallel": dict(parallel=3, kv_unified=True),
    "parallel_streams": dict(parallel=2, ctx=600),      # a KV stream per sequence
    "kv_unified": dict(kv_unified=True, parallel=2),
    "target": dict(target="cli"),           # llama-cli's -np 1 (llama-server's auto: 4)
    "swa_full": dict(swa_full=True, ctx=1024, ubatch=32),
    # the draft's (measured beside the target in tests/test_draft.py): the line carries them
    "model_draft": dict(model_draft="d.gguf", ngl_draft=2, type_k_draft="bf16",
                        type_v_draft="f32"),
    "ctx_draft": dict(model_draft="d.gguf", ctx_draft=512),   # not llama.cpp's: not written
    "devices_draft": dict(model_draft="d.gguf", devices_draft=("GPU1",)),
    # llama-server's host growth, not allocated at start (host_growth, tests/test_host_share.py
    # measures it): the line carries them
    "cache_ram": dict(cache_ram=100, ctx_checkpoints=4),
    # the projector (--mmproj): its bytes on its backends (mmproj_bytes)
    "mmproj": dict(mmproj=MMPROJ, flash_attn=True),
    "mmproj_offload": dict(mmproj=MMPROJ, mmproj_offload=False),
    "no_mmproj": dict(mmproj=MMPROJ, no_mmproj=True),
}
MOE_CASES = ("cpu_moe", "n_cpu_moe", "n_cpu_moe_and_ot")
MODEL_OF = {"swa_full": TINY_SWA}   # a case whose option needs a model that has it


def test_every_option_has_a_case():
    fields = {f.name for f in dataclasses.fields(ModelOptions)}
    covered = {key for case in CASES.values() for key in case}
    assert fields <= covered, f"no command-line case for {sorted(fields - covered)}"


def _block_cache(case: dict) -> bool:
    return any(case.get(key, "f16").startswith(("q", "iq"))
               for key in ("kv_type", "type_k", "type_v"))


def _figures(m):
    return ([(b.name, b.weights_bytes, b.kv_bytes, b.arena_bytes, b.mmproj_bytes)
             for b in m.backends],
            m.n_nodes, m.n_splits, m.ctx, m.ubatch, m.ngl)


@pytest.mark.parametrize("name", sorted(CASES))
def test_line_reproduces_the_figures(name):
    model = load_model(TINY_MOE if name in MOE_CASES else
                       MODEL_OF.get(name, TINY_HEAD_32 if _block_cache(CASES[name]) else TINY))
    backends = two_devices()
    opts = ModelOptions(**CASES[name])
    first = measure_model(model, backends, opts)
    if name in MODEL_OF:       # the option changes this model's figures
        plain = dataclasses.replace(opts, **{name: ModelOptions.__dataclass_fields__[name].default})
        assert _figures(measure_model(model, backends, plain)) != _figures(first)
    line = llama_cpp_line(opts, backends, ngl=first.ngl, ctx=first.ctx)
    again = options_from_line(line, base=ModelOptions(ggml=opts.ggml, target=opts.target,
                                                      sched_copies=opts.sched_copies))
    assert _figures(measure_model(model, backends, again)) == _figures(first), line


def test_line_spelling():
    backends = two_devices()
    opts = ModelOptions(flash_attn=True, kv_type="q8_0", no_kv_offload=True, ubatch=2048,
                        tensor_split=(24, 12), overrides=(("ffn_.*", "CPU"),),
                        op_offload=False)
    assert llama_cpp_args(opts, backends, ngl=45, ctx=8192) == [
        "-ngl", "45", "-c", "8192", "-fa", "on", "-ub", "2048", "-ctk", "q8_0", "-ctv", "q8_0",
        "-nkvo", "-ts", "24,12", "-ot", "ffn_.*=CPU", "--no-op-offload"]
    # the default split is by device memory: written out, since llama.cpp splits by free memory
    assert "-ts 3,1" in llama_cpp_line(ModelOptions(), backends, ngl=5, ctx=256)
    assert "-ts" not in llama_cpp_line(ModelOptions(), one_device(), ngl=5, ctx=256)
    # a regex with shell characters is quoted, and reads back the same
    line = llama_cpp_line(ModelOptions(overrides=((r"blk\.(1|2)\..*", "CPU"),)), backends,
                          ngl=1, ctx=256)
    assert "'-ot' " not in line and r"'blk\.(1|2)\..*=CPU'" in line
    assert parse_llama_args(line)["overrides"] == ((r"blk\.(1|2)\..*", "CPU"),)


def test_split_text_is_exact():
    """-ts is printed as given (issue 30: `24,12` is `24,12`, never `2,1`), and the written
    proportions give llama.cpp's float32 split points exactly; only proportions llama.cpp's
    stof could not read are rescaled, into ones it reads."""
    from ggmlrun.models.memory.placement import split_points
    from ggmlrun.models.options.kinds import _llama_reads

    for parts, shown in (((3, 1), "3,1"), ((24, 12), "24,12"), ((0.3, 0.7), "0.3,0.7"),
                         ((80, 15), "80,15"), ((5, 0), "5,0"), ((1, 2, 3), "1,2,3"),
                         ((16777215, 1), "16777215,1"), ((0.1, 0.2, 0.3), "0.1,0.2,0.3"),
                         ((1e-300, 1e-300), None), ((1e300, 3e300), None),
                         ((2.0**-140, 2.0**-141), "2,1")):
        devices = [None] * len(parts)
        text = split_text(parts)
        again = tuple(float(x) for x in text.split(","))
        assert shown is None or text == shown, parts
        assert _llama_reads(again), parts
        assert split_points(devices, again) == split_points(devices, split_proportions(parts))


def test_parse_reads_what_other_options_write():
    fields = parse_llama_args("-ngl 3 -c 256 -fa off --rpc 127.0.0.1:50052,h:1 --swa-full "
                              "--n-cpu-moe 4 -np 2 --no-mmap -b 4096 -ub 4096")
    assert fields["rpc"] == ("127.0.0.1:50052", "h:1") and fields["swa_full"] is True
    assert (fields["n_cpu_moe"], fields["parallel"], fields["no_mmap"]) == (4, 2, True)
    assert fields["ubatch"] == 4096
    assert parse_llama_args("-ub 4096")["ubatch"] == 2048     # llama.cpp's -b caps -ub


def test_parse_refuses_what_it_does_not_write():
    with pytest.raises(ValueError, match="--temp"):
        parse_llama_args("-ngl 1 --temp 0.5")
    fields = parse_llama_args("-ctk q8_0 -ctv f16")           # K and V apart
    assert (fields["type_k"], fields["type_v"]) == ("q8_0", "f16")


def _fit(*args):
    host = () if "--ram" in args else ("--ram", "64GiB")     # never this machine's RAM
    code, out, err = invoke("fit", CARD_70B, "--json", *host, *args)
    assert code == 0, err
    return json.loads(out)


def test_fit_line_pasted_back_gives_the_answer():
    """The issue's case: -fa on and a q8_0 cache fit 45 layers, and the line says so (before,
    `-ngl 45 -c 8192` alone overcommitted: with f16 and no flash attention only 42 fit)."""
    data = _fit("--gpu", "24GiB", "--ctx", "8192", "--flash-attn", "on",
                "--kv-type", "q8_0")
    assert data["command"] == "-ngl 45 -c 8192 -fa on -ctk q8_0 -ctv q8_0"
    fields = parse_llama_args(data["command"])
    again = _fit("--gpu", "24GiB", "--ctx", str(fields["ctx"]), "--flash-attn", "on",
                 "--cache-type-k", fields["type_k"], "--cache-type-v", fields["type_v"])
    assert again["ngl"] == fields["ngl"]
    plain = _fit("--gpu", "24GiB", "--ctx", "8192")
    assert plain["ngl"] < data["ngl"]


def test_measure_prints_the_line():
    code, out, err = invoke("measure", TINY, "--ngl", "2", "--kv-type", "f32", "--ubatch", "64")
    assert code == 0, err
    # -fa auto and -np auto are llama-server's own defaults: not written
    assert f"llama-server -m {TINY} -ngl 2 -c 2048 -ub 64 -ctk f32 -ctv f32" in out
    code, out, _ = invoke("measure", TINY, "--ngl", "2", "--json")
    assert json.loads(out)["command"] == "-ngl 2 -c 2048"


def test_every_cli_model_option_reaches_the_line():
    """Each model option given on the command line shows in `measure`'s line."""
    spelled = {"--ubatch 64": "-ub 64", "--flash-attn on": "-fa on",
               "--no-kv-offload": "-nkvo", "--kv-type f32": "-ctk f32 -ctv f32",
               "--cache-type-k bf16": "-ctk bf16", "--cache-type-v f32": "-ctv f32",
               "--override-tensor ffn_.*=CPU": "-ot 'ffn_.*=CPU'",
               "--tensor-split 1": "-ts 1", "--no-op-offload": "--no-op-offload",
               "--ctx 512": "-c 512", "--ngl 1": "-ngl 1", "--gpu 2GiB,1GiB": "-ts 2,1",
               "--no-mmap": "--no-mmap", "--parallel 2 --kv-unified": "-np 2 -kvu",
               "--kv-unified --for cli": "-np 1 -kvu", "--swa-full": "--swa-full",
               "--cpu-moe": "--cpu-moe", "--n-cpu-moe 2": "--n-cpu-moe 2",
               f"--model-draft {DRAFT}": f"-md {DRAFT} -ngld all",
               f"--gpu-layers-draft 2 -md {DRAFT}": "-ngld 2",
               f"--cache-type-k-draft f32 -md {DRAFT}": "-ctkd f32",
               f"--cache-type-v-draft bf16 -md {DRAFT}": "-ctvd bf16",
               f"--device-draft none -md {DRAFT}": "-devd none",
               f"--mmproj {MMPROJ}": f"--mmproj {MMPROJ}", "--no-mmproj": "--no-mmproj",
               "--no-mmproj-offload": "--no-mmproj-offload",
               "--cache-ram -1": "-cram -1", "--ctx-checkpoints 0": "-ctxcp 0"}
    not_llama = {"--ram": "the host's memory: llama.cpp takes what the machine has",
                 "--sched-copies": "a build option: cmake -DGGML_SCHED_MAX_COPIES=N",
                 "--ctx-draft": "the vendored llama.cpp has no -cd: the draft gets the "
                                "target's context",
                 "--for": "the program whose defaults the line is for, not one of its options",
                 "--refresh": "where the header comes from (the header cache), not an option "
                              "of the model"}
    from ggmlrun.cli.model_options import MODEL_FLAGS, MODEL_OPTIONS

    flags = {o.split()[0] for o in spelled}
    for key in MODEL_OPTIONS:
        flag = MODEL_FLAGS[key]
        assert flag in flags or flag in not_llama, f"{flag} has no case"
    for given, expect in spelled.items():
        model = TINY_MOE if "moe" in given else TINY
        device = () if "--gpu" in given else ("--gpu", "16GiB")   # (no GPU here otherwise)
        code, out, err = invoke("measure", model, *given.split(), *device, "--json")
        assert code == 0, (given, err)
        assert expect in json.loads(out)["command"], given


@pytest.mark.parametrize("extra", [(), ("--no-kv-offload", "--ubatch", "2048"),
                                   ("--override-tensor", r"blk\.(1|2)\.ffn_.*=CPU"),
                                   ("--tensor-split", "1,3")])
def test_two_gpu_fit_line_measures_the_same(extra):
    """fit on two GPUs: its line, parsed and measured on the same devices, gives fit's figures
    (the default split written as -ts 24,12 included)."""
    from ggmlrun.core.backends.spec import default_cpu, default_sim

    data = _fit("--gpu", "24GiB,12GiB", "--ram", "64GiB", "--ctx", "8192", *extra)
    model = load_model(CARD_70B)
    backends = [dataclasses.replace(default_sim("GPU0"), memory=24 * 2**30),
                dataclasses.replace(default_sim("GPU1"), memory=12 * 2**30),
                dataclasses.replace(default_cpu(), memory=64 * 2**30)]
    fields = parse_llama_args(data["command"])
    assert fields["ngl"] == data["ngl"] and "tensor_split" in fields
    again = measure_model(model, backends, options_from_line(data["command"]))
    assert [(b.name, b.weights_bytes, b.kv_bytes, b.arena_bytes) for b in again.backends] == \
        [(b["name"], b["weights_bytes"], b["kv_bytes"], b["arena_bytes"]) for b in data["backends"]]


def test_the_line_names_the_model_as_llama_cpp_reads_it_back():
    """model_words is the inverse of the `--` form's -m / -hf / -hff / -mu: a name written
    and read back is the same model; a card and a pinned revision name nothing."""
    from ggmlrun.models.options.command_line import model_words
    from ggmlrun.models.options.llama_command import read_command

    for source in ("examples/models/tiny-llama-f16.gguf", "hf://owner/repo:Q4_K_M",
                   "hf://owner/repo", "hf://owner/repo/sub/model-Q8_0.gguf",
                   "https://example.com/m.gguf"):
        words = model_words(source, local_gguf=True)
        cmd = read_command(["llama-server", *words])
        assert str(cmd.model) == source, (source, words)
    assert model_words("ggmlrun/models/cards/llama-3-8b-q4_k_m.yaml", local_gguf=False) == []
    assert model_words("hf://owner/repo:Q4_K_M@abc123", local_gguf=True) == []
