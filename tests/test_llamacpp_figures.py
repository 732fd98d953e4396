"""ggmlrun against real llama.cpp's own figures for the bundled tiny models (issue 9 item 7).

tests/data/llamacpp/figures.json was recorded by scripts/llamacpp/record.py from llama.cpp
(llama-cpp-python 0.3.36, ggml 0.25.3) with an RPC device standing for a GPU; the backends file
graphs/backends/llamacpp_rpc.yaml describes that same pair. Every recorded configuration must
give llama.cpp's bytes exactly (model, KV and compute buffer per backend), its node and split
counts, and its last-token logits within SPEC section 5's tolerance.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.clikit import invoke

REPO = Path(__file__).resolve().parents[1]
FIGURES_FILE = REPO / "tests" / "data" / "llamacpp" / "figures.json"
MODELS_DIR = REPO / "examples" / "models"
BACKENDS_FILE = REPO / "graphs" / "backends" / "llamacpp_rpc.yaml"
BACKENDS_2_FILE = REPO / "graphs" / "backends" / "llamacpp_rpc2.yaml"   # -ts A,B: RPC0, RPC1
FIGURES = json.loads(FIGURES_FILE.read_text())
CONFIGS = FIGURES["configs"]
IDS = [cfg["id"] for cfg in CONFIGS]
QUANTIZED = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "_K", "mxfp4")
# every bundled tiny model, each recorded on the whole grid: the llama ones, then one f16 and one
# q8_0 file per further architecture
GRID_MODELS = ("tiny-llama-f32", "tiny-llama-f16", "tiny-llama-q8_0", "tiny-llama-tied-f16",
               "tiny-qwen2-f16", "tiny-qwen2-q8_0", "tiny-qwen3-f16", "tiny-qwen3-q8_0",
               "tiny-mistral3-f16", "tiny-mistral3-q8_0", "tiny-phi3-f16", "tiny-phi3-q8_0",
               "tiny-gemma3-f16", "tiny-gemma3-q8_0", "tiny-gemma4-f16", "tiny-gemma4-q8_0",
               "tiny-qwen3moe-f16", "tiny-qwen3moe-q8_0", "tiny-glm4moe-f16", "tiny-glm4moe-q8_0",
               "tiny-qwen35-f16", "tiny-qwen35-q8_0", "tiny-gemma4moe-f16", "tiny-gemma4moe-q8_0",
               "tiny-qwen35moe-f16", "tiny-qwen35moe-q8_0",
               "tiny-deepseek2-f16", "tiny-deepseek2-q8_0", "tiny-deepseek2-lite-f16",
               "tiny-qwen3vl-f16", "tiny-qwen3vl-q8_0", "tiny-qwen3vlmoe-f16",
               "tiny-qwen3vlmoe-q8_0", "tiny-lfm2-f16", "tiny-lfm2-q8_0", "tiny-lfm2moe-f16",
               "tiny-lfm2moe-q8_0")
# the sliding-window ones, recorded on the grid again with --swa-full
SWA_MODELS = ("tiny-gemma3-f16", "tiny-gemma3-q8_0", "tiny-gemma4-f16", "tiny-gemma4-q8_0",
              "tiny-gemma4moe-f16", "tiny-gemma4moe-q8_0")
# gpt-oss: f16, q8_0, and ggml-org's mix (MXFP4 experts, q8_0 matrices); sliding layers too
GPT_OSS_MODELS = ("tiny-gpt-oss-f16", "tiny-gpt-oss-q8_0", "tiny-gpt-oss-mxfp4")
GRID_MODELS += GPT_OSS_MODELS
# the Mamba-2 hybrids
MAMBA2_MODELS = ("tiny-nemotronh-f16", "tiny-nemotronh-q8_0", "tiny-nemotronhmoe-f16",
                 "tiny-nemotronhmoe-q8_0", "tiny-granitehybrid-f16", "tiny-granitehybrid-q8_0")
GRID_MODELS += MAMBA2_MODELS
SWA_MODELS += GPT_OSS_MODELS
# wave 2b (issue 32): MiniMax-M2, ...
WAVE2B_MODELS = ("tiny-minimaxm2-f16", "tiny-minimaxm2-q8_0", "tiny-llama4-f16",
                 "tiny-llama4-q8_0", "tiny-seedoss-f16", "tiny-seedoss-q8_0", "tiny-olmo2-f16",
                 "tiny-olmo2-q8_0", "tiny-smollm3-f16", "tiny-smollm3-q8_0", "tiny-olmo3-f16")
GRID_MODELS += WAVE2B_MODELS
SWA_MODELS += ("tiny-olmo3-f16",)     # OLMo 3: olmo2's graph with sliding layers
GRID_MODELS += ("tiny-qwen3next-f16", "tiny-qwen3next-q8_0")
GRID_MODELS += ("tiny-mistral4-f16", "tiny-mistral4-q8_0")


def model_options(cfg: dict, backends: tuple = (BACKENDS_FILE, BACKENDS_2_FILE)) -> list[str]:
    """The ggmlrun options that mean what llama.cpp was given for this configuration;
    `backends`: the files for one device and for two (-ts)."""
    opts = cfg["options"]
    split = opts.get("tensor_split", [])
    args = ["--backends", str(backends[1] if split else backends[0]), "--ctx", str(opts["ctx"]),
            "--ubatch", str(opts["ubatch"]), "--flash-attn", "on" if opts["flash_attn"] else "off",
            "--ngl", str(opts["ngl"]), "--kv-type", opts["kv_type"]]
    if split:
        args += ["--tensor-split", ",".join(map(str, split))]
    if opts["no_kv_offload"]:
        args.append("--no-kv-offload")
    if not opts.get("use_mmap", True):
        args.append("--no-mmap")
    if opts.get("swa_full"):
        args.append("--swa-full")
    for pattern, backend in opts["overrides"]:
        args += ["--override-tensor", f"{pattern}={backend}"]
    if opts.get("cpu_moe"):
        args.append("--cpu-moe")
    if opts.get("n_cpu_moe"):
        args += ["--n-cpu-moe", str(opts["n_cpu_moe"])]
    args += ["--parallel", str(opts.get("parallel", 1))]   # recorded with n_seq_max 1 by default
    if opts.get("kv_unified"):
        args.append("--kv-unified")
    return args


def model_path(cfg: dict) -> Path:
    return MODELS_DIR / cfg["model"]


def logits_tolerance(cfg: dict) -> float:
    """SPEC section 5: 2e-3 of the largest logit for float weights, 2e-2 for quantized ones."""
    return 2e-2 if any(q in cfg["model"] for q in QUANTIZED) else 2e-3


def measured(cfg: dict) -> dict:
    code, out, err = invoke("measure", model_path(cfg), "--json", *model_options(cfg))
    assert code == 0, err
    return json.loads(out)


def compare_measure(cfg: dict, got: dict) -> list[str]:
    """Every difference from llama.cpp's figures, as readable lines (empty when equal)."""
    diffs = [f"{key}: ggmlrun {got.get(key)} llama.cpp {cfg[key]}"
             for key in ("n_nodes", "n_splits") if got.get(key) != cfg[key]]
    by_name = {b["name"]: b for b in got["backends"]}
    for name, want in cfg["backends"].items():
        have = by_name.get(name)
        if have is None:
            diffs.append(f"{name}: missing from ggmlrun's backends {sorted(by_name)}")
            continue
        diffs += [f"{name}.{key}: ggmlrun {have.get(key)} llama.cpp {value}"
                  for key, value in want.items() if have.get(key) != value]
    return diffs


