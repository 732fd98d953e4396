"""`fit`/`measure ... -- llama-server ARGS` (SPEC section 5, issue 30 item 5): a llama.cpp
command line as the user runs it gives the answer its options give ggmlrun; every option
llama.cpp takes is modelled, read as the model/--fit, or named as not modelled; what llama.cpp
refuses, and an option given on both sides of `--`, is exit 2 in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.models.options.command_line import SPELLINGS
from ggmlrun.models.options.llama_args import ARGS
from ggmlrun.models.options.llama_command import _OWN, read_command

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples/models/tiny-llama-f16.gguf"            # n_ctx_train 2048
TINY_MOE = ROOT / "examples/models/tiny-qwen3moe-f16.gguf"
CARD_70B = ROOT / "ggmlrun/models/cards/llama-3-70b-q4_k_m.yaml"
CARD_8B = ROOT / "ggmlrun/models/cards/llama-3-8b-q4_k_m.yaml"
DEVICES = ("--gpu", "3GiB,1GiB", "--ram", "64GiB")
FIGURES = ("ngl", "ctx", "n_nodes", "n_splits")


def _json(*args, code=0):
    got, out, err = invoke(args[0], "--json", *args[1:])
    assert got == code, err
    return json.loads(out) if out else None, err


def _figures(data):
    return ({k: data.get(k) for k in FIGURES},
            [(b["name"], b["weights_bytes"], b["kv_bytes"], b["arena_bytes"])
             for b in data["backends"]])


# ggmlrun's flags and the llama.cpp words that say the same (explicit -fa and -np: the
# figures depend on them, whatever the defaults are)
SAME = [
    ("--ngl 2 --flash-attn on --parallel 1", "-ngl 2 -fa on -np 1"),
    ("--ngl 3 --ctx 512 --ubatch 64 --cache-type-k f32 --flash-attn off --parallel 1",
     "--gpu-layers 3 --ctx_size 512 -ub 64 -ctk f32 -fa off -np 1"),
    ("--no-kv-offload --tensor-split 1,3 --flash-attn off --parallel 2 --kv-unified",
     "-nkvo -ts 1,3 -fa off -np 2 -kvu"),
    ("--override-tensor ffn_.*=CPU --no-mmap --no-op-offload --flash-attn off --parallel 1",
     "-ot ffn_.*=CPU -lm none --no-op-offload -fa off -np 1"),
    ("--ngl all --ubatch 2048 --ctx 4096 --flash-attn off --parallel 1",
     "-ngl -2 -b 4096 -ub 2048 -c 4096 -fa off -np 1"),
]


@pytest.mark.parametrize("flags, words", SAME)
def test_measure_command_is_measure_with_its_options(flags, words):
    """The figures of `measure -- llama-server -m M WORDS` are those of `measure M FLAGS`
    (with the training context where the command gives no -c, as llama.cpp allocates it)."""
    ctx = () if "--ctx" in flags else ("--ctx", "2048")
    plain, _ = _json("measure", TINY, *flags.split(), *ctx, *DEVICES)
    again, err = _json("measure", *DEVICES, "--", "llama-server", "-m", TINY, *words.split())
    assert _figures(again) == _figures(plain), words
    assert again["command"] == plain["command"] and again["unmodelled"] == []


def test_fit_command_is_fit_with_its_options():
    """-c N is fit --ctx N; -c absent with --fit on is --ctx auto from --fit-ctx; --fit off
    pins every layer and the training context; --fit-target MiB is the device margin and
    llama.cpp's own fit target."""
    base = ("--flash-attn", "on", "--parallel", "1", "--gpu", "3GiB,3GiB", "--ram", "64GiB")
    cmd = ("llama-server", "-m", CARD_8B, "-fa", "on", "-np", "1")
    gpus = ("--gpu", "3GiB,3GiB", "--ram", "64GiB")
    for fit_flags, words in ((("--ctx", "auto", "--min-ctx", "2048"), ("-fitc", "2048")),
                             (("--ctx", "4096", "--margin", "GPU0=0,GPU1=2GiB",
                               "--fit-target", "0,2048"),
                              ("-c", "4096", "--fit-target", "0,2048"))):
        plain, _ = _json("fit", CARD_8B, *base, *fit_flags)
        again, _ = _json("fit", *gpus, "--", *cmd, *words)
        assert _figures(again) == _figures(plain), words
        assert again["command"] == plain["command"]
        assert again["llamacpp_fit"] == plain["llamacpp_fit"]     # llama.cpp's own, predicted
    # --fit off: llama.cpp allocates what the command says: every layer, the training context
    off, err = _json("fit", *gpus, "--", *cmd, "--fit", "off", code=1)
    assert (off["ngl"], off["ctx"]) == (None, 8192) and "-ngl 33 does not fit" in err


