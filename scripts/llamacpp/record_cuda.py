"""Records real llama.cpp on an NVIDIA GPU: the figures a `cuda` device profile must reproduce.

Needs a machine with a CUDA GPU and llama-cpp-python 0.3.36's llama.cpp built with -DGGML_CUDA=ON
-DGGML_RPC=ON (scripts/llamacpp/cuda_build.sh builds it from the sdist in a few minutes and says
which PYTHONPATH and LD_LIBRARY_PATH to use). It runs record.py's configurations that one device
can show (the model x ctx x ubatch x flash-attn x ngl grid first, then the single-device extras),
each in a child process with shim.c preloaded as record.py does, with the GPU (CUDA0) as the
device instead of an RPC server. Buffer names map to ggmlrun's backends as: CUDA<n> -> CUDA<n>,
CPU* and CUDA_Host (pinned host memory) -> CPU; the `buffers` list keeps llama.cpp's own names.

Before the configurations it probes what ggml-cuda itself reports, the facts that change bytes:
each buffer type's alignment, max size and host flag, ggml_backend_buft_get_alloc_size of
weight-shaped tensors of several types (ggml-cuda pads quantized rows to MATRIX_ROW_PADDING =
512 elements) and of FLASH_ATTN_EXT nodes (f16 copies of K and V), every tensor of the bundled
models, and ggml_backend_dev_offload_op for a few ops and batch sizes.

    python3 scripts/llamacpp/record_cuda.py [--out FILE] [--jobs N] [--deadline SECONDS] [--moe]
    python3 scripts/llamacpp/record_cuda.py --moe --list      (the selection, nothing recorded)

--moe records the mixtures of experts instead (tests/data/llamacpp/figures_cuda_moe.json): their
experts left on the CPU (-ot exps=CPU, --cpu-moe, --n-cpu-moe N) first, the configurations where
ggml-cuda's op offload moves MUL_MAT_ID to the GPU, then their grid at ctx 256; the probe then
reads the MoE files' tensors and asks offload_op / supports_op of MUL_MAT_ID and ADD_ID too.

Writes tests/data/llamacpp/figures_cuda.json: the device (GPU, driver, CUDA runtime, compute
capability), the llama.cpp build, the probe, then `configs` shaped as figures.json's; with
--graphs DIR, one gzipped graph dump per configuration there (each node with its alloc size).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402  (record.py beside this file: the grid, the child, the parsing)

FIGURES_CUDA = record.REPO / "tests" / "data" / "llamacpp" / "figures_cuda.json"
FIGURES_CUDA_MOE = record.REPO / "tests" / "data" / "llamacpp" / "figures_cuda_moe.json"
MOE_MODELS = ["tiny-qwen3moe-f16", "tiny-qwen3moe-q8_0", "tiny-glm4moe-f16", "tiny-glm4moe-q8_0",
              "tiny-gemma4moe-f16", "tiny-gemma4moe-q8_0", "tiny-qwen35moe-f16", "tiny-qwen35moe-q8_0",
              "tiny-deepseek2-f16", "tiny-deepseek2-q8_0", "tiny-deepseek2-lite-f16"] \
    + record.GPT_OSS_MODELS
# The llama.cpp commit llama-cpp-python 0.3.36's sdist vendors (.git/modules/vendor/llama.cpp/HEAD).
VENDORED_LLAMA_CPP = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
              "q2_K": 10, "q3_K": 11, "q4_K": 12, "q5_K": 13, "q6_K": 14, "iq4_nl": 20,
              "bf16": 30, "mxfp4": 39}
# Weight shapes [ne0, ne1]: the tiny models' (ne0 64, 192: not multiples of 512), Llama-3-8B's,
# and rows of odd lengths.
PROBE_SHAPES = [[64, 64], [64, 192], [192, 64], [64, 288], [4096, 4096], [4096, 1024],
                [4096, 14336], [14336, 4096], [4096, 128256], [5120, 7], [2880, 100], [11008, 3]]
# FLASH_ATTN_EXT: (head_dim, n_head, n_head_kv, n_kv, n_tokens, kv type)
PROBE_FA = [(16, 4, 2, 256, 5, "f16"), (16, 4, 2, 256, 32, "f16"), (16, 4, 4, 256, 32, "f16"),
            (16, 4, 2, 1024, 512, "f16"), (16, 4, 2, 256, 1, "f16"), (16, 4, 2, 256, 32, "f32"),
            (128, 32, 8, 4096, 512, "f16"), (128, 32, 8, 4096, 1, "f16"),
            (128, 32, 8, 32768, 512, "f16"), (128, 32, 8, 4096, 512, "q8_0")]
OFFLOAD_BATCHES = [1, 5, 31, 32, 33, 512]
PROBE_DEVICE = os.environ.get("PROBE_DEVICE", "CUDA")   # CPU: to try the probe on a machine without a GPU


def cuda_key(llama_name: str) -> str:
    """ggmlrun's backend for a llama.cpp buffer or backend name on a CUDA machine."""
    if re.fullmatch(r"CUDA\d+", llama_name):
        return llama_name
    if llama_name.startswith("CPU") or llama_name == "CUDA_Host":
        return "CPU"
    return llama_name   # kept as it is, so that a surprise is recorded rather than lost


