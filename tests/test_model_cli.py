"""Models on the command line: cards, model options, errors and JSON keys (in-process)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.models.cards.reader import bundled_cards, read_card
from ggmlrun.models.cards.quant_mixture import fit_row, mixture_type, more_bits
from ggmlrun.models.load import load_input

ROOT = Path(__file__).resolve().parent.parent
CARD_8B = ROOT / "ggmlrun/models/cards/llama-3-8b-q4_k_m.yaml"
CARD_70B = ROOT / "ggmlrun/models/cards/llama-3-70b-q4_k_m.yaml"


def weight_bytes(model) -> int:
    from ggmlrun.core.ir.types import TYPES

    return sum(TYPES[t.dtype].row_bytes(math.prod(t.shape)) for t in model.tensors.values())


def type_counts(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in model.tensors.values():
        counts[t.dtype] = counts.get(t.dtype, 0) + 1
    return counts


# --- cards --------------------------------------------------------------------------------------
def test_bundled_cards_are_llama3_and_qwen3():
    names = [p.name for p in bundled_cards()]
    assert {"llama-3-70b-q4_k_m.yaml", "llama-3-8b-q4_k_m.yaml", "qwen3-32b-q4_k_m.yaml",
            "qwen3-8b-q4_k_m.yaml", "gemma-3-27b-q4_k_m.yaml", "gemma-4-31b-q4_k_m.yaml",
            "mistral-small-3.2-24b-q4_k_m.yaml", "qwen3.5-27b-q4_k_m.yaml",
            "qwen3-30b-a3b-q4_k_m.yaml", "qwen3-235b-a22b-q4_k_m.yaml",
            "glm-4.5-air-q4_k_m.yaml"} <= set(names)


@pytest.mark.parametrize("card,gib,params", [("gemma-3-27b-q4_k_m.yaml", 15.40, 27.01),
                                             ("mistral-small-3.2-24b-q4_k_m.yaml", 13.34, 23.57)])
def test_gemma3_and_mistral_small_cards_match_llama_cpps_sizes(card, gib, params):
    """llama-bench reports "gemma3 27B Q4_K - Medium | 15.40 GiB | 27.01 B" and
    "13.34 GiB | 23.57 B" for Mistral-Small-3.x-24B Q4_K_M."""
    import math

    model = read_card(CARD_8B.parent / card)
    assert round(weight_bytes(model) / 2**30, 2) == gib
    assert round(sum(math.prod(t.shape) for t in model.tensors.values()) / 1e9, 2) == params


def test_gemma3_card_slides_five_layers_of_six_and_fits_fast():
    import time

    from ggmlrun.core.backends.spec import BackendSpec
    from ggmlrun.models.fit import fit_model
    from ggmlrun.models.options.params import ModelOptions

    model = read_card(CARD_8B.parent / "gemma-3-27b-q4_k_m.yaml")
    hp = model.hparams
    assert hp.n_swa == 1024 and sum(hp.swa_layers) == 52
    assert [il for il in range(hp.n_layer) if not hp.is_swa(il)] == list(range(5, 62, 6))
    assert model.tensors["token_embd.weight"].dtype == "q6_K"     # tied: the output's type
    assert "output.weight" not in model.tensors
    backends = [BackendSpec(name="GPU0", kind="sim", memory=24 * 2**30, alignment=128),
                BackendSpec(name="CPU", kind="cpu", memory=64 * 2**30, alignment=32)]
    result = fit_model(model, backends, ModelOptions(ctx=8192, parallel=1), 2**30, 0, False)
    assert len(result.probes) <= 4        # the 1 s target: benchmarks/bench_fit.py
    assert result.ngl == 63
    # KV: 10 full layers x 8192 cells + 52 sliding layers x PAD(1024 + 512) cells, K and V f16
    # (one sequence: -np auto's 4 slots make the sliding cache 4 windows + 512)
    assert result.backends[0].kv_bytes == (10 * 8192 + 52 * 1536) * 16 * 128 * 2 * 2


def test_8b_q4_k_m_matches_llama_cpp_model_size():
    model = read_card(CARD_8B)
    hp = model.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_ff, hp.n_vocab, hp.n_ctx_train) \
        == (32, 4096, 32, 8, 14336, 128256, 8192)
    assert hp.rope_freq_base == 500000.0
    assert model.tensors["blk.0.attn_k.weight"].shape == (1024, 4096)
    # llama.cpp logs "model size = 4.58 GiB" for Meta-Llama-3-8B Q4_K_M
    assert round(weight_bytes(model) / 2**30, 2) == 4.58
    # 16 use_more_bits layers get q6_K attn_v and ffn_down; the output is q6_K too
    assert type_counts(model) == {"q4_K": 193, "q6_K": 33, "f32": 65}
    assert model.tensors["token_embd.weight"].dtype == "q4_K"
    assert model.tensors["output.weight"].dtype == "q6_K"
    assert all(t.offset is None for t in model.tensors.values())


def test_70b_q4_k_m_attn_v_rule_and_size():
    model = read_card(CARD_70B)
    assert model.hparams.n_layer == 80
    # the 70B type: attn_v outside use_more_bits is q5_K, not q4_K
    assert model.tensors["blk.11.attn_v.weight"].dtype == "q5_K"
    assert model.tensors["blk.12.attn_v.weight"].dtype == "q6_K"
    assert model.tensors["blk.11.ffn_down.weight"].dtype == "q4_K"
    assert type_counts(model) == {"q4_K": 441, "q6_K": 81, "q5_K": 40, "f32": 161}
    # llama.cpp logs "model size = 39.59 GiB" for Meta-Llama-3-70B Q4_K_M
    assert round(weight_bytes(model) / 2**30, 2) == 39.59


def test_use_more_bits_is_llama_quant_rule():
    assert [i for i in range(32) if more_bits(i, 32)] == \
        [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


@pytest.mark.parametrize("ftype,cls,layer,want", [
    ("q4_0", "output", 0, "q6_K"), ("q8_0", "output", 0, "q8_0"), ("f16", "output", 0, "f16"),
    ("q4_0", "attn_q", 3, "q4_0"), ("q4_K_S", "attn_v", 3, "q5_K"), ("q4_K_S", "attn_v", 4, "q4_K"),
    ("q4_K_S", "ffn_down", 3, "q5_K"), ("q5_K_M", "ffn_down", 0, "q6_K"),
    ("q4_K_M", "attn_norm", 0, "f32"), ("f16", "ffn_norm", 5, "f32"),
])
def test_mixture_types(ftype, cls, layer, want):
    assert mixture_type(ftype, cls, layer, 32, is_70b=False) == want


def test_fallback_for_rows_off_the_block():
    assert fit_row("q4_K", 4096) == "q4_K"
    assert fit_row("q4_K", 96) == "q5_0"
    assert fit_row("q6_K", 96) == "q8_0"
    assert fit_row("q8_0", 100) == "f16"


def write(tmp_path, text, name="card.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


UNIFORM = """architecture: llama
hparams: {n_layer: 2, n_embd: 64, n_head: 4, n_ff: 128, n_vocab: 320, n_ctx_train: 2048}
weights: f16
tied_embeddings: true
types: {token_embd: q8_0}
"""


def test_uniform_card_with_override_and_tied_output(tmp_path):
    model = load_input(write(tmp_path, UNIFORM))
    assert "output.weight" not in model.tensors
    assert model.tensors["token_embd.weight"].dtype == "q8_0"
    assert model.tensors["blk.1.ffn_up.weight"].dtype == "f16"
    assert model.tensors["blk.1.ffn_norm.weight"].dtype == "f32"
    assert model.hparams.n_head_kv == 4


@pytest.mark.parametrize("text,line,words", [
    ("architecture: mamba\nhparams: {}\nweights: f16\n", 1, "architecture 'mamba'"),
    ("architecture: llama\nhparams:\n  n_layer: 2\nweights: f16\n", 2, "missing hyperparameter"),
    (UNIFORM.replace("weights: f16", "weights: q4_K_X"), 3, "weights 'q4_K_X'"),
    (UNIFORM.replace("n_layer: 2", "n_layer: -2"), 2, "n_layer must be an integer"),
    (UNIFORM.replace("n_head: 4", "n_head: 4, n_head_kv: 3"), 2, "not a multiple of n_head_kv"),
    (UNIFORM.replace("token_embd: q8_0", "token_embd: q9_0"), 5, "unknown type"),
    (UNIFORM.replace("token_embd: q8_0", "tok_embd: q8_0"), 5, "unknown tensor class"),
    (UNIFORM.replace("tied_embeddings: true", "tied_embeddings: 3"), 4, "true or false"),
    (UNIFORM + "layers: 3\n", 6, "unknown top-level key 'layers'"),
])
def test_card_errors_exit_2_with_the_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    code, out, err = invoke("measure", path)
    assert code == 2 and out == ""
    assert f"{path}:{line}:" in err and words in err, err
    assert "Traceback" not in err


# --- options ------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,words", [
    (["--ctx", "4"], "--ctx applies to models"),
    (["--ngl", "3"], "--ngl applies to models"),
    (["--override-tensor", "ffn=CPU"], "--override-tensor applies to models"),
    (["--kv-type", "q8_0"], "--kv-type applies to models"),
    (["--flash-attn", "on"], "--flash-attn applies to models"),
])
def test_model_options_on_a_graph_file_exit_2(args, words):
    code, out, err = invoke("measure", ROOT / "graphs/mlp.yaml", *args)
    assert code == 2 and words in err


@pytest.mark.parametrize("args,words", [
    (["--ngl", "x"], "--ngl"), (["--ngl", "-1"], "--ngl"), (["--ctx", "0"], "--ctx"),
    (["--ubatch", "0"], "--ubatch"), (["--kv-type", "q3_K"], "--kv-type"),
    (["-ctk", "q4_K"], "-ctk"), (["--cache-type-v", "f8"], "--cache-type-v"),
    (["--flash-attn", "maybe"], "--flash-attn"), (["--tensor-split", "1,x"], "--tensor-split"),
    (["--tensor-split", "0,0"], "--tensor-split"), (["--tensor-split", "1,1"], "--tensor-split"),
    (["--override-tensor", "ffn"], "--override-tensor"),
    (["--override-tensor", "ffn(=CPU"], "--override-tensor"),
    (["--override-tensor", "ffn=GPU9"], "--override-tensor"), (["--ggml", "0.2"], "--ggml"),
])
def test_bad_model_option_values_exit_2_naming_the_option(args, words):
    code, out, err = invoke("measure", CARD_8B, *args)
    assert code == 2 and words in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["plan", "measure", "dot"])
def test_cost_policy_is_for_graphs(command):
    code, _, err = invoke(command, CARD_8B, "--policy", "cost")
    assert code == 2 and "--policy cost applies to graph files" in err


def test_validate_a_card():
    code, out, err = invoke("validate", CARD_8B, "--json")
    assert code == 0
    data = json.loads(out)
    assert data["valid"] and data["n_layer"] == 32 and data["tensors"] == 291


@pytest.mark.parametrize("args,words", [
    (["--margin", "1GB"], "--margin"), (["--margin", "1,2,3"], "--margin"),
    (["--margin", "0x"], "--margin"),
    (["--ctx", "big"], "--ctx"),
])
def test_fit_bad_options(args, words):
    code, out, err = invoke("fit", CARD_8B, *args)
    assert code == 2 and words in err


def test_margins():
    from ggmlrun.cli.fit_command import parse_margins

    assert parse_margins(None) == (2**30, 0, {})
    assert parse_margins("0") == (0, 0, {})
    assert parse_margins("0GiB,2GiB") == (0, 2 * 2**30, {})
    assert parse_margins("512MiB") == (512 * 2**20, 0, {})
    assert parse_margins("GPU0=1GiB,GPU1=512MiB") == (2**30, 0, {"GPU0": 2**30,
                                                                 "GPU1": 512 * 2**20})
    assert parse_margins("CPU=0") == (2**30, 0, {"CPU": 0})


@pytest.mark.parametrize("margin, words", [("GPU0=1GiB,512MiB", "every margin as NAME=SIZE"),
                                           ("GPU0=1GiB,GPU0=2GiB", "each backend once"),
                                           ("GPU7=1GiB", "no backend 'GPU7'")])
def test_bad_named_margins(margin, words):
    code, _, err = invoke("fit", CARD_8B, "--gpu", "8GiB,8GiB", "--ram", "32GiB",
                          "--margin", margin)
    assert code == 2 and words in err, err


def test_a_margin_per_device_moves_the_answer():
    """--margin GPU1=...: only that device keeps more free, so the answer can only shrink, and
    each backend's margin is the one given (the others keep the default 1 GiB / 0)."""
    base = ["--gpu", "5GiB,3GiB", "--ram", "32GiB", "--ctx", "8192", "--json"]
    _, out, _ = invoke("fit", CARD_8B, *base)
    plain = json.loads(out)
    _, out, _ = invoke("fit", CARD_8B, *base, "--margin", "GPU1=2GiB,CPU=1GiB")
    named = json.loads(out)
    margins = {b["name"]: b["margin_bytes"] for b in named["backends"]}
    assert margins == {"GPU0": 2**30, "GPU1": 2 * 2**30, "CPU": 2**30}
    assert named["ngl"] < plain["ngl"]


