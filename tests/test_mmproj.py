"""The multimodal projector (--mmproj): ggmlrun's figures for the tiny gemma3 projectors equal
libmtmd's (scripts/llamacpp/record_mmproj.py: CPU and an RPC device, flash attention off, on
and auto), measure and fit carry them per SPEC section 5, and what ggmlrun does not size is
refused by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from gguf import GGUFWriter

from clikit import invoke
from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.models.projector.clip import read_clip
from ggmlrun.models.projector.measure import measure_projector

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "llamacpp"
RECORDED = json.loads((DATA / "mmproj.json").read_text())
RPC = ROOT / "graphs" / "backends" / "llamacpp_rpc.yaml"     # the recording's device pair
TEXT = ROOT / "examples" / "models" / "tiny-gemma3-f16.gguf"
MMPROJ = DATA / "tiny-mmproj-gemma3-f16.gguf"


@pytest.mark.parametrize("rec", RECORDED["configs"],
                         ids=lambda r: f"{r['mmproj']}-{r['device']}-fa-{r['flash_attn']}")
def test_figures_are_libmtmds(rec):
    """Weights on the projector's backend, compute buffer per backend (the raw image is a CPU
    input), nodes, splits and what flash attention `auto` resolved to."""
    p = measure_projector(read_clip(DATA / rec["mmproj"]), load_backends(RPC),
                          offload=rec["device"] == "rpc", flash_attn=rec["flash_attn"])
    assert p.weights_bytes == rec["backends"][p.backend]["weights_bytes"]
    assert p.arena == {k: v["arena_bytes"] for k, v in rec["backends"].items()}
    assert (p.n_nodes, p.n_splits) == (rec["n_nodes"], rec["n_splits"])
    assert (p.flash_attn, p.image_size) == (rec["flash_attn_resolved"], rec["warmup_image_size"])


def test_auto_without_device_flash_attention_keeps_both_reserves():
    """clip's warm-up: auto tries flash attention; a device that cannot run it gets a second
    reserve without, and ggml's allocator keeps each backend's larger buffer."""
    model = read_clip(DATA / "tiny-mmproj-gemma3-b-q8_0.gguf")
    rpc, cpu = load_backends(RPC)
    no_fa = [dataclasses.replace(rpc, unsupported=frozenset({"flash_attn_ext"})), cpu]
    auto = measure_projector(model, no_fa, flash_attn="auto")
    on, off = (measure_projector(model, no_fa, flash_attn=fa) for fa in ("on", "off"))
    assert auto.flash_attn is False
    assert auto.arena == {k: max(on.arena[k], off.arena[k]) for k in auto.arena}


def _json(command: str, *args) -> dict:
    code, out, err = invoke(command, TEXT, "--backends", RPC, "--ram", "64GiB", "--json", *args)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("command", ["measure", "fit"])
def test_the_projector_is_added_to_its_backends(command):
    """SPEC's `mmproj` keys; the model's own buffers unchanged; each backend's total grows by
    the projector's bytes there (weights and compute on the device, the image on the CPU)."""
    plain = _json(command, "--flash-attn", "on")
    data = _json(command, "--flash-attn", "on", "--mmproj", MMPROJ)
    rec = next(r for r in RECORDED["configs"] if r["mmproj"] == MMPROJ.name
               and r["device"] == "rpc" and r["flash_attn"] == "on")
    mm = data["mmproj"]
    assert {k: mm[k] for k in ("name", "backend", "weights_bytes", "kv_bytes", "arena_bytes")} \
        == {"name": "tiny-mmproj-gemma3-f16", "backend": "RPC0",
            "weights_bytes": rec["backends"]["RPC0"]["weights_bytes"], "kv_bytes": 0,
            "arena_bytes": rec["backends"]["RPC0"]["arena_bytes"]}
    for before, after in zip(plain["backends"], data["backends"]):
        own = rec["backends"][after["name"]]
        assert after["mmproj_bytes"] == own["weights_bytes"] + own["arena_bytes"]
        for key in ("weights_bytes", "kv_bytes", "arena_bytes"):
            assert after[key] == before[key]
        if command == "fit":
            assert after["total_bytes"] == before["total_bytes"] + after["mmproj_bytes"]
    assert f"--mmproj {MMPROJ}" in data["command"]


