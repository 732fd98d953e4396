"""Hyperparameters checked as llama.cpp checks them (GGUF files and cards alike), and the model
options bounded as llama.cpp's types bound them (issue 19, parts 3, 5 and 6b)."""

from __future__ import annotations

import json
import math
import random
import warnings
from pathlib import Path

import numpy as np
import pytest

from clikit import invoke
from ggmlrun.models.arch import llama_tensor_shapes
from ggmlrun.models.hparams.record import HParams
from tests.hang import no_hang

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples/models/tiny-llama-q8_0.gguf"
TWO_DEVICES = ROOT / "graphs/backends/llamacpp_rpc2.yaml"


# --- GGUF files -------------------------------------------------------------------------------
def _vt():
    import gguf

    return gguf.GGUFValueType


def base_meta() -> dict:
    vt = _vt()
    return {"llama.block_count": (2, vt.UINT32), "llama.context_length": (512, vt.UINT32),
            "llama.embedding_length": (64, vt.UINT32),
            "llama.feed_forward_length": (96, vt.UINT32),
            "llama.attention.head_count": (4, vt.UINT32),
            "llama.attention.head_count_kv": (2, vt.UINT32),
            "llama.attention.layer_norm_rms_epsilon": (1e-5, vt.FLOAT32),
            "llama.rope.freq_base": (10000.0, vt.FLOAT32),
            "llama.vocab_size": (300, vt.UINT32)}


def write_gguf(path: Path, **changes) -> Path:
    """A tiny random llama GGUF (2 layers, n_embd 64, 4 heads, 2 KV heads) whose metadata is
    `base_meta` with `changes`: a key (dots as '__') -> (value, GGUF type[, element type]), or
    None to leave the key out. The tensors keep the base shapes."""
    import gguf

    meta = base_meta()
    for key, value in changes.items():
        key = "llama." + key.replace("__", ".")
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (value, vtype, *sub) in meta.items():
        w.add_key_value(key, value, vtype, sub[0] if sub else None)
    hp = HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300,
                      n_ctx_train=512, n_rot=16)
    rng = np.random.default_rng(0)
    for name, shape in llama_tensor_shapes(hp).items():
        scale = 1.0 if len(shape) == 1 else 1 / np.sqrt(shape[-1])
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def one_line(code, err, want_code, *words):
    assert code == want_code, err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for word in words:
        assert word in err, (word, err)


def test_the_base_file_runs(tmp_path):
    path = write_gguf(tmp_path / "ok.gguf")
    code, out, err = invoke("run", path, "--tokens", "1,2,3", "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"]["result_output"]["shape"] == [1, 300]


