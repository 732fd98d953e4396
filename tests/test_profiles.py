"""The device profiles besides `cuda` (SPEC section 3's `profile: metal|vulkan|rpc`; issue 23 item
7): each one's rules as ggmlrun/core/backends/profiles.py reads them from ggml's source, a backends
file naming each, and `profile: rpc` against the RPC recordings.

`metal` and `vulkan` are read from ggml-metal's and ggml-vulkan's source, not measured: no GPU of
those kinds recorded llama.cpp for this project. `rpc` is checked: a `{kind: sim, profile: rpc}`
device gives exactly the figures of graphs/backends/llamacpp_rpc.yaml's RPC0 (alignment 32, no op
offload, written out by hand), which equal llama.cpp's recorded in tests/data/llamacpp/figures.json.
"""

import dataclasses
import json
from pathlib import Path

import pytest

from ggmlrun.core.backends.profiles import PROFILES, apply_profile
from ggmlrun.core.backends.spec import NO_OFFLOAD, BackendSpec
from ggmlrun.core.frontend.backends_file import load_backends
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import InputError
from tests.clikit import invoke
from tests.test_llamacpp_figures import BACKENDS_2_FILE, BACKENDS_FILE, CONFIGS, model_options

REPO = Path(__file__).resolve().parents[1]
GRAPH = REPO / "graphs" / "llama_block.yaml"      # its causal mask is a diag_mask_inf node


def device(profile: str) -> BackendSpec:
    return apply_profile(BackendSpec.of_kind("GPU", "sim"), profile)


def backends_file(tmp_path: Path, entry: str) -> Path:
    f = tmp_path / "b.yaml"
    f.write_text(f"backends:\n  - {{{entry}}}\n  - {{name: CPU, kind: cpu}}\n")
    return f


# ---------------------------------------------------------------- each profile's rules

@pytest.mark.parametrize("profile, alignment", [("cuda", 128), ("metal", 32), ("vulkan", 16),
                                                ("rpc", 32)])
def test_alignment(profile, alignment):
    assert device(profile).alignment == alignment


@pytest.mark.parametrize("profile", ["metal", "vulkan", "rpc"])
def test_no_row_padding_on_a_quantized_tensor(profile):
    """Only ggml-cuda pads quantized rows (MATRIX_ROW_PADDING): a q4_0 tensor of 4096 x 100
    elements (rows not a multiple of 512) takes its ggml_nbytes elsewhere."""
    nbytes = 4096 * TYPES["q4_0"].row_bytes(100)
    assert device(profile).alloc_size("q4_0", (4096, 100), nbytes) == nbytes
    assert device("cuda").alloc_size("q4_0", (4096, 100), nbytes) == \
        nbytes + TYPES["q4_0"].row_bytes(512 - 100)


def test_op_offload_thresholds():
    """cuda and vulkan offload any op from a batch of 32; metal only MUL_MAT; rpc none."""
    for profile in ("cuda", "vulkan", "metal"):
        assert device(profile).offload_min_batch == 32
    assert device("cuda").offload_ops is None and device("vulkan").offload_ops is None
    assert device("metal").offload_ops == frozenset({"mul_mat", "mul_mat_id"})   # ggml-metal
    assert device("rpc").offload_min_batch == NO_OFFLOAD
    assert BackendSpec.of_kind("R", "rpc").offload_min_batch == NO_OFFLOAD


def test_flash_attention_head_sizes():
    metal, vulkan, rpc = (device(p).flash_attn_head_sizes for p in ("metal", "vulkan", "rpc"))
    assert (128, 128) in metal and (192, 128) in metal and (576, 512) in metal
    assert (72, 64) not in metal and (64, 128) not in metal and (136, 136) not in metal
    assert (136, 136) in vulkan and (100, 100) not in vulkan and (64, 60) not in vulkan
    assert rpc is None
    assert not device("metal").supports_op("flash_attn_ext", ("f32", "iq4_nl", "iq4_nl", "f16"))
    assert device("vulkan").supports_op("flash_attn_ext", ("f32", "iq4_nl", "iq4_nl", "f16"))


def plan(tmp_path, profile: str) -> dict[str, tuple[str, str]]:
    """Each node of GRAPH (batch 32, every weight on the CPU): its backend and its cause."""
    f = backends_file(tmp_path, f"name: GPU, kind: sim, profile: {profile}")
    code, out, err = invoke("plan", GRAPH, "--backends", f, "--json")
    assert code == 0, err
    return {n["name"]: (n["backend"], n["cause"]) for n in json.loads(out)["nodes"]}


def test_an_op_metal_lacks_runs_on_the_cpu(tmp_path):
    """ggml-metal has no DIAG_MASK_INF: the mask lands on the CPU, the softmax after it does not."""
    where = plan(tmp_path, "metal")
    assert where["l0.kq_masked"][0] == "CPU" and where["l0.kq_soft"][0] == "GPU"
    assert plan(tmp_path, "vulkan")["l0.kq_masked"][0] == "GPU"