def test_fit_refuses_a_graph_file():
    code, out, err = invoke("fit", ROOT / "graphs/mlp.yaml")
    assert code == 2 and "fit takes a model" in err


def test_run_refuses_a_card_and_needs_tokens():
    code, _, err = invoke("run", CARD_8B, "--tokens", "1,2")
    assert code == 2 and "no weights" in err
    code, _, err = invoke("run", CARD_8B)
    assert code == 2 and "--tokens" in err
    code, _, err = invoke("run", ROOT / "graphs/mlp.yaml", "--tokens", "1,2")
    assert code == 2 and "--tokens applies to models" in err


def test_readme_first_command_fits_the_tiny_gguf():
    model = ROOT / "examples/models/tiny-llama-q8_0.gguf"
    code, out, err = invoke("fit", model)
    assert code == 0, err
    # the model as llama.cpp names it; -fa auto, -np auto: llama-server's own, left unwritten
    assert f"llama-server -m {model} -ngl 5 -c 2048\n" in out
    code, out, err = invoke("measure", ROOT / "examples/models/tiny-llama-q8_0.gguf", "--json")
    data = json.loads(out)
    assert {"n_nodes", "n_splits", "backends"} <= set(data)
    for b in data["backends"]:
        assert {"name", "kind", "arena_bytes", "weights_bytes", "kv_bytes",
                "lower_bound_bytes"} <= set(b)