def test_no_mmproj_leaves_it_out():
    data = _json("measure", "--mmproj", MMPROJ, "--no-mmproj")
    assert "mmproj" not in data and "--no-mmproj" in data["command"]


def _clip_file(path: Path, **kv) -> Path:
    writer = GGUFWriter(str(path), kv.pop("arch", "clip"))
    for key, value in kv.items():
        (writer.add_bool if isinstance(value, bool) else writer.add_string)(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("kv,said", [
    ({"clip.has_vision_encoder": True, "clip.projector_type": "qwen2vl_merger"},
     "projector type 'qwen2vl_merger' is known to libmtmd but not sized by ggmlrun"),
    ({"clip.has_vision_encoder": True, "clip.projector_type": "no_such_type"},
     "projector type 'no_such_type' is unknown"),
    ({"clip.has_audio_encoder": True, "clip.projector_type": "ultravox"},
     "has an audio encoder"),
    ({"arch": "llama"}, "architecture 'llama' is not a projector"),
])
def test_what_is_not_sized_is_refused_by_name(tmp_path, kv, said):
    path = _clip_file(tmp_path / "mmproj.gguf", **kv)
    code, out, err = invoke("measure", TEXT, "--mmproj", path, "--json")
    assert code == 2 and said in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# --- hf:// models: the repository's projector, as llama.cpp's -hf picks it ------------------
@pytest.mark.parametrize("files,model,picked", [
    (["a-Q4_K_M.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf"], "a-Q4_K_M.gguf", "mmproj-Q8_0.gguf"),
    (["m/a-Q8_0.gguf", "mmproj-F16.gguf", "m/mmproj-F32.gguf"], "m/a-Q8_0.gguf", "m/mmproj-F32.gguf"),
    (["m/a-F16.gguf", "n/mmproj-F16.gguf"], "m/a-F16.gguf", None),
    (["a-Q4_K_M.gguf", "mmproj-BF16.gguf", "mmproj-F16.gguf"], "a-Q4_K_M.gguf", "mmproj-BF16.gguf"),
])
def test_the_sibling_is_llama_cpps(files, model, picked):
    """common/download.cpp's find_best_sibling: in the model's folder or above, the deepest
    first, then the closest quant bits, the first listed on a tie; none in another folder."""
    from ggmlrun.models.gguf.hub import pick_sibling

    assert pick_sibling(files, model) == picked


@pytest.fixture
def hub(monkeypatch):
    from hubkit import Server

    model = TEXT.read_bytes()
    repos = {"org/gemma-GGUF": {"gemma-Q8_0.gguf": model, "mmproj-F16.gguf": MMPROJ.read_bytes()},
             "org/odd-GGUF": {"odd-Q8_0.gguf": model, "mmproj-F16.gguf": model}}
    with Server(repos=repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield server


def test_an_hf_model_brings_its_repositorys_projector(hub):
    code, out, err = invoke("measure", "hf://org/gemma-GGUF:Q8_0", "--json", "--flash-attn", "on",
                            "--backends", RPC, "--ram", "64GiB")
    assert code == 0, err
    assert json.loads(out)["mmproj"] == _json("measure", "--flash-attn", "on",
                                              "--mmproj", MMPROJ)["mmproj"]
    code, out, err = invoke("measure", "hf://org/gemma-GGUF:Q8_0", "--json", "--no-mmproj")
    assert code == 0 and "mmproj" not in json.loads(out)


def test_a_repositorys_projector_ggmlrun_cannot_size_is_left_out_with_a_note(hub):
    code, out, err = invoke("measure", "hf://org/odd-GGUF:Q8_0", "--json")
    assert code == 0 and "mmproj" not in json.loads(out)
    assert "note: the repository's projector hf://org/odd-GGUF/mmproj-F16.gguf is left out" in err


def test_a_position_grid_libmtmd_cannot_interpolate_is_refused():
    """qwen3vl interpolates its learned grid with ggml_interpolate, which takes f32 only:
    libmtmd aborts on an f16 grid, ggmlrun says so."""
    from ggmlrun.core.util.errors import InputError
    from ggmlrun.models.projector.clip import ClipTensor

    model = read_clip(DATA / "tiny-mmproj-qwen3vl-f16.gguf")
    pos = model.tensors["v.position_embd.weight"]
    f16 = dataclasses.replace(model, tensors={**model.tensors, pos.name: ClipTensor(
        pos.name, pos.shape, "f16")})
    with pytest.raises(InputError, match="takes f32 only"):
        measure_projector(f16, load_backends(RPC))


def test_the_projector_takes_the_models_fa_as_given():
    """llama-server hands libmtmd its -fa as given (params_base.flash_attn_type), not as the
    text context resolved it: under the default auto the projector runs clip's own probe, and
    a -fa on/off is the projector's too."""
    from ggmlrun.models.modelfile import read_gguf
    from ggmlrun.models.options.params import ModelOptions
    from ggmlrun.models.reserve import projector_figures

    model, clip = read_gguf(TEXT), DATA / "tiny-mmproj-gemma3-b-q8_0.gguf"
    rpc, cpu = load_backends(RPC)
    no_fa = [dataclasses.replace(rpc, unsupported=frozenset({"flash_attn_ext"})), cpu]
    for fa, mode in ((None, "auto"), (True, "on"), (False, "off")):
        got, _ = projector_figures(model, no_fa, ModelOptions(mmproj=str(clip), flash_attn=fa))
        assert got == measure_projector(read_clip(clip), no_fa, flash_attn=mode)


@pytest.mark.parametrize("spare", [100_000, 400_000, -2_000_000])
def test_llamacpp_fit_keeps_room_for_the_projector(spare):
    """llama-server adds the projector's bytes on each device to that device's --fit-target
    before its fit (mtmd_get_memory_usage): the prediction with --mmproj is the one without it
    at the larger targets, and a device with less spare room than the projector gets fewer
    layers."""
    from ggmlrun.models.fit.llamacpp import FIT_TARGET, llamacpp_fit
    from ggmlrun.models.modelfile import read_gguf
    from ggmlrun.models.options.params import ModelOptions
    from ggmlrun.models.reserve import measure_model, projector_figures

    model, clip = read_gguf(TEXT), str(DATA / "tiny-mmproj-gemma3-b-q8_0.gguf")
    rpc, cpu = load_backends(RPC)
    full = measure_model(model, [rpc, cpu], ModelOptions(ctx=4096)).backends[0]
    used = full.weights_bytes + full.kv_bytes + full.arena_bytes
    dev = dataclasses.replace(rpc, memory=FIT_TARGET + used + spare)
    plain, with_mm = ModelOptions(ctx=4096), ModelOptions(ctx=4096, mmproj=clip)
    projector, _ = projector_figures(model, [dev, cpu], with_mm)
    fit = llamacpp_fit(model, [dev, cpu], with_mm, ctx_auto=False)
    assert fit == llamacpp_fit(model, [dev, cpu], plain, ctx_auto=False,
                               margins=[FIT_TARGET + projector.bytes_on(dev.name)])
    if 0 <= spare < projector.bytes_on(dev.name):
        assert fit.ngl < llamacpp_fit(model, [dev, cpu], plain, ctx_auto=False).ngl


def test_the_projector_is_the_targets_alone():
    """With a draft (-md) the projector is counted once, the target's: the draft brings none,
    and each backend's projector bytes are those without the draft."""
    from ggmlrun.models.draft import draft_options
    from ggmlrun.models.modelfile import read_gguf
    from ggmlrun.models.options.params import ModelOptions
    from ggmlrun.models.reserve import projector_figures

    model = read_gguf(TEXT)
    opts = ModelOptions(mmproj=str(MMPROJ), model_draft=str(TEXT))
    assert projector_figures(model, load_backends(RPC),
                             draft_options(opts, model.hparams)) == (None, None)
    both = _json("measure", "--mmproj", MMPROJ, "-md", TEXT)
    alone = _json("measure", "--mmproj", MMPROJ)
    assert both["mmproj"] == alone["mmproj"] and "mmproj" not in both["draft"]