def test_pinned_ngl_fits_as_measured():
    """-ngl N (which llama.cpp's --fit leaves alone) is checked, not searched: it fits exactly
    when measure says N fits, and a miss names the most layers that fit."""
    found, _ = _json("fit", CARD_70B, "--ctx", "4096", "--flash-attn", "on", "--parallel", "1",
                     "--gpu", "24GiB", "--ram", "64GiB")
    best = found["ngl"]
    for ngl in (best, best + 1):
        data, err = _json("fit", "--gpu", "24GiB", "--ram", "64GiB", "--", "llama-server",
                          "-m", CARD_70B, "-c", "4096", "-fa", "on", "-np", "1",
                          "-ngl", str(ngl), code=0 if ngl <= best else 1)
        assert data["ngl"] == (ngl if ngl <= best else None)
        if ngl > best:
            assert f"-ngl {best} fits" in err and err.count("\n") == 1


# a value each option reads (by table row, or by spelling for those read here)
VALUES = {"ngl": "3", "ctx": "512", "flash_attn": "on", "batch": "64", "ubatch": "64",
          "type_k": "q8_0", "type_v": "q8_0", "tensor_split": "1", "overrides": "x=CPU",
          "rpc": "h:1", "n_cpu_moe": "2", "parallel": "2", "load_mode": "none",
          **{w: "on" for w in ("-fit", "--fit")},
          **{w: "row" for w in ("-sm", "--split-mode")},
          **{w: "a/b" for w in ("-hf", "-hfr", "--hf-repo")}}


def test_every_llama_option_is_read_or_named():
    """Each option llama-server takes lands in exactly one place: the option table (modelled),
    the model or --fit (read here), or the named unmodelled list, with its value."""
    for on, off, n, tools in ARGS:
        if "server" not in tools:
            continue
        for word in (*on, *off):
            option = SPELLINGS[word][0] if word in SPELLINGS else None
            value = VALUES.get(option.name if option else word,
                               getattr(option.kind, "values", ("7",))[0] if option else "7")
            words = ["llama-server", word] + [value] * n
            if word in ("-hff", "--hf-file"):
                words += ["-hf", "a/b"]
            cmd = read_command(words)
            places = [word in SPELLINGS and bool(cmd.written),
                      word in _OWN,
                      cmd.unmodelled == [" ".join(words[1:1 + 1 + n])]]
            assert sum(places) == 1, word


def test_model_names():
    """-m is a path; -hf OWNER/REPO[:QUANT] (with -hff FILE) the hf:// name of
    models/gguf/hub.py."""
    assert read_command(["llama-server", "-hf", "o/r"]).model == "hf://o/r"
    assert read_command(["llama-cli", "-hfr", "o/r:Q8_0"]).model == "hf://o/r:Q8_0"
    assert read_command(["llama-server", "-hf", "o/r", "-hff", "x.gguf"]).model == \
        "hf://o/r/x.gguf"
    assert read_command(["/opt/bin/llama-server", "-m", "a.gguf"]).model == Path("a.gguf")


