"""ggmlrun against llama.cpp's host-memory figures of issue 23, recorded on this machine's CPU
(x86 with AVX-512) by scripts/llamacpp/record_devices.py into
tests/data/llamacpp/figures_devices.json:

- ggml 0.25.3's allocator places every leaf in the graph's own leaf order first: 1-layer f16
  models whose CPU compute buffer peaks after the graph inputs are freed (0.15.3's first-use
  order gives 32,768-262,144 bytes more there);
- the CPU's repacked weights: a q4_0 model's matrices kept on the CPU go to CPU_REPACK while
  the mapped file range (first to last CPU tensor left in the map) stays; --no-mmap allocates
  the rest instead; and a Q4_K_M file made by llama.cpp's quantizer (q4_K matrices repacked,
  q6_K ones not, on x86).
- -np N (n_seq_max) with one unified cache (-kvu) or a KV stream per sequence, and the output
  (logits) buffer of n_vocab floats per sequence.
The models are seeded and small: make_tiny_gguf.py writes them again here.
"""

import json
import sys
from pathlib import Path

import pytest

from tests.clikit import invoke

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts" / "llamacpp")]
FIGURES = json.loads((REPO / "tests/data/llamacpp/figures_devices.json").read_text())
BACKENDS_FILE = REPO / "graphs" / "backends" / "llamacpp_rpc.yaml"
CONFIGS = FIGURES["configs"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import make_tiny_gguf as mk
    import record_devices as rd

    out = tmp_path_factory.mktemp("devices")
    for m in rd.MODELS.values():
        mk.write_model(m, out)
    return out


def path_of(cfg: dict, model_dir: Path) -> Path:
    """The seeded models are written again; the Q4_K_M one (llama.cpp's quantizer made it) is
    committed beside the figures."""
    committed = REPO / "tests" / "data" / "llamacpp" / cfg["model"]
    return committed if committed.exists() else model_dir / cfg["model"]


def options(cfg: dict) -> list[str]:
    o = cfg["options"]
    args = ["--backends", str(BACKENDS_FILE), "--ctx", str(o["ctx"]), "--ubatch", str(o["ubatch"]),
            "--flash-attn", "on" if o["flash_attn"] else "off", "--ngl", str(o["ngl"])]
    if not o.get("use_mmap", True):
        args.append("--no-mmap")
    args += ["--parallel", str(o.get("parallel", 1))]   # recorded with n_seq_max 1 by default
    if o.get("kv_unified"):
        args.append("--kv-unified")
    for pattern, backend in o["overrides"]:
        args += ["--override-tensor", f"{pattern}={backend}"]
    return args


def test_recorded_on_an_avx512_cpu():
    """llamacpp_rpc.yaml's `repack: avx512` is the recording CPU's."""
    assert "avx512f" in FIGURES["cpu_flags"]
    assert "repack: avx512" in BACKENDS_FILE.read_text()


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c["id"] for c in CONFIGS])
def test_measure_equals_llamacpp(cfg, model_dir):
    code, out, err = invoke("measure", path_of(cfg, model_dir), "--json", *options(cfg))
    assert code == 0, err
    got = json.loads(out)
    assert (got["n_nodes"], got["n_splits"]) == (cfg["n_nodes"], cfg["n_splits"])
    by = {b["name"]: b for b in got["backends"]}
    for name, want in cfg["backends"].items():
        assert {k: by[name][k] for k in want} == want, name
    # the CPU's model buffers, one by one: the mapped range (or the allocated tensors) and
    # CPU_REPACK
    buffers = cfg["buffers"]
    mapped = sum(n for fn, name, n in buffers if name in ("CPU_Mapped", "CPU")
                 and fn in ("buffer_from_host_ptr", "alloc_ctx_tensors")) - cfg["backends"]["CPU"]["kv_bytes"]
    repack = sum(n for fn, name, n in buffers if name == "CPU_REPACK")
    assert (by["CPU"]["mapped_bytes"], by["CPU"]["repack_bytes"]) == (mapped, repack)
    # the output (logits) buffer: n_vocab floats per sequence
    assert by["CPU"]["output_bytes"] == cfg["output_buffer_bytes"]




@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c["model"].startswith("leaf-")],
                         ids=lambda c: c["id"])