def configs() -> list[dict]:
    """record.py's configurations one device can show: no -ts, and -ot only to the CPU."""
    return [cfg for cfg in record.all_configs()
            if not cfg["tensor_split"] and all(b == "CPU" for _, b in cfg["overrides"])]


def experts_on_cpu(cfg: dict) -> bool:
    return bool(cfg["cpu_moe"] or cfg["n_cpu_moe"] or any("exps" in p for p, _ in cfg["overrides"]))


def moe_configs() -> list[dict]:
    """The mixtures of experts, most telling first (a deadline cuts the tail): experts on the CPU
    beside offloaded layers (op offload takes their MUL_MAT_ID at ubatch >= 32), the other
    single-device extras at ctx 256 (-ngl N, -nkvo, two ubatches, -np), then the grid at ctx 256
    (the ctx 1024 grid, the -swa-full grid and the long prompts are left to the RPC recording)."""
    mine = [cfg for cfg in configs() if cfg["model"] in MOE_MODELS
            and "swafull" not in cfg["suffix"] and "long" not in cfg["suffix"]]
    first = [cfg for cfg in mine if experts_on_cpu(cfg)]
    extras = [cfg for cfg in mine if not experts_on_cpu(cfg) and cfg["suffix"] and cfg["ctx"] == 256]
    grid = [cfg for cfg in mine if not cfg["suffix"] and cfg["ctx"] == 256
            and cfg not in extras]
    return first + extras + grid


def model_layers(path: Path) -> int:
    """<arch>.block_count: through the gguf package (cuda_build.sh puts the sdist's gguf-py on the
    path), else read off the GGUF header directly."""
    try:
        return record.model_layers(path)
    except ImportError:
        return int(gguf_value(path, f"{gguf_value(path, 'general.architecture')}.block_count"))


def gguf_value(path: Path, wanted: str):
    """One scalar of a GGUF file's key-value section (GGUF v2/v3, little-endian)."""
    import struct
    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def read(fmt: str):
            size = struct.calcsize("<" + fmt)
            return struct.unpack("<" + fmt, f.read(size))[0]

        def string() -> str:
            return f.read(read("Q")).decode("utf-8", "replace")

        def value(vtype: int):
            if vtype == 8:
                return string()
            if vtype == 9:
                etype, count = read("I"), read("Q")
                return [value(etype) for _ in range(count)]
            return read(scalars[vtype])

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        read("I")
        read("Q")
        for _ in range(read("Q")):
            key, vtype = string(), read("I")
            v = value(vtype)
            if key == wanted:
                return v
    raise KeyError(f"{path}: no {wanted}")


# ---------------------------------------------------------------- the probe (child process)

class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class GgufInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


def _fn(lib: ctypes.CDLL, name: str, restype, *argtypes):
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