SMALL_CARD = """architecture: llama
hparams: {n_layer: 3, n_embd: 128, n_head: 4, n_head_kv: 2, n_ff: 256, n_vocab: 512,
          n_ctx_train: 1024}
weights: q8_0
"""


def test_measure_and_plan_a_card_json(tmp_path):
    card = write(tmp_path, SMALL_CARD)
    code, out, err = invoke("measure", card, "--json", "--ngl", "2", "--ubatch", "64",
                            "--gpu", "16GiB")
    assert code == 0, err
    data = json.loads(out)
    assert data["ngl"] == 2 and data["ctx"] == 1024 and data["ubatch"] == 64
    assert data["n_nodes"] > 0 and data["n_splits"] >= 2
    sim, cpu = data["backends"]
    for b in (sim, cpu):
        assert {"name", "kind", "arena_bytes", "weights_bytes", "kv_bytes", "lower_bound_bytes",
                "memory_bytes"} <= set(b)
    # ngl 2: the last layer and the output layer on GPU0; two layers' KV stay on the CPU
    assert cpu["kv_bytes"] == 2 * sim["kv_bytes"] > 0
    code, out, err = invoke("plan", card, "--json", "--ngl", "2", "--ubatch", "64",
                            "--gpu", "16GiB")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["n_splits"] == data["n_splits"] == len(plan["splits"])
    assert len(plan["nodes"]) == data["n_nodes"]
    assert {s["backend"] for s in plan["splits"]} == {"GPU0", "CPU"}