def test_which_ops_are_offloaded(tmp_path):
    """At a batch of 32 with CPU weights: vulkan offloads every op reading one (the norm's MUL
    too), metal only the MUL_MATs, rpc none (all of the graph stays on the CPU)."""
    offloaded = {profile: {name for name, (backend, cause) in plan(tmp_path, profile).items()
                           if cause == "1.off"} for profile in ("vulkan", "metal", "rpc")}
    assert "l0.attn_in" in offloaded["vulkan"] and "l0.q" in offloaded["vulkan"]
    assert "l0.q" in offloaded["metal"] and "l0.attn_in" not in offloaded["metal"]
    assert offloaded["metal"] < offloaded["vulkan"]
    assert offloaded["rpc"] == set()
    assert {backend for backend, _ in plan(tmp_path, "rpc").values()} == {"CPU"}


# ---------------------------------------------------------------- the backends file

def test_each_profile_in_a_backends_file(tmp_path):
    for profile in PROFILES:
        gpu, cpu = load_backends(backends_file(tmp_path, f"name: G, kind: sim, profile: {profile}"))
        assert gpu.profile == profile and cpu.profile is None
        assert all(getattr(gpu, key) == value for key, value in PROFILES[profile].items())
    f = backends_file(tmp_path, "name: G, kind: sim, profile: vulkan, alignment: 64")
    gpu, _ = load_backends(f)
    assert gpu.alignment == 64


def test_an_unknown_profile_is_exit_2_listing_the_four(tmp_path):
    f = backends_file(tmp_path, "name: G, kind: sim, profile: rocm")
    with pytest.raises(InputError, match="unknown profile 'rocm'; known: cuda, metal, vulkan, rpc"):
        load_backends(f)
    code, _, err = invoke("plan", GRAPH, "--backends", f)
    assert code == 2 and "known: cuda, metal, vulkan, rpc" in err


# ---------------------------------------------------------------- rpc against the recordings

PLAIN_RPC = "alignment: 32, memory: 64GiB, offload_min_batch: 1000000000"


@pytest.fixture(scope="module")
def rpc_profile_files(tmp_path_factory):
    """llamacpp_rpc.yaml and llamacpp_rpc2.yaml with each RPC device's hand-written rules
    replaced by `profile: rpc`."""
    out = tmp_path_factory.mktemp("rpc_profile")
    files = {}
    for original in (BACKENDS_FILE, BACKENDS_2_FILE):
        text = original.read_text()
        assert PLAIN_RPC in text
        (out / original.name).write_text(text.replace(PLAIN_RPC, "profile: rpc, memory: 64GiB"))
        files[str(original)] = str(out / original.name)
    return files


def test_the_rpc_profile_is_the_hand_written_rpc_device(rpc_profile_files):
    """Field by field, `profile: rpc` loads as the hand-written RPC devices except its name and
    op-offload threshold, and both thresholds lie above every batch a recorded configuration
    has (no op is offloaded under either): so every recorded figure, which
    test_llamacpp_figures checks against llama.cpp with the hand-written file, holds for the
    profile too."""
    for original, profiled in rpc_profile_files.items():
        for plain, rpc in zip(load_backends(original), load_backends(profiled), strict=True):
            differ = {f.name for f in dataclasses.fields(plain)
                      if getattr(plain, f.name) != getattr(rpc, f.name)}
            if plain.kind == "cpu":
                assert differ == set()
                continue
            assert differ == {"profile", "offload_min_batch"} and rpc.profile == "rpc"
            most = max(max(cfg["options"]["ubatch"], len(cfg.get("tokens", ()))) for cfg in CONFIGS)
            assert min(plain.offload_min_batch, rpc.offload_min_batch) > most


def sample() -> list[dict]:
    """One configuration per model with layers on RPC0, and every one with two RPC devices."""
    first = {}
    for cfg in CONFIGS:
        if cfg["options"]["ngl"] != 0:
            first.setdefault(cfg["model"], cfg)
    return list(first.values()) + [c for c in CONFIGS if c["options"].get("tensor_split")]


@pytest.mark.parametrize("cfg", sample(), ids=lambda cfg: cfg["id"])
def test_the_rpc_profile_gives_the_recorded_rpc_figures(cfg, rpc_profile_files):
    """The argument above, checked end to end on a sample: the same measure, byte for byte."""
    args = [str(a) for a in model_options(cfg)]
    plain = args.index("--backends") + 1
    model = REPO / "examples" / "models" / cfg["model"]
    code, want, err = invoke("measure", model, "--json", *args)
    assert code == 0, err
    args[plain] = rpc_profile_files[args[plain]]
    code, got, err = invoke("measure", model, "--json", *args)
    assert code == 0, err
    assert json.loads(got) == json.loads(want)