def run_logits(cfg: dict, out_file: Path) -> np.ndarray:
    tokens = ",".join(str(t) for t in cfg.get("tokens", FIGURES["tokens"]))   # long prompts, two ubatches
    code, out, err = invoke("run", model_path(cfg), "--tokens", tokens, "--json", "--out", out_file,
                            *model_options(cfg))
    assert code == 0, err
    summary = json.loads(out)["outputs"]["result_output"]
    assert summary["shape"] == [1, len(cfg["logits"])]
    with np.load(out_file, allow_pickle=False) as outputs:
        return outputs["result_output"]


def compare_logits(cfg: dict, logits: np.ndarray) -> float:
    """The largest difference from llama.cpp's logits, relative to its largest logit."""
    want = np.asarray(cfg["logits"], dtype=np.float64)
    got = np.asarray(logits, dtype=np.float64).reshape(want.shape)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def test_the_recording_covers_the_whole_grid():
    """A recording cut short would silently test less: every model x ctx x ubatch x fa x ngl
    (the extras beyond the grid, other ngl values, -nkvo, -ctk f32 and -ot, come on top)."""
    grid = {(m, c, u, fa, str(n)) for m in GRID_MODELS
            for c in (256, 1024) for u in (32, 512) for fa in (False, True) for n in (0, 2, "all")}
    plain = [cfg["options"] | {"model": cfg["model"]} for cfg in CONFIGS
             if not cfg["options"]["no_kv_offload"] and cfg["options"]["kv_type"] == "f16"
             and not cfg["options"]["overrides"] and not cfg["options"].get("n_cpu_moe")
             and not cfg["options"].get("cpu_moe")]
    seen = {(o["model"].removesuffix(".gguf"), o["ctx"], o["ubatch"], o["flash_attn"], str(o["ngl"]))
            for o in plain if not o.get("swa_full")}
    assert grid <= seen
    swa_grid = {g for g in grid if g[0] in SWA_MODELS}
    assert swa_grid <= {(o["model"].removesuffix(".gguf"), o["ctx"], o["ubatch"], o["flash_attn"],
                         str(o["ngl"])) for o in plain if o.get("swa_full")}
    assert {cfg["model"].removesuffix(".gguf") for cfg in CONFIGS} == set(GRID_MODELS)
    assert (FIGURES["llama_cpp_python"], FIGURES["ggml"]) == ("0.3.36", "0.25.3")
    assert all(set(cfg["backends"]) == ({"RPC0", "RPC1", "CPU"} if "tensor_split" in cfg["options"]
                                        else {"RPC0", "CPU"}) for cfg in CONFIGS)