def test_run_a_gguf_outputs_the_last_token_logits(tmp_path):
    import numpy as np

    gguf = ROOT / "examples/models/tiny-llama-q8_0.gguf"
    out = tmp_path / "logits.npz"
    code, text, err = invoke("run", gguf, "--tokens", "1,72,101", "--ngl", "2", "--json",
                             "--out", out)
    assert code == 0, err
    data = json.loads(text)
    assert data["outputs"]["result_output"]["shape"] == [1, 320]
    assert {"name", "copy_s", "compute_s", "copy_bytes"} <= set(data["timings"]["backends"][0])
    with np.load(out, allow_pickle=False) as saved:
        logits = saved["result_output"]
    assert logits.shape == (1, 320) and np.isfinite(logits).all()
    # the placement does not change the numbers beyond rounding
    code, text, err = invoke("run", gguf, "--tokens", "1,72,101", "--ngl", "0", "--out",
                             tmp_path / "cpu.npz")
    assert code == 0, err
    with np.load(tmp_path / "cpu.npz", allow_pickle=False) as saved:
        assert np.allclose(saved["result_output"], logits, atol=2e-2 * np.abs(logits).max())


def test_run_rejects_bad_tokens():
    gguf = ROOT / "examples/models/tiny-llama-q8_0.gguf"
    for tokens, words in (("1,x", "token ids"), ("1,320", "outside the vocabulary"),
                          (",".join(["1"] * 20), "do not fit the context")):
        extra = ["--ctx", "16"] if "context" in words else []
        code, _, err = invoke("run", gguf, "--tokens", tokens, *extra)
        assert code == 2 and words in err, err


