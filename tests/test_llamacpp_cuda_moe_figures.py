"""Mixtures of experts on a real NVIDIA GPU (issue 21 item 2): experts left on the CPU under
ggml-cuda's op offload, and ggmlrun's `cuda` device profile against them.

tests/data/llamacpp/figures_cuda_moe.json was recorded by `scripts/llamacpp/record_cuda.py --moe`
on one NVIDIA H200 (llama-cpp-python 0.3.36's llama.cpp, CUDA 13.0, sm_90): the 14 tiny MoE files
(qwen3moe, glm4moe, gemma4moe, qwen35moe, deepseek2, gpt-oss) with -ot exps=CPU, --cpu-moe and
--n-cpu-moe N beside offloaded layers (ubatch 32 and 512: op offload takes their MUL_MAT_ID to the
GPU), their other single-device extras and the ctx-256 grid, 257 configurations.
figures_cuda_moe_nofusion.json is the same run with GGML_CUDA_DISABLE_FUSION=1.

What they showed (docs/models.md, "CUDA: mixtures of experts"):
- beside a CUDA device no CPU weight is repacked (the `cuda` profile's host_buffer rule);
- ggml-cuda's graph_optimize adds allocation dependencies for the fusions it will make (the MoE
  top-k router, the weighted sum of the experts): they keep tensors alive longer and change the
  GPU's compute buffer in 155 of 257 configurations. The `cuda` profile models them
  (ggmlrun/core/sched/fusion_deps.py; `fusion: false` in a backends file leaves them out), and
  ggmlrun is exact in all 257 configurations of each recording. The last 14 (gpt-oss under
  flash attention, its MXFP4 experts op-offloaded) needed ADD_ID, the expert biases, to take
  its source's memory in place, as ggml_op_can_inplace allows.
"""

import json
from pathlib import Path

import pytest

from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.core.util.errors import InputError
from tests.clikit import invoke
from tests.test_llamacpp_figures import compare_measure, counted_once, model_options

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "llamacpp"
FUSED = json.loads((DATA / "figures_cuda_moe.json").read_text())
UNFUSED = json.loads((DATA / "figures_cuda_moe_nofusion.json").read_text())
RPC = {cfg["id"]: cfg for cfg in json.loads((DATA / "figures.json").read_text())["configs"]}
BY_ID = {cfg["id"]: cfg for cfg in FUSED["configs"]}
UNFUSED_BY_ID = {cfg["id"]: cfg for cfg in UNFUSED["configs"]}
IDS = list(BY_ID)
CUDA_BACKENDS = REPO / "graphs" / "backends" / "llamacpp_cuda.yaml"
NOFUSION_BACKENDS = REPO / "graphs" / "backends" / "llamacpp_cuda_nofusion.yaml"
# the 14 configurations ggmlrun missed until ADD_ID (gpt-oss's expert biases) took its source's
# memory in place as ggml's allocator does (ggml_op_can_inplace): run by default in both tests
ADD_ID_IN_PLACE = {"tiny-gpt-oss-f16/c256/ub32/fa1/nglall/ot-exps-cpu",
                   "tiny-gpt-oss-f16/c1024/ub32/fa1/nglall/n-cpu-moe3",
                   "tiny-gpt-oss-q8_0/c256/ub32/fa1/nglall/ot-exps-cpu",
                   "tiny-gpt-oss-q8_0/c1024/ub32/fa1/nglall/n-cpu-moe3",
                   "tiny-gpt-oss-mxfp4/c256/ub32/fa0/nglall/ot-exps-cpu",
                   "tiny-gpt-oss-mxfp4/c256/ub32/fa1/nglall/ot-exps-cpu",
                   "tiny-gpt-oss-mxfp4/c256/ub32/fa0/nglall/n-cpu-moe1",
                   "tiny-gpt-oss-mxfp4/c1024/ub32/fa1/nglall/n-cpu-moe3",
                   "tiny-gpt-oss-f16/c256/ub32/fa1/ngl0", "tiny-gpt-oss-f16/c256/ub32/fa1/ngl2",
                   "tiny-gpt-oss-f16/c256/ub512/fa1/ngl0", "tiny-gpt-oss-f16/c256/ub512/fa1/ngl2",
                   "tiny-gpt-oss-q8_0/c256/ub32/fa1/ngl0", "tiny-gpt-oss-q8_0/c256/ub32/fa1/ngl2"}