def test_leaf_order_is_what_moved(cfg, model_dir):
    """Under 0.15.3's first-use order some of these come out larger: the recorded figure is
    0.25.3's leaf order, and ggmlrun's default follows it."""
    code, out, _ = invoke("measure", model_dir / cfg["model"], "--json", "--ggml", "0.15",
                          *options(cfg))
    old = json.loads(out)["backends"][-1]["arena_bytes"]
    assert old >= cfg["backends"]["CPU"]["arena_bytes"]


def test_repack_follows_the_backends_file(model_dir, tmp_path):
    """repack: none keeps every CPU weight in the mapped range (now up to output.weight, the
    file's last tensor); avx2 and neon repack q4_0's matrices as avx512 does (token_embd, read
    by GET_ROWS, never)."""
    cfg = next(c for c in CONFIGS if c["id"] == "repack-q4_0/c256/ub32/fa0/ngl0")
    results = {}
    for kind in ("none", "avx2", "neon"):
        path = tmp_path / f"{kind}.yaml"
        path.write_text(BACKENDS_FILE.read_text().replace("repack: avx512", f"repack: {kind}"))
        args = [a if a != str(BACKENDS_FILE) else str(path) for a in options(cfg)]
        code, out, err = invoke("measure", model_dir / cfg["model"], "--json", *args)
        assert code == 0, err
        cpu = json.loads(out)["backends"][-1]
        results[kind] = (cpu["mapped_bytes"], cpu["repack_bytes"])
    assert results["none"] == (760832, 0)      # the map now ends with output.weight
    assert results["avx2"] == results["neon"] == (714752, 709632)


def test_a_bad_repack_kind_is_exit_2(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("backends:\n  - {name: CPU, kind: cpu, repack: sse}\n")
    code, _, err = invoke("validate", REPO / "graphs" / "mlp.yaml", "--backends", path)
    assert code == 2 and "repack must be one of avx2, avx512, neon, none" in err


# Llama-3-8B dimensions, 4 layers, f16 (a card: the compute buffers do not depend on the file's
# bytes), as issue 23 quotes llama.cpp 0.3.36 on them (two RPC devices, -ts 1,1; CPU only)
L3_CARD = """architecture: llama
name: Llama-3-8B dims, 4 layers, f16
hparams: {n_layer: 4, n_embd: 4096, n_head: 32, n_head_kv: 8, n_ff: 14336, n_vocab: 128256,
          n_ctx_train: 8192, rope_freq_base: 500000.0}
weights: f16
"""


def _arenas(card, *args):
    code, out, err = invoke("measure", card, "--json", *args)
    assert code == 0, err
    data = json.loads(out)
    return data["n_copies"], [b["arena_bytes"] for b in data["backends"]]


def test_llama3_dims_pipeline_parallel_as_llamacpp(tmp_path):
    card = tmp_path / "l3.yaml"
    card.write_text(L3_CARD)
    two = ["--backends", str(REPO / "graphs/backends/llamacpp_rpc2.yaml"), "--ctx", "4096",
           "--tensor-split", "1,1", "--flash-attn", "off", "--parallel", "1"]   # as recorded
    assert _arenas(card, *two) == (4, [385_900_544, 377_520_128, 92_315_648])
    # --sched-copies 1: what ik_llama.cpp and a -DGGML_SCHED_MAX_COPIES=1 build allocate
    assert _arenas(card, *two, "--sched-copies", "1") == (1, [314_578_944, 314_580_992,
                                                              29_370_368])


def test_llama3_dims_leaf_order_as_llamacpp(tmp_path):
    """Flash attention, a 128k vocabulary, ctx 32768, CPU only: llama.cpp's 279,447,552; the
    first-use order of ggml 0.15.3 gave 304,625,664."""
    card = tmp_path / "l3.yaml"
    card.write_text(L3_CARD)
    cpu = ["--backends", str(BACKENDS_FILE), "--ctx", "32768", "--flash-attn", "on",
           "--ngl", "0", "--parallel", "1"]
    assert _arenas(card, *cpu)[1][-1] == 279_447_552
    assert _arenas(card, *cpu, "--ggml", "0.15")[1][-1] == 304_625_664