def counted_once(cfg: dict) -> bool:
    """Every buffer llama.cpp allocated is one of the figures compared: weights, KV cache and
    recurrent state per backend, and the output buffer (so the comparison leaves no byte out)."""
    return sum(nbytes for _, _, nbytes in cfg["buffers"]) == cfg["output_buffer_bytes"] + sum(
        b["weights_bytes"] + b["kv_bytes"] + b.get("state_bytes", 0)
        for b in cfg["backends"].values())


def test_every_allocated_buffer_is_counted_once():
    assert [cfg["id"] for cfg in CONFIGS if not counted_once(cfg)] == []


def test_bundled_models_are_what_the_script_makes(tmp_path):
    """The figures hold only for these exact bytes: the script must still produce them."""
    script = REPO / "scripts" / "llamacpp" / "make_tiny_gguf.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    made = sorted(p.name for p in tmp_path.glob("*.gguf"))
    assert made == sorted({cfg["model"] for cfg in CONFIGS})
    for name in made:
        assert (tmp_path / name).read_bytes() == (MODELS_DIR / name).read_bytes(), name


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_measure_equals_llamacpp(cfg):
    got = measured(cfg)
    assert compare_measure(cfg, got) == []
    # pipeline parallelism: llama.cpp logged it exactly where ggmlrun keeps 4 copies
    assert got["n_copies"] == (4 if cfg.get("pipeline_parallel") else 1)


# where tensors live: never the numbers (tests/test_plan_properties.py, and per model below)
PLACEMENT = ("ngl", "tensor_split", "overrides", "no_kv_offload", "cpu_moe", "n_cpu_moe",
             "use_mmap")


def prompt(cfg: dict) -> list[int]:
    return cfg.get("tokens", FIGURES["tokens"])


def outcome_key(cfg: dict) -> str:
    """What a run's numbers can depend on: the model, the prompt and every option but placement;
    --ubatch only when the prompt spans more than one ubatch (one that fits is one graph of the
    prompt's own length, whatever the ubatch)."""
    opts = {k: v for k, v in cfg["options"].items() if k not in PLACEMENT}
    if len(prompt(cfg)) <= opts["ubatch"]:
        del opts["ubatch"]
    return json.dumps([cfg["model"], prompt(cfg), opts], sort_keys=True)


def outcomes() -> list[list[dict]]:
    """The recorded configurations by outcome_key, each group led by its most spread placement
    (two devices, overrides, -nkvo first), so the runs below cover many placements."""
    groups: dict[str, list[dict]] = {}
    for cfg in CONFIGS:
        groups.setdefault(outcome_key(cfg), []).append(cfg)
    spread = lambda cfg: -sum(bool(cfg["options"].get(k)) for k in PLACEMENT[1:])  # noqa: E731
    return [sorted(group, key=spread) for group in groups.values()]


OUTCOMES = outcomes()


@pytest.mark.parametrize("group", OUTCOMES, ids=[group[0]["id"] for group in OUTCOMES])
def test_run_logits_equal_llamacpp(group, tmp_path):
    """One run per distinct outcome, within tolerance of every configuration recorded with it."""
    logits = run_logits(group[0], tmp_path / "out.npz")
    for cfg in group:
        error = compare_logits(cfg, logits)
        assert error <= logits_tolerance(cfg), f"{cfg['id']}: logits differ by {error:.2e}"


def placement_pairs() -> list[tuple[dict, dict]]:
    """Per model, its largest group's leader and the member placed least like it."""
    pairs = {}
    for group in OUTCOMES:
        model = group[0]["model"]
        if len(group) > 1 and len(group) > len(pairs.get(model, ())):
            pairs[model] = group

    def distance(a, b):      # a different -ngl moves the most
        return sum((2 if k == "ngl" else 1) * (a["options"].get(k) != b["options"].get(k))
                   for k in PLACEMENT)
    return [(g[0], max(g[1:], key=lambda c: distance(g[0], c))) for g in pairs.values()]


@pytest.mark.parametrize("pair", placement_pairs(), ids=lambda p: f"{p[0]['id']}~{p[1]['id']}")
def test_placement_never_changes_a_models_logits(pair, tmp_path):
    """What lets one run stand for its group, on every bundled model: the same bits."""
    a, b = (run_logits(cfg, tmp_path / f"{k}.npz") for k, cfg in enumerate(pair))
    assert np.array_equal(a, b)