def experts_on_cpu(opts: dict) -> bool:
    return bool(opts.get("cpu_moe") or opts.get("n_cpu_moe")
                or any("exps" in pattern for pattern, _ in opts["overrides"]))


def fusion_changed(cid: str) -> bool:
    """Whether ggml-cuda's fusion dependencies changed this configuration's GPU compute buffer."""
    return (BY_ID[cid]["backends"]["CUDA0"]["arena_bytes"]
            != UNFUSED_BY_ID[cid]["backends"]["CUDA0"]["arena_bytes"])


def measure_cuda(cfg: dict, backends: Path = CUDA_BACKENDS) -> dict:
    args = model_options(cfg)
    args[args.index("--backends") + 1] = str(backends)
    code, out, err = invoke("measure", REPO / "examples" / "models" / cfg["model"], "--json", *args)
    assert code == 0, err
    return json.loads(out)


# ---------------------------------------------------------------- the files against themselves

def test_the_recordings_say_where_they_were_made():
    for data in (FUSED, UNFUSED):
        assert data["gpu"].startswith("NVIDIA") and data["compute_capability"]
        assert (data["llama_cpp_python"], data["ggml"]) == ("0.3.36", "0.25.3")
        assert data["cuda_runtime"] >= 12000 and "GGML_CUDA=ON" in data["build"]
        assert not data["failed"] and len(data["configs"]) == 257
    assert not FUSED.get("env") and UNFUSED["env"] == {"GGML_CUDA_DISABLE_FUSION": "1"}
    assert list(UNFUSED_BY_ID) == IDS and len(set(IDS)) == len(IDS)
    assert set(IDS) <= set(RPC)                      # the same configurations as figures.json
    assert sum(experts_on_cpu(cfg["options"]) for cfg in FUSED["configs"]) >= 60


def test_each_configuration_is_consistent():
    """Every buffer counted once, CUDA0's aligned to 128, the same graph as the RPC recording;
    no CPU buffer but the mapped file, pinned host memory and the CPU's own (nothing repacked
    beside a CUDA device); experts on the CPU leave every expert tensor's bytes there."""
    tensors = FUSED["probe"]["model_tensors"]
    for cfg in FUSED["configs"]:
        backends, opts = cfg["backends"], cfg["options"]
        assert set(backends) == {"CUDA0", "CPU"}, cfg["id"]
        assert counted_once(cfg), cfg["id"]
        names = {name for _, name, _ in cfg["buffers"]}
        assert names <= {"CPU_Mapped", "CUDA_Host", "CPU", "CUDA0"}
        assert all(n % 128 == 0 for _, name, n in cfg["buffers"] if name == "CUDA0")
        assert cfg["n_nodes"] == RPC[cfg["id"]]["n_nodes"], cfg["id"]
        if experts_on_cpu(opts) and opts["ngl"] == "all" and not opts.get("n_cpu_moe"):
            exps = sum(row[3] for row in tensors[cfg["model"]] if "_exps" in row[0])
            assert backends["CPU"]["weights_bytes"] >= exps, cfg["id"]


def test_fusion_changes_the_gpu_compute_buffer_only():
    """GGML_CUDA_DISABLE_FUSION changes nothing but CUDA0's compute buffer (in 155 of 257)."""
    changed = 0
    for cid in IDS:
        fused, unfused = BY_ID[cid], UNFUSED_BY_ID[cid]
        assert fused["buffers"] == unfused["buffers"], cid
        assert (fused["n_nodes"], fused["n_splits"]) == (unfused["n_nodes"], unfused["n_splits"])
        assert fused["backends"]["CPU"] == unfused["backends"]["CPU"], cid
        changed += fusion_changed(cid)
    assert changed == 155


def test_the_logits_agree_with_the_cpu_recording():
    """Measured: at most 2.0e-3 of the largest logit for f16 weights, 4.3e-2 for q8_0/MXFP4
    (ggml-cuda quantizes activations to q8_1, and the router's top-k can turn on it)."""
    for cfg in FUSED["configs"] + UNFUSED["configs"]:
        want = RPC[cfg["id"]]["logits"]
        worst = max(abs(a - b) for a, b in zip(cfg["logits"], want)) / max(abs(v) for v in want)
        quantized = "q8_0" in cfg["model"] or "mxfp4" in cfg["model"]
        assert worst < (5e-2 if quantized else 3e-3), cfg["id"]