def probe(models: list[Path]) -> dict:
    """What ggml-cuda reports, read through ggml's public API (no model is loaded)."""
    libs = record.load_ggml(record.llama_cpp_dir() / "lib")
    base = libs["libggml-base.so.0"]
    ggml = libs["libggml.so.0"]
    P, S, I, C = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_char_p
    dev_count = _fn(ggml, "ggml_backend_dev_count", S)
    dev_get = _fn(ggml, "ggml_backend_dev_get", P, S)
    dev_name = _fn(ggml, "ggml_backend_dev_name", C, P)
    dev_desc = _fn(ggml, "ggml_backend_dev_description", C, P)
    dev_type = _fn(ggml, "ggml_backend_dev_type", ctypes.c_int, P)
    dev_memory = _fn(ggml, "ggml_backend_dev_memory", None, P, ctypes.POINTER(S), ctypes.POINTER(S))
    dev_buft = _fn(ggml, "ggml_backend_dev_buffer_type", P, P)
    dev_host_buft = _fn(ggml, "ggml_backend_dev_host_buffer_type", P, P)
    dev_offload = _fn(ggml, "ggml_backend_dev_offload_op", ctypes.c_bool, P, P)
    dev_supports = _fn(ggml, "ggml_backend_dev_supports_op", ctypes.c_bool, P, P)
    buft_name = _fn(base, "ggml_backend_buft_name", C, P)
    buft_align = _fn(base, "ggml_backend_buft_get_alignment", S, P)
    buft_max = _fn(base, "ggml_backend_buft_get_max_size", S, P)
    buft_alloc = _fn(base, "ggml_backend_buft_get_alloc_size", S, P, P)
    buft_is_host = _fn(base, "ggml_backend_buft_is_host", ctypes.c_bool, P)
    init = _fn(base, "ggml_init", P, InitParams)
    free = _fn(base, "ggml_free", None, P)
    new_1d = _fn(base, "ggml_new_tensor_1d", P, P, ctypes.c_int, I)
    new_2d = _fn(base, "ggml_new_tensor_2d", P, P, ctypes.c_int, I, I)
    new_3d = _fn(base, "ggml_new_tensor_3d", P, P, ctypes.c_int, I, I, I)
    nbytes = _fn(base, "ggml_nbytes", S, P)
    mul_mat = _fn(base, "ggml_mul_mat", P, P, P, P)
    get_rows = _fn(base, "ggml_get_rows", P, P, P, P)
    add = _fn(base, "ggml_add", P, P, P, P)
    rms_norm = _fn(base, "ggml_rms_norm", P, P, P, ctypes.c_float)
    mul_mat_id = _fn(base, "ggml_mul_mat_id", P, P, P, P, P)
    add_id = _fn(base, "ggml_add_id", P, P, P, P, P)
    fa = _fn(base, "ggml_flash_attn_ext", P, P, P, P, P, P, ctypes.c_float, ctypes.c_float, ctypes.c_float)
    first = _fn(base, "ggml_get_first_tensor", P, P)
    nxt = _fn(base, "ggml_get_next_tensor", P, P, P)
    get_name = _fn(base, "ggml_get_name", C, P)
    gguf_init = _fn(base, "gguf_init_from_file", P, C, GgufInitParams)
    gguf_free = _fn(base, "gguf_free", None, P)
    type_name = _fn(base, "ggml_type_name", C, ctypes.c_int)

    class Tensor(ctypes.Structure):   # the leading fields of struct ggml_tensor (ggml.h)
        _fields_ = [("type", ctypes.c_int), ("buffer", P), ("ne", I * 4), ("nb", S * 4)]

    out: dict = {"devices": [], "buffer_types": {}, "alloc_sizes": [], "flash_attn_alloc": [],
                 "offload_op": [], "model_tensors": {}}
    devices = [dev_get(i) for i in range(dev_count())]
    cuda = None
    bufts: dict[str, int] = {}
    for dev in devices:
        free_b, total_b = S(), S()
        dev_memory(dev, ctypes.byref(free_b), ctypes.byref(total_b))
        name = dev_name(dev).decode()
        out["devices"].append({"name": name, "description": dev_desc(dev).decode(),
                               "type": dev_type(dev), "memory_total": total_b.value,
                               "memory_free": free_b.value})
        for buft in (dev_buft(dev), dev_host_buft(dev)):
            if buft:
                bufts.setdefault(buft_name(buft).decode(), buft)
        if name.startswith(PROBE_DEVICE) and cuda is None:
            cuda = dev
    for name, buft in bufts.items():
        out["buffer_types"][name] = {"alignment": buft_align(buft), "max_size": buft_max(buft),
                                     "is_host": bool(buft_is_host(buft))}
    try:
        import llama_cpp   # after load_ggml, on the same ggml
        out["system_info"] = llama_cpp.llama_print_system_info().decode()
    except Exception as exc:   # noqa: BLE001
        out["system_info"] = repr(exc)
    if cuda is None:
        out["error"] = f"no {PROBE_DEVICE} device"
        return out
    cuda_buft = dev_buft(cuda)
    ctx = init(InitParams(64 << 20, None, True))
    try:
        for tname, t in GGML_TYPES.items():
            for ne0, ne1 in PROBE_SHAPES:
                if tname not in ("f32", "f16", "bf16") and ne0 % 32:
                    continue
                if tname.endswith("_K") and ne0 % 256:
                    continue
                w = new_2d(ctx, t, ne0, ne1)
                out["alloc_sizes"].append({"type": tname, "ne": [ne0, ne1], "nbytes": nbytes(w),
                                           "alloc": buft_alloc(cuda_buft, w)})
        for hd, n_head, n_head_kv, n_kv, n_tokens, kv in PROBE_FA:
            q = new_3d(ctx, 0, hd, n_tokens, n_head)
            k = new_3d(ctx, GGML_TYPES[kv], hd, n_kv, n_head_kv)
            v = new_3d(ctx, GGML_TYPES[kv], hd, n_kv, n_head_kv)
            mask = new_2d(ctx, 1, n_kv, n_tokens)   # f16, as llama.cpp's KQ mask
            node = fa(ctx, q, k, v, mask, 1.0 / hd ** 0.5, 0.0, 0.0)
            out["flash_attn_alloc"].append({
                "head_dim": hd, "n_head": n_head, "n_head_kv": n_head_kv, "n_kv": n_kv,
                "n_tokens": n_tokens, "kv_type": kv, "nbytes": nbytes(node),
                "alloc": buft_alloc(cuda_buft, node), "supported": bool(dev_supports(cuda, node))})
        for n in OFFLOAD_BATCHES:
            w = new_2d(ctx, 1, 64, 64)
            x = new_2d(ctx, 0, 64, n)
            ids = new_1d(ctx, 26, n)   # GGML_TYPE_I32
            for op, node in (("MUL_MAT", mul_mat(ctx, w, x)), ("GET_ROWS", get_rows(ctx, w, ids)),
                             ("ADD", add(ctx, x, x)), ("RMS_NORM", rms_norm(ctx, x, 1e-5))):
                out["offload_op"].append({"op": op, "batch": n, "offload": bool(dev_offload(cuda, node))})
            # experts [64, 64, 8] (weight types of the tiny MoE files), 2 used per token
            for tname in ("f16", "q8_0", "mxfp4"):
                experts = new_3d(ctx, GGML_TYPES[tname], 64, 64, 8)
                xs = new_3d(ctx, 0, 64, 2, n)
                ids2 = new_2d(ctx, 26, 2, n)
                node = mul_mat_id(ctx, experts, xs, ids2)
                out["offload_op"].append({"op": "MUL_MAT_ID", "type": tname, "batch": n,
                                          "offload": bool(dev_offload(cuda, node)),
                                          "supported": bool(dev_supports(cuda, node))})
            bias = new_2d(ctx, 0, 64, 8)
            node = add_id(ctx, new_3d(ctx, 0, 64, 2, n), bias, new_2d(ctx, 26, 2, n))
            out["offload_op"].append({"op": "ADD_ID", "batch": n, "offload": bool(dev_offload(cuda, node)),
                                      "supported": bool(dev_supports(cuda, node))})
    finally:
        free(ctx)
    for path in models:
        mctx = P()
        g = gguf_init(str(path).encode(), GgufInitParams(True, ctypes.pointer(mctx)))
        if not g:
            continue
        rows = []
        t = first(mctx)
        while t:
            ts = Tensor.from_address(t)
            ne = list(ts.ne)
            while len(ne) > 2 and ne[-1] == 1:   # [ne0, ne1] for a matrix, [ne0, ne1, ne2] for experts
                ne.pop()
            rows.append([get_name(t).decode(), type_name(ts.type).decode(), ne,
                         nbytes(t), buft_alloc(cuda_buft, t)])
            t = nxt(mctx, t)
        out["model_tensors"][path.name] = rows
        gguf_free(g)
        free(mctx)
    return out