def test_what_llama_cpp_defaults_spell():
    """-sm layer is how ggmlrun places a model (the other modes are named), -np -1 is
    llama-server's auto (the default), -c 0 the training context, -ngl -1 fit's to choose and
    -ngl -2 every layer; llama-cli plans one sequence unless -np says otherwise."""
    assert read_command(["llama-server", "-sm", "layer"]).unmodelled == []
    assert read_command(["llama-server", "-sm", "row"]).unmodelled == ["-sm row"]
    cmd = read_command(["llama-server", "-np", "-1", "-c", "0", "-ngl", "-1"])
    assert cmd.fields == {} and cmd.ctx_train and cmd.ngl_auto
    cmd = read_command(["llama-server", "-ngl", "-2"])
    assert cmd.fields == {"ngl": None} and not cmd.ngl_auto
    for words, parallel in ((["llama-cli"], 1), (["llama-cli", "-np", "3"], 3)):
        data, _ = _json("measure", *DEVICES, "--", *words, "-m", TINY, "-fa", "off")
        assert data["options"]["parallel"] == parallel


def test_unmodelled_named_on_stderr_once():
    data, err = _json("measure", *DEVICES, "--", "llama-server", "-m", TINY, "-c", "512",
                      "-ngl", "2", "--port", "8080", "--temp", "0.5", "-cms", "64")
    assert data["unmodelled"] == ["--port 8080", "--temp 0.5", "-cms 64"]
    lines = [line for line in err.splitlines() if "not modelled" in line]
    assert len(lines) == 1 and all(w in lines[0] for w in ("--port 8080", "--temp 0.5", "-cms 64"))


@pytest.mark.parametrize("args, says", [
    (("--", "llama-server", "-m", TINY, "--bogus"), "invalid argument: --bogus"),
    (("--", "llama-cli", "-m", TINY, "-kvu"), "invalid argument: -kvu"),
    (("--", "llama-server", "-m", TINY, "-c"), "expected value"),
    (("--", "python3", "-m", TINY), "not llama-server or llama-cli"),
    (("--", "llama-server"), "no model"),
    (("--",), "after --"),
    (("--", "llama-server", "-m", TINY, "-hf", "o/r"), "both name the model"),
    ((TINY, "--", "llama-server", "-m", TINY), "MODEL (before --)"),
    (("--ngl", "2", "--", "llama-server", "-m", TINY, "-ngl", "3"), "--ngl (before --)"),
    (("--kv-type", "f32", "--", "llama-server", "-m", TINY, "-ctv", "f32"), "--kv-type"),
    (("--ctx", "512", "--", "llama-server", "-m", TINY, "-c", "0"), "--ctx (before --)"),
    (("--", "llama-server", "-m", TINY, "--rpc", "h:1"), "rpc-server h:1"),
    (("--", "llama-server", "-m", TINY, "-fa", "maybe"), "-fa maybe"),
    (("--", "llama-server", "-m", TINY, "-sm", "rows"), "-sm rows"),
    (("--no-op-offload", "--", "llama-server", "-m", TINY, "--no-op-offload"), "(before --)"),
])
def test_refusals_are_one_line(args, says):
    for command in ("measure", "fit"):
        if command == "fit" and "--ngl" in args:
            continue                     # fit takes no --ngl at all (its own refusal)
        code, out, err = invoke(command, *DEVICES, *args)
        assert code == 2 and says in err and err.count("\n") == 1, (command, args, err)


def test_fit_conflicts_with_its_own_options():
    for before, words in ((("--margin", "0"), ("-fitt", "0")),
                          (("--min-ctx", "1024"), ("-fitc", "1024")),
                          (("--ctx", "512"), ("-c", "512"))):
        code, _, err = invoke("fit", *DEVICES, *before, "--", "llama-server", "-m", TINY, *words)
        assert code == 2 and before[0] in err and err.count("\n") == 1, err


def test_llama_device_names_in_ot_are_the_devices_in_order():
    """-ot REGEX=CUDA1 (llama.cpp's buffer name: backend and device index; Metal is device 0)
    is the second device planned for, with a note; the figures are ggmlrun's with GPU1."""
    plain, _ = _json("measure", TINY, "--ctx", "2048", "--flash-attn", "off", "--parallel",
                     "1", "--override-tensor", r"blk\.1\..*=GPU1", "--override-tensor",
                     "output.*=GPU0", *DEVICES)
    again, err = _json("measure", *DEVICES, "--", "llama-server", "-m", TINY, "-fa", "off",
                       "-np", "1", "-ot", r"blk\.1\..*=CUDA1,output.*=Metal")
    assert _figures(again) == _figures(plain)
    assert "read as GPU1" in err and "read as GPU0" in err