def _bad_cases():
    vt = _vt()
    nan, inf = float("nan"), float("inf")
    return [
        ("rope__freq_base", (0.0, vt.FLOAT32), "llama.rope.freq_base"),
        ("rope__freq_base", (nan, vt.FLOAT32), "llama.rope.freq_base"),
        ("rope__freq_base", (-inf, vt.FLOAT32), "llama.rope.freq_base"),
        ("attention__layer_norm_rms_epsilon", (nan, vt.FLOAT32), "layer_norm_rms_epsilon"),
        ("attention__layer_norm_rms_epsilon", (0.0, vt.FLOAT32), "layer_norm_rms_epsilon"),
        ("attention__layer_norm_rms_epsilon", (1e30, vt.FLOAT32), "layer_norm_rms_epsilon"),
        ("embedding_length", ("64", vt.STRING), "llama.embedding_length"),
        ("embedding_length", (64.0, vt.FLOAT32), "llama.embedding_length"),
        ("block_count", (2, vt.INT32), "llama.block_count"),           # llama.cpp: wrong type
        ("block_count", (0, vt.UINT32), "llama.block_count"),
        ("block_count", (513, vt.UINT32), "LLAMA_MAX_LAYERS"),
        ("context_length", (0, vt.UINT32), "llama.context_length"),
        ("rope__dimension_count", (2**31, vt.UINT32), "llama.rope.dimension_count"),
        ("rope__dimension_count", (15, vt.UINT32), "llama.rope.dimension_count"),
        ("rope__dimension_count", (8, vt.UINT32), "invalid n_rot"),    # llama: n_rot == head size
        ("attention__head_count_kv", (3, vt.UINT32), "not a multiple"),
        ("attention__head_count", (0, vt.UINT32), "llama.attention.head_count"),
        ("attention__head_count", (128, vt.UINT32), "head size would be 0"),
        ("attention__key_length", (2**24, vt.UINT32), "llama.attention.key_length"),
        ("attention__value_length", (32, vt.UINT32), "must equal the key head size"),
        ("vocab_size", (2**31, vt.UINT32), "llama.vocab_size"),
        ("rope__scaling__type", ("bogus", vt.STRING), "llama.rope.scaling.type"),
        ("rope__scaling__factor", (-2.0, vt.FLOAT32), "llama.rope.scaling.factor"),
        ("rope__scaling__factor", (nan, vt.FLOAT32), "llama.rope.scaling.factor"),
        ("rope__scaling__type", ("longrope", vt.STRING), "is not built by ggmlrun"),
        ("rope__scaling__finetuned", (1, vt.UINT32), "llama.rope.scaling.finetuned"),
        ("expert_count", (2000, vt.UINT32), "LLAMA_MAX_EXPERTS"),
        ("feed_forward_length", ([96, 97], vt.ARRAY, vt.UINT32), "differs between layers"),
        ("feed_forward_length", ([96, 96, 96], vt.ARRAY, vt.UINT32), "3 per-layer values"),
        ("feed_forward_length", ([96.0, 96.0], vt.ARRAY, vt.FLOAT32), "an array of FLOAT32"),
        ("rope__freq_base", ([1.0, 2.0], vt.ARRAY, vt.FLOAT32), "llama.rope.freq_base"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_hyperparameters_exit_2_naming_the_key(tmp_path, case):
    key, value, words = _bad_cases()[case]
    path = write_gguf(tmp_path / "bad.gguf", **{key: value})
    for command in ("validate", "run"):
        args = ("--tokens", "1,2") if command == "run" else ()
        code, out, err = invoke(command, path, *args)
        one_line(code, err, 2, words, str(path))


def test_a_string_embedding_length_names_its_gguf_type(tmp_path):
    vt = _vt()
    path = write_gguf(tmp_path / "s.gguf", embedding_length=("4096", vt.STRING))
    code, _, err = invoke("validate", path)
    one_line(code, err, 2, "llama.embedding_length", "a STRING ('4096')", "UINT32")
    path = write_gguf(tmp_path / "f.gguf", embedding_length=(64.0, vt.FLOAT32))
    code, _, err = invoke("validate", path)
    one_line(code, err, 2, "llama.embedding_length", "a FLOAT32", "UINT32")


def test_per_layer_arrays_are_read_as_llama_cpp_reads_them(tmp_path):
    """get_key_or_arr: one value per layer (UINT32, INT32 or BOOL elements) is accepted; when
    every layer has the same value, the model is the same as with the scalar."""
    vt = _vt()
    path = write_gguf(tmp_path / "a.gguf", feed_forward_length=([96, 96], vt.ARRAY, vt.UINT32),
                      attention__head_count=([4, 4], vt.ARRAY, vt.INT32),
                      attention__head_count_kv=([2, 2], vt.ARRAY, vt.UINT32))
    plain = write_gguf(tmp_path / "p.gguf")
    a = invoke("measure", path, "--json")
    b = invoke("measure", plain, "--json")
    assert a[0] == b[0] == 0, a[2] + b[2]
    ja, jb = json.loads(a[1]), json.loads(b[1])
    assert ja["backends"] == jb["backends"] and ja["n_nodes"] == jb["n_nodes"]


def test_rope_scaling_yarn_is_built_and_longrope_refused_outside_phi3(tmp_path):
    """YaRN with a factor is llama_context's: freq_scale 1/factor, ext_factor 1 (its ramp; the
    mistral3 recordings hold it to llama.cpp's logits); LongRoPE needs factor tensors only
    phi3's graph builds: exit 2 for llama. Linear scaling is rope's freq_scale."""
    from ggmlrun.models.hparams.rope import rope_params
    from ggmlrun.models.modelfile import read_gguf

    vt = _vt()
    yarn = write_gguf(tmp_path / "y.gguf", rope__scaling__type=("yarn", vt.STRING),
                      rope__scaling__factor=(4.0, vt.FLOAT32))
    hp = read_gguf(yarn).hparams
    assert hp.rope_freq_scale == 0.25 and rope_params(hp)["ext_factor"] == 1.0
    longrope = write_gguf(tmp_path / "lr.gguf", rope__scaling__type=("longrope", vt.STRING))
    code, _, err = invoke("validate", longrope)
    one_line(code, err, 2, "llama.rope.scaling.type 'longrope' is not built")
    one = write_gguf(tmp_path / "y1.gguf", rope__scaling__type=("yarn", vt.STRING),
                     rope__scaling__factor=(1.0, vt.FLOAT32))
    assert read_gguf(one).hparams.rope_freq_scale == 1.0
    linear = write_gguf(tmp_path / "l.gguf", rope__scaling__type=("linear", vt.STRING),
                        rope__scaling__factor=(4.0, vt.FLOAT32))
    assert read_gguf(linear).hparams.rope_freq_scale == 0.25


def test_defaults_apply_when_optional_keys_are_absent(tmp_path):
    from ggmlrun.models.arch import from_metadata
    from ggmlrun.models.modelfile import read_gguf

    hp = read_gguf(write_gguf(tmp_path / "d.gguf", rope__freq_base=None)).hparams
    assert hp.rope_freq_base == 10000.0 and hp.n_rot == 16
    fields = {key: value for key, (value, *_) in base_meta().items()
              if key != "llama.attention.head_count_kv"}
    assert from_metadata(fields).n_head_kv == 4


def _fuzz_values():
    vt = _vt()
    return [(0, vt.UINT32), (1, vt.UINT32), (2**31, vt.UINT32), (2**32 - 1, vt.UINT32),
            (-1, vt.INT32), (0.0, vt.FLOAT32), (float("nan"), vt.FLOAT32),
            (float("inf"), vt.FLOAT32), (1e-30, vt.FLOAT32), (3e38, vt.FLOAT32),
            ("x", vt.STRING), (True, vt.BOOL), ([1, 2], vt.ARRAY, vt.UINT32)]


def test_no_value_reaches_a_kernel_unchecked(tmp_path):
    """Every rule key set to each of a set of awkward values: `run` either refuses it (exit 2,
    one line) or computes finite logits; never exit 1, an internal error or a warning."""
    from ggmlrun.models.hparams.keys import RULES

    rng = random.Random(19)
    keys = list(RULES)
    values = _fuzz_values()
    pairs = [(k, v) for k in keys for v in values]
    for key, value in rng.sample(pairs, 40):
        path = write_gguf(tmp_path / "z.gguf", **{key.replace(".", "__"): value})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            code, out, err = invoke("run", path, "--tokens", "1,2,3", "--json", "--ctx", "64")
        assert code in (0, 2), (key, value, err)
        assert "internal error" not in err and "Traceback" not in err, (key, value, err)
        if code == 0:
            summary = json.loads(out)["outputs"]["result_output"]
            assert math.isfinite(summary["sum"]) and math.isfinite(summary["l2"]), (key, value)


# --- cards ------------------------------------------------------------------------------------
HP = {"n_layer": "2", "n_embd": "64", "n_head": "4", "n_ff": "128", "n_vocab": "320",
      "n_ctx_train": "2048"}


def card_text(**changes) -> str:
    """A small card; `changes`: hyperparameter -> its YAML text."""
    hp = {**HP, **changes}
    return ("architecture: llama\nhparams: {" + ", ".join(f"{k}: {v}" for k, v in hp.items())
            + "}\nweights: f16\n")


CARD = card_text()


def card(tmp_path, text, name="card.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return path


def test_a_huge_layer_count_is_refused_at_once(tmp_path):
    """135 bytes asking for 16,777,216 layers: 3.5 GB and 30 s before 'out of memory' once;
    now refused by the rule (LLAMA_MAX_LAYERS) before anything is built."""
    import subprocess
    import sys

    path = card(tmp_path, card_text(n_layer="16777216"))
    with no_hang("measure of 16,777,216 layers"):     # was 30 s and 3.5 GB
        code, out, err = invoke("measure", path)
    one_line(code, err, 2, "n_layer", "512", f"{path}:2:")
    # the whole process's peak resident memory, interpreter and imports included: VmHWM
    # (ru_maxrss would count the test process's own size, inherited across fork and exec)
    if not Path("/proc/self/status").exists():
        return
    script = ("import re\nfrom ggmlrun.cli import main\ntry:\n"
              f"    main(['measure', {str(path)!r}])\nexcept SystemExit as done:\n"
              "    hwm = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read())\n"
              "    print(done.code, hwm.group(1))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    code, rss_kib = proc.stdout.split()
    assert code == "2" and int(rss_kib) < 100 * 1024, proc.stdout


@pytest.mark.parametrize("change,words", [
    ("rope_freq_base: " + str(2**1100), "rope_freq_base"),
    ("rope_freq_base: .nan", "rope_freq_base"),
    ("rope_freq_base: 1.0e+39", "rope_freq_base"),           # past float32: inf in llama.cpp
    ("norm_rms_eps: .inf", "norm_rms_eps"),
    ("norm_rms_eps: 5", "norm_rms_eps"),
    ("n_embd: 64.0", "n_embd"),
    ("n_embd: '64'", "n_embd"),
    ("n_ff: true", "n_ff"),
    ("n_ctx_train: 4294967296", "n_ctx_train"),
    ("n_vocab: 16777217", "n_vocab"),
    ("n_rot: 8", "invalid n_rot"),
    ("n_rot: 2048", "n_rot"),
])
def test_card_hyperparameters_follow_the_same_rules(tmp_path, change, words):
    key, value = change.split(": ", 1)
    path = card(tmp_path, card_text(**{key: value}))
    code, out, err = invoke("validate", path)
    one_line(code, err, 2, words, f"{path}:2:")


def test_card_and_gguf_give_the_same_words(tmp_path):
    """One rule set: the same bad value reads the same, named as each input names it."""
    vt = _vt()
    gguf_err = invoke("validate", write_gguf(tmp_path / "b.gguf",
                                             block_count=(600, vt.UINT32)))[2]
    card_err = invoke("validate", card(tmp_path, card_text(n_layer="600")))[2]
    tail = "must be an integer from 1 to 512 (llama.cpp's LLAMA_MAX_LAYERS), got 600"
    assert f"llama.block_count {tail}" in gguf_err and f"n_layer {tail}" in card_err


@pytest.mark.parametrize("dtype", ["i32", "i8", "f64", "q8_K", "q8_1"])
def test_card_weight_types_need_a_kernel(tmp_path, dtype):
    path = card(tmp_path, CARD + f"types: {{output: {dtype}}}\n")
    code, _, err = invoke("validate", path)
    one_line(code, err, 2, f"type '{dtype}' for output is not a weight type", f"{path}:4:")


def test_every_card_weight_type_has_a_kernel():
    from ggmlrun.core.ir.types import TYPES, decode_blocks
    from ggmlrun.models.hparams.rules import WEIGHT_TYPES

    for name in WEIGHT_TYPES:
        t = TYPES[name]
        if t.is_block:
            assert decode_blocks(np.zeros((1, t.type_size), np.uint8), name).shape[-1] == \
                t.block_size


def test_a_card_with_a_utf8_bom_is_a_card(tmp_path):
    path = card(tmp_path, b"\xef\xbb\xbf" + CARD.encode())
    code, out, err = invoke("validate", path, "--json")
    assert code == 0, err
    assert json.loads(out)["n_layer"] == 2


# --- options ----------------------------------------------------------------------------------
@pytest.mark.parametrize("args,option", [
    (["--ctx", str(2**100)], "--ctx"), (["--ctx", str(2**32)], "--ctx"),
    (["--ubatch", str(2**100)], "--ubatch"), (["--ubatch", str(2**32)], "--ubatch"),
    (["--ngl", str(2**31)], "--ngl"),
    (["--tensor-split", "1e308,1e308"], "--tensor-split"),
    (["--tensor-split", "-1,2"], "--tensor-split"), (["--tensor-split", "nan,1"], "--tensor-split"),
    (["--tensor-split", "inf,1"], "--tensor-split"),
])
def test_option_bounds_exit_2(args, option):
    code, out, err = invoke("measure", TINY, "--backends", TWO_DEVICES, *args)
    assert code == 2 and option in err and "Traceback" not in err, err


def test_library_callers_get_the_same_bounds():
    from ggmlrun.core.backends.spec import default_backends
    from ggmlrun.models.modelfile import read_gguf
    from ggmlrun.models.options.params import ModelOptions
    from ggmlrun.models.reserve import measure_model
    from ggmlrun.core.util.errors import InputError

    model = read_gguf(TINY)
    for opts in (ModelOptions(ctx=2**32), ModelOptions(ubatch=2**40)):
        with pytest.raises(InputError, match="uint32"):
            measure_model(model, default_backends(), opts)


def test_the_largest_uint32_context_is_measured():
    code, out, err = invoke("measure", TINY, "--ctx", str(2**32 - 1), "--json")
    assert code == 1, err                    # far past the memory: measured, and exit 1
    assert json.loads(out)["ctx"] == 2**32 - 1


@pytest.mark.parametrize("pattern,words", [
    ("a{99999999999}", "repetition {99999999999} is larger than 1000"),
    ("a{2,5000}", "larger than 1000"),
    ("(a)\\1", "invalid escape sequence"),            # backreferences: RE2 has none
    ("(?=ffn)", "invalid perl operator"),             # nor look-around
    ("ffn(", "missing )"),
])
def test_bad_override_patterns_exit_2_naming_the_pattern(pattern, words):
    code, out, err = invoke("measure", TINY, "--override-tensor", f"{pattern}=CPU")
    assert code == 2 and pattern in err and words in err, err
    assert "Traceback" not in err and "internal error" not in err
    assert "re2.cc" not in err                       # RE2's own log line stays quiet


def test_override_patterns_take_linear_time():
    """'(a+)+$' against a long name: minutes of backtracking in a backtracking engine."""
    from ggmlrun.core.backends.spec import default_backends
    from ggmlrun.models.options.params import ModelOptions
    from ggmlrun.models.memory.placement import place

    hp = HParams(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=96, n_vocab=300,
                      n_ctx_train=512, n_rot=16)
    opts = ModelOptions(overrides=(("(a+)+$", "SIM0"),))
    for n in (26, 100_000):          # 26: ~10 s of backtracking in Python's re; 100k: forever
        names = ["a" * n + "!", "blk.0.ffn_up.weight"]
        with no_hang(f"-ot (a+)+$ on {n} a's"):   # backtracking: ~10 s at 26, forever at 100k
            placed = place(hp, names, default_backends(), opts)
        assert placed.weights[names[0]] == len(default_backends()) - 1    # no match: the CPU


def test_override_tensor_still_matches_as_a_search():
    code, out, err = invoke("measure", TINY, "--json", "--ngl", "0", "--gpu", "16GiB",
                            "--override-tensor", "blk\\.[0-9]+\\.ffn_(up|down)=GPU0")
    assert code == 0, err
    sim = json.loads(out)["backends"][0]
    assert sim["weights_bytes"] > 0


@pytest.mark.parametrize("split", ["1e300,1e300", "1e-300,1e-300", "3e38,3e38"])
def test_tensor_split_extremes_normalise_without_warnings(split):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, out, err = invoke("measure", TINY, "--backends", TWO_DEVICES, "--json",
                                "--tensor-split", split)
    assert code == 0 and "Warning" not in err, err
    want = json.loads(invoke("measure", TINY, "--backends", TWO_DEVICES, "--json",
                             "--tensor-split", "1,1")[1])
    assert json.loads(out)["backends"] == want["backends"]


def test_split_proportions_keep_llama_cpps_float32_points():
    """Scaling by a power of two changes no float32 split point of ordinary proportions."""
    from ggmlrun.core.backends.spec import BackendSpec
    from ggmlrun.models.options.params import split_proportions
    from ggmlrun.models.memory.placement import split_points

    rng = random.Random(5)
    devices = [BackendSpec.of_kind("sim", f"D{i}") for i in range(3)]
    for _ in range(300):
        parts = tuple(rng.choice([0, 1, 2, 3, 0.1, 7.5, 1e-3, 1e6, rng.random() * 100])
                      for _ in range(3))
        if not sum(parts):
            continue
        assert split_points(devices, split_proportions(parts)) == split_points(devices, parts)


@pytest.mark.parametrize("args", [["--ctx", "4611686018427387904"], ["--ctx", str(2**32)],
                                  ["--min-ctx", str(2**32)]])
def test_fit_context_bounds(args):
    code, out, err = invoke("fit", TINY, *args)
    assert code == 2 and args[0] in err, err


# --- measure exits 1 when something does not fit, as plan does --------------------------------
def test_measure_model_exits_1_when_it_does_not_fit():
    code, out, err = invoke("measure", TINY, "--gpu", "16GiB", "--memory", "CPU=1B", "--json")
    assert code == 1 and "backend CPU needs" in err and "--memory CPU=SIZE" in err, err
    data = json.loads(out)                           # the figures are still printed
    assert data["fits"] is False and {b["name"]: b["fits"] for b in data["memory"]} == \
        {"GPU0": True, "CPU": False}
    assert data["backends"][1]["memory_bytes"] == 1
    plan = invoke("plan", TINY, "--memory", "CPU=1B")
    assert plan[0] == 1
    code, out, err = invoke("measure", TINY, "--memory", "CPU=1B")
    assert code == 1 and "CPU" in out                # the table first, then the error


def test_measure_model_fits_counts_kv_and_compute():
    """The verdict is on llama.cpp's figures: model + KV + compute buffers per backend."""
    data = json.loads(invoke("measure", TINY, "--json", "--gpu", "16GiB")[1])
    sim = data["backends"][0]
    need = sim["weights_bytes"] + sim["kv_bytes"] + sim["arena_bytes"]
    code, out, err = invoke("measure", TINY, "--json", "--gpu", f"{need}B")
    assert code == 0, err
    code, out, err = invoke("measure", TINY, "--json", "--gpu", f"{need - 1}B")
    assert code == 1 and "backend GPU0 needs" in err


def test_fit_auto_context_of_a_uint32_trained_gguf_is_quick(tmp_path):
    """context_length 2**32-1 and memory for 400M cells: the KV bound was walked 256 cells at
    a time (20 s); solved, the same edge in well under a second of search."""
    vt = _vt()
    path = write_gguf(tmp_path / "long.gguf", context_length=(2**32 - 1, vt.UINT32))
    with no_hang("fit --ctx auto of a uint32-trained GGUF"):
        code, out, err = invoke("fit", path, "--ctx", "auto", "--json", "--gpu",
                                "4096GiB", "--ram", "4096GiB", "--flash-attn", "off",
                                "--parallel", "1")
    assert code == 0, err
    data = json.loads(out)
    assert (data["ngl"], data["ctx"]) == (3, 418918656)      # the walk's answer, the same edge