def test_op_offload_of_the_expert_ops():
    """ggml-cuda's get_op_batch_size: MUL_MAT_ID's ne[2] (tokens), ADD_ID's rows (tokens x
    experts used: 2 x 31 = 62 offloads); on f16, q8_0 and MXFP4 experts alike."""
    rows = [r for r in FUSED["probe"]["offload_op"] if r["op"] in ("MUL_MAT_ID", "ADD_ID")]
    assert len(rows) == 24 and all(r["supported"] for r in rows)
    for r in rows:
        batch = r["batch"] if r["op"] == "MUL_MAT_ID" else 2 * r["batch"]
        assert r["offload"] == (batch >= 32), r


# ---------------------------------------------------------------- against ggmlrun

@pytest.mark.parametrize("cid", IDS)
def test_every_figure_equals_ggmlrun_cuda_profile(cid):
    """Splits, nodes and every buffer on both backends, exactly, with `profile: cuda` (its
    fusion dependencies included) against llama.cpp as it runs by default (all 257)."""
    diffs = compare_measure(BY_ID[cid], measure_cuda(BY_ID[cid]))
    assert not diffs, "\n".join(diffs)


def quick_or_slow(cid: str, k: int):
    """Every fourth configuration and ADD_ID_IN_PLACE by default, all with -m slow (the
    suite's time)."""
    quick = k % 4 == 0 or cid in ADD_ID_IN_PLACE
    return cid if quick else pytest.param(cid, marks=pytest.mark.slow)


@pytest.mark.parametrize("cid", [quick_or_slow(cid, k) for k, cid in enumerate(IDS)])
def test_every_figure_equals_ggmlrun_without_fusion(cid):
    """The same against llama.cpp with GGML_CUDA_DISABLE_FUSION=1, with `fusion: false`
    (every fourth configuration and ADD_ID_IN_PLACE by default, all 257 with -m slow)."""
    cfg = UNFUSED_BY_ID[cid]
    diffs = compare_measure(cfg, measure_cuda(cfg, NOFUSION_BACKENDS))
    assert not diffs, "\n".join(diffs)


@pytest.mark.parametrize("cid", [cid for cid in IDS if fusion_changed(cid)][:6])
def test_the_fusion_dependencies_are_what_changes(cid):
    """Where fusion changed llama.cpp's compute buffer, the profile without its fusion rule
    misses the default recording: the rule is what makes these exact (a few of the 155)."""
    assert compare_measure(BY_ID[cid], measure_cuda(BY_ID[cid], NOFUSION_BACKENDS))


@pytest.mark.parametrize("cid,off_by", [("tiny-gpt-oss-f16/c256/ub32/fa1/ngl2", 18432),
                                        ("tiny-gpt-oss-mxfp4/c256/ub32/fa0/nglall/ot-exps-cpu",
                                         -1280)])
def test_add_id_in_place_is_what_made_gpt_oss_exact(cid, off_by, monkeypatch):
    """With ADD_ID kept out of place (as ggmlrun had it), these miss CUDA0's compute buffer
    (18,432 bytes over, 1,280 under) and nothing else: that one allocator rule is the cause."""
    import dataclasses

    from ggmlrun.core.ir.ops import OPS

    monkeypatch.setitem(OPS, "add_id", dataclasses.replace(OPS["add_id"], inplace=False))
    measured = measure_cuda(BY_ID[cid])
    assert [d.split(":")[0] for d in compare_measure(BY_ID[cid], measured)] == ["CUDA0.arena_bytes"]
    cuda0 = next(b for b in measured["backends"] if b["name"] == "CUDA0")
    assert cuda0["arena_bytes"] - BY_ID[cid]["backends"]["CUDA0"]["arena_bytes"] == off_by


def test_the_fusion_key(tmp_path):
    """`fusion: false` turns the profile's rule off; it is a boolean, and `true` needs the
    cuda profile (no other device fuses these ops)."""
    assert [b.fusion_alloc_deps for b in load_backends(CUDA_BACKENDS)] == [True, False]
    assert [b.fusion_alloc_deps for b in load_backends(NOFUSION_BACKENDS)] == [False, False]
    f = tmp_path / "b.yaml"
    for entry, said in (("{name: G, kind: sim, profile: cuda, fusion: 0}", "must be true or false"),
                        ("{name: G, kind: sim, fusion: true}", "needs profile: cuda"),
                        ("{name: G, kind: sim, profile: metal, fusion: true}", "needs profile")):
        f.write_text(f"backends:\n  - {entry}\n  - {{name: CPU, kind: cpu}}\n")
        with pytest.raises(InputError, match=said):
            load_backends(f)