def runtime_versions() -> dict:
    """The CUDA runtime and driver versions as cudart reports them (e.g. 13000 for 13.0)."""
    found = {}
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        for key, fn in (("cuda_runtime", "cudaRuntimeGetVersion"), ("cuda_driver_api", "cudaDriverGetVersion")):
            v = ctypes.c_int()
            if getattr(cudart, fn)(ctypes.byref(v)) == 0:
                found[key] = v.value
        break
    return found


def machine_info() -> dict:
    info: dict = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=60)
        name, driver, memory, cc = [s.strip() for s in q.stdout.strip().splitlines()[0].split(",")]
        info.update(gpu=name, driver=driver, gpu_memory=memory, compute_capability=cc)
    except Exception as exc:   # noqa: BLE001  (recorded, not fatal: the figures matter more)
        info["nvidia_smi_error"] = repr(exc)
    try:
        v = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=60).stdout
        info["nvcc"] = next((line for line in v.splitlines() if "release" in line), v.strip()[-200:])
    except Exception as exc:   # noqa: BLE001
        info["nvcc_error"] = repr(exc)
    return info


# ---------------------------------------------------------------- driver

def record_one(cfg: dict, shim: Path, workdir: Path) -> tuple[dict, dict, float]:
    stem = cfg["id"].replace("/", "_")
    shim_log = workdir / f"{stem}.shim"
    shim_log.unlink(missing_ok=True)
    env = dict(os.environ, LD_PRELOAD=str(shim), SHIM_LOG=str(shim_log), GGML_SCHED_DEBUG="2",
               OMP_NUM_THREADS=str(record.N_THREADS))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg['id']}: llama.cpp child failed:\n{proc.stderr[-3000:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    entry, dump = record.figures_of(cfg, child, shim_log.read_text(), [], key=cuda_key)
    shim_log.unlink()
    entry["offloaded"] = [line.strip() for line in child["log"].splitlines()
                          if "offloaded" in line or "offloading" in line][:4]
    return entry, dump, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES_CUDA)
    parser.add_argument("--models", type=Path, default=record.MODELS_DIR)
    parser.add_argument("--graphs", type=Path, help="where one gzipped graph dump per configuration goes")
    parser.add_argument("--only", default="", help="record only configurations whose id contains this")
    parser.add_argument("--jobs", type=int, default=4, help="configurations recorded at once")
    parser.add_argument("--deadline", type=float, default=1e9,
                        help="start no configuration after this many seconds")
    parser.add_argument("--moe", action="store_true", help="the mixtures of experts (figures_cuda_moe.json)")
    parser.add_argument("--list", action="store_true", help="print the selected ids and stop")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(record.run_config(json.loads(args.child), [])))
        return 0
    if args.probe:
        names = [f"{m}.gguf" for m in MOE_MODELS] if args.moe else None
        paths = sorted(p for p in args.models.glob("tiny-*.gguf")
                       if (p.name in names if names else p.name.startswith("tiny-llama-")))
        print(json.dumps(probe(paths)))
        return 0
    todo = [c for c in (moe_configs() if args.moe else configs()) if args.only in c["id"]]
    if args.list:
        print("\n".join(c["id"] for c in todo) + f"\n{len(todo)} configurations")
        return 0
    if args.moe and args.out == FIGURES_CUDA:
        args.out = FIGURES_CUDA_MOE

    started = time.monotonic()
    data: dict = {"llama_cpp_python": "0.3.36", "llama_cpp_commit": VENDORED_LLAMA_CPP}
    lib_dir = record.llama_cpp_dir() / "lib"
    data["ggml"] = next((p.name.split(".so.")[1] for p in lib_dir.glob("libggml.so.*.*")), None)
    data["build"] = os.environ.get("LLAMA_CUDA_BUILD", "")
    # ggml-cuda's switches that change the figures (GGML_CUDA_DISABLE_FUSION: no fusion, so its
    # graph_optimize adds no allocation dependencies), as the children inherit them
    data["env"] = {k: v for k, v in os.environ.items() if k.startswith("GGML_CUDA_")}
    data.update(machine_info(), **runtime_versions())
    data.update(tokens=record.TOKENS, n_threads=record.N_THREADS, n_batch=record.N_BATCH)
    proc = subprocess.run([sys.executable, __file__, "--probe", "--models", str(args.models)]
                          + (["--moe"] if args.moe else []),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        data["probe"] = json.loads(proc.stdout.strip().splitlines()[-1])
    else:
        data["probe"] = {"error": proc.stderr[-3000:]}
    data["probe"]["ggml_log"] = [line for line in proc.stderr.splitlines() if line.strip()][:20]
    data["configs"] = []
    record.write_json_atomic(args.out, data)
    print(f"probe: {json.dumps(data['probe'].get('buffer_types'))} ({time.monotonic() - started:.1f}s)",
          flush=True)

    order = {c["id"]: i for i, c in enumerate(todo)}
    recorded: dict[str, dict] = {}
    failed: dict[str, str] = {}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        shim = record.compile_shim(workdir)

        def one(cfg: dict) -> None:
            if time.monotonic() - started > args.deadline:
                with lock:
                    failed[cfg["id"]] = "skipped: past the deadline"
                return
            path = args.models / f"{cfg['model']}.gguf"
            cfg = dict(cfg, path=str(path), n_layer=model_layers(path))
            try:
                entry, dump, seconds = record_one(cfg, shim, workdir)
            except Exception as exc:   # noqa: BLE001  (one failure must not lose the others)
                with lock:
                    failed[cfg["id"]] = str(exc)[-2000:]
                print(f"{cfg['id']:45s} FAILED {str(exc)[-300:]}", flush=True)
                return
            with lock:
                recorded[cfg["id"]] = entry
                data["configs"] = sorted(recorded.values(), key=lambda e: order[e["id"]])
                data["failed"] = failed
                data["record_seconds"] = round(time.monotonic() - started, 1)
                record.write_json_atomic(args.out, data)
            if args.graphs:
                record.write_json_atomic(args.graphs / (cfg["id"].replace("/", "_") + ".json.gz"),
                                         dump, compress=True)
            sizes = " ".join(f"{k}:w{v['weights_bytes']}/kv{v['kv_bytes']}/c{v['arena_bytes']}"
                             for k, v in entry["backends"].items())
            print(f"{cfg['id']:45s} nodes {entry['n_nodes']:4d} splits {entry['n_splits']:2d} "
                  f"{sizes}  ({seconds:.1f}s)", flush=True)

        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(one, todo))
    with lock:
        data["failed"] = failed
        data["record_seconds"] = round(time.monotonic() - started, 1)
        record.write_json_atomic(args.out, data)
    print(f"recorded {len(recorded)} of {len(todo)} configurations ({len(failed)} failed or skipped) "
          f"in {time.monotonic() - started:.1f}s -> {args.out}")
    return 0 if recorded else 1


if __name__ == "__main__":
    sys.exit(main())
