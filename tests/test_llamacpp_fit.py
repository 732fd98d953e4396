"""ggmlrun's prediction of llama.cpp's own --fit (models/fit/llamacpp.py) against llama.cpp's
common_fit_params, recorded by scripts/llamacpp/record_fit_params.py on the tiny models (dense,
SWA, hybrid, MoE; one and two RPC devices whose reported memory a shim sets; the CPU alone)
into tests/data/llamacpp/fit_params.json: the context, -ngl, -ts and -ot rules it picks, or
its refusal."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.models.fit.llamacpp import llamacpp_fit
from ggmlrun.models.modelfile import read_gguf
from ggmlrun.models.options.params import ModelOptions

REPO = Path(__file__).resolve().parents[1]
RECORDED = json.loads((REPO / "tests/data/llamacpp/fit_params.json").read_text())
CASES = RECORDED["cases"]
BACKENDS = load_backends(REPO / "graphs" / "backends" / "llamacpp_rpc2.yaml")


def predict(case: dict):
    o = case["options"]
    model = read_gguf(REPO / "examples" / "models" / f"{case['model']}.gguf")
    devices = [replace(b, memory=size) for b, size in zip(BACKENDS[:2], case["devices"])]
    cpu = BACKENDS[2]
    if case["cpu_bytes"] is not None:
        cpu = replace(cpu, memory=case["cpu_bytes"])
    overrides = tuple(tuple(rule.rsplit("=", 1)) for rule in o.get("ot", []))
    opts = ModelOptions(ctx=o.get("ctx"), flash_attn=o.get("flash_attn") == "on",
                        parallel=o.get("parallel", 1), kv_unified=o.get("kv_unified", False),
                        tensor_split=tuple(o["ts"]) if "ts" in o else None,
                        overrides=overrides, n_cpu_moe=o.get("n_cpu_moe", 0))
    return model, llamacpp_fit(model, devices + [cpu], opts, ctx_auto="ctx" not in o,
                               user_ngl=o.get("ngl"), fit_ctx=o.get("fit_ctx", 4096),
                               split_mode=o.get("split_mode", "layer"))


def printed_split(split):
    """-ts as llama-fit-params prints it: trailing zeros dropped, nothing for one device left
    (llama-server itself keeps the zeros: 2,0 puts every layer on the first device)."""
    split = list(split or [])
    while len(split) > 1 and split[-1] == 0:
        split.pop()
    return split if len(split) > 1 else None


def case_id(case: dict) -> str:
    sizes = ",".join(f"{(d - 2**30) / 2**20:.1f}" for d in case["devices"]) or "cpu"
    extra = ",".join(f"{k}={v}" for k, v in case["options"].items() if k != "flash_attn")
    return f"{case['model']}[{sizes}]{extra}"


# A known gap in the bytes the steps are taken on, not in the steps: with -np 2 and a KV stream
# per sequence at -c 512 (256 cells a stream, under the 512-token ubatch) llama.cpp reserves
# 3.51 MiB of compute buffer on the device where ggmlrun's measure gives 1.75 MiB, so llama.cpp
# shortens the context to 512 and the prediction to 1024.
GAPS = {"tiny-qwen3moe-f16[6.8]fit_ctx=256,parallel=2"}


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="known gap (GAPS)"))
    if case_id(c) in GAPS else c for c in CASES], ids=case_id)
def test_prediction_equals_llamacpp(case):
    model, got = predict(case)
    if case["refused"] is not None:
        assert got.refused == case["refused"]
        return
    assert got.refused is None
    all_layers = model.hparams.n_layer_all + 1
    assert (got.ctx, got.ngl) == (case["ctx"], all_layers if case["ngl"] == -1 else case["ngl"])
    assert printed_split(got.tensor_split) == case["tensor_split"]
    assert got.override_tensor == case["override_tensor"]


def test_the_recording_reaches_every_step():
    """Layers lowered, the context shortened, experts moved (to the CPU and to the next
    device), a split written, no change at all, and each refusal."""
    answers = [c for c in CASES if c["refused"] is None]
    assert any(c["ngl"] not in (-1,) for c in answers)
    assert any(c["ngl"] == -1 for c in answers)
    assert any(c["ctx"] < 2048 for c in answers if "ctx" not in c["options"])
    assert any(c["tensor_split"] for c in answers)
    assert any(r.endswith("=CPU") for c in answers for r in c["override_tensor"])
    refusals = {c["refused"] for c in CASES if c["refused"]}
    assert len(refusals) >= 5


def test_row_split_over_two_devices_is_refused():
    """-sm row: llama.cpp refuses to move weights (RPC devices have no split buffers, so this
    one is not recorded)."""
    case = {"model": "tiny-llama-f16", "devices": [2**30 + 2**20] * 2, "cpu_bytes": None,
            "options": {"split_mode": "row", "flash_attn": "on"}}
    _, got = predict(case)
    assert got.refused == ("changing weight allocation for LLAMA_SPLIT_MODE_ROW not "
                           "implemented, abort")


def test_fit_target_and_fit_ctx_are_read_in_llamacpps_spellings():
    from ggmlrun.models.options.command_line import parse_llama_args

    got = parse_llama_args("-c 100 -fitt 512/256 --fit-ctx 1024")
    assert (got["fit_target"], got["fit_ctx"]) == ((512, 256), 1024)
    assert parse_llama_args("--fit-target 2048")["fit_target"] == (2048,)


def test_fit_prints_and_reports_llamacpps_pick(tmp_path):
    """`fit --json` carries `llamacpp_fit` (as the prediction's own answer, with --fit-target in
    MiB and --fit-ctx reaching it); the text says it beside ggmlrun's answer; a bad
    --fit-target is exit 2."""
    from tests.clikit import invoke

    model = REPO / "examples" / "models" / "tiny-qwen3moe-f16.gguf"
    two = tmp_path / "two.yaml"
    two.write_text("backends:\n"
                   "  - {name: GPU0, kind: sim, alignment: 32, memory: 1078000000}\n"
                   "  - {name: GPU1, kind: sim, alignment: 32, memory: 1078000000}\n"
                   "  - {name: CPU, kind: cpu, alignment: 32, threads: 2, memory: 8GiB}\n")
    code, out, _ = invoke("fit", model, "--backends", two, "--flash-attn", "on", "--json",
                          "--fit-target", "1020", "--fit-ctx", "512")
    got = json.loads(out)["llamacpp_fit"]
    m = read_gguf(model)
    backends = load_backends(two)
    want = llamacpp_fit(m, backends, ModelOptions(flash_attn=True), ctx_auto=True, fit_ctx=512,
                        margins=[1020 * 2**20] * 2).as_dict()
    assert (code, set(got)) == (0, {"ctx", "ngl", "override_tensor", "tensor_split", "refused"})
    assert got == want
    code, out, _ = invoke("fit", model, "--backends", two, "--flash-attn", "on")
    assert code == 0 and "llama-server would pick: -c " in out and "ggmlrun's answer" in out
    code, _, err = invoke("fit", model, "--backends", two, "--fit-target", "1,2,3")
    assert code == 2 and "--fit-target" in err