def test_gemma4_card_has_its_real_shapes_and_fits_fast():
    """Gemma-4-31B: 30.70 B parameters (Google's 30.7B); attn_v only on the 50 sliding layers,
    the quantizer's attn_v counter over those 50; K as V on the 10 full layers."""
    import time

    from ggmlrun.core.backends.spec import BackendSpec
    from ggmlrun.models.fit import fit_model
    from ggmlrun.models.options.params import ModelOptions

    model = read_card(CARD_8B.parent / "gemma-4-31b-q4_k_m.yaml")
    hp = model.hparams
    assert round(sum(math.prod(t.shape) for t in model.tensors.values()) / 1e9, 2) == 30.70
    assert sum(name.endswith("attn_v.weight") for name in model.tensors) == 50
    assert "blk.5.attn_v.weight" not in model.tensors and hp.heads_kv(5) == 4
    assert model.tensors["blk.5.attn_k.weight"].shape == (4 * 512, 5376)
    assert model.tensors["rope_freqs.weight"].shape == (256,)
    backends = [BackendSpec(name="GPU0", kind="sim", memory=24 * 2**30, alignment=128),
                BackendSpec(name="CPU", kind="cpu", memory=64 * 2**30, alignment=32)]
    for flash_attn in (False, True):
        result = fit_model(model, backends, ModelOptions(ctx=8192, flash_attn=flash_attn,
                                                         parallel=1),
                           2**30, 0, False)
        assert len(result.probes) <= 4
        assert result.ngl == 61
        # K: each layer's own width; V: without flash attention every layer's rows are the
        # widest (16 x 256), the full layers' 4 x 512 padded to it
        k = 10 * 8192 * 2048 + 50 * 1536 * 4096
        v = 10 * 8192 * (2048 if flash_attn else 4096) + 50 * 1536 * 4096
        assert result.backends[0].kv_bytes == 2 * (k + v)
