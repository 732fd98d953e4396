"""Records libmtmd's figures for the tiny gemma3 projector (make_tiny_mmproj.py), the ground
truth of tests/test_mmproj.py.

Each configuration loads examples/models/tiny-gemma3-f16.gguf as the text model and one of
tests/data/llamacpp/tiny-mmproj-gemma3-*.gguf through mtmd_init_from_file (llama-cpp-python
0.3.36's libmtmd), as llama-server does with `--mmproj`: on the CPU (`--no-mmproj-offload`,
use_gpu false) or with one RPC server standing for the main GPU, flash attention off, on and
auto (mtmd's own setting). shim.c (record.py's) reports the projector's weight buffer and the
sched's compute buffer bytes per backend; clip's log gives its warm-up image size, node and
split counts and what auto resolved to.

    python3 scripts/llamacpp/record_mmproj.py [--out tests/data/llamacpp/mmproj.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TEXT = REPO / "examples" / "models" / "tiny-gemma3-f16.gguf"
DATA = REPO / "tests" / "data" / "llamacpp"
MMPROJS = ["tiny-mmproj-gemma3-f16", "tiny-mmproj-gemma3-b-q8_0",   # make_tiny_mmproj.py's
           "tiny-mmproj-qwen3vl-f16", "tiny-mmproj-qwen3vl-b-q8_0"]
# projectors loaded without a text model (libmtmd then skips its n_embd check): the tiny
# qwen3vl's deepstack output has no tiny text model of its width
WITHOUT_TEXT = ("tiny-mmproj-qwen3vl-f16", "tiny-mmproj-qwen3vl-b-q8_0")
FLASH = {"off": 0, "on": 1, "auto": -1}     # clip_flash_attn_type / llama_flash_attn_type
CONFIGS = [{"mmproj": m, "device": device, "flash_attn": fa}
           for m in MMPROJS for device in ("rpc", "cpu") for fa in FLASH]
SPLITS = re.compile(r"graph splits = (\d+), nodes = (\d+)")
WARMUP = re.compile(r"warmup with image size = (\d+) x (\d+)")
FA = re.compile(r"flash attention is (enabled|disabled)")


def run_child(cfg: dict, endpoint: str) -> None:
    libs = record.load_ggml(record.llama_cpp_dir() / "lib")
    ggml, rpc = libs["libggml.so.0"], libs["libggml-rpc.so.0"]
    if cfg["device"] == "rpc":
        rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
        rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
        ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
        ggml.ggml_backend_register(rpc.ggml_backend_rpc_add_server(endpoint.encode()))
    shim = ctypes.CDLL(None)
    shim.shim_mark.argtypes = [ctypes.c_char_p]
    import llama_cpp
    from llama_cpp import mtmd_cpp

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    shim.shim_mark(b"text")
    model = (None if cfg["mmproj"] in WITHOUT_TEXT
             else llama_cpp.llama_model_load_from_file(str(TEXT).encode(), mparams))
    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu = cfg["device"] == "rpc"
    params.n_threads = record.N_THREADS
    params.flash_attn_type = FLASH[cfg["flash_attn"]]
    params.warmup = True
    params.print_timings = False
    shim.shim_mark(b"mmproj")
    mmproj = DATA / f"{cfg['mmproj']}.gguf"
    ctx = mtmd_cpp.mtmd_init_from_file(str(mmproj).encode(), model, params)
    shim.shim_mark(b"done")
    if not ctx:
        raise RuntimeError("mtmd_init_from_file failed")
    mtmd_cpp.mtmd_free(ctx)
    if model is not None:
        llama_cpp.llama_model_free(model)


def record_one(cfg: dict, endpoint: str, shim: Path, workdir: Path) -> dict:
    log_path = workdir / "shim.log"
    log_path.unlink(missing_ok=True)
    env = dict(os.environ, LD_PRELOAD=str(shim), SHIM_LOG=str(log_path),
               OMP_NUM_THREADS=str(record.N_THREADS))
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg), "--endpoint", endpoint],
                          env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=record.cap_memory)
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg}: child failed:\n{proc.stderr[-3000:]}")
    buffers, sizes, graphs = record.parse_shim(record.device_names(log_path.read_text(), [endpoint]))
    backends: dict[str, dict[str, int]] = {}
    for phase, fn, name, nbytes in buffers:
        if phase == "mmproj" and fn == "alloc_ctx_tensors":
            entry = backends.setdefault(record.backend_key(name), {"weights_bytes": 0, "arena_bytes": 0})
            entry["weights_bytes"] += nbytes
    for phase, name, nbytes in sizes:           # the last reserve's size per backend
        if phase == "mmproj":
            backends.setdefault(record.backend_key(name), {"weights_bytes": 0, "arena_bytes": 0})
            backends[record.backend_key(name)]["arena_bytes"] = nbytes
    log = record.device_names(proc.stderr, [endpoint])
    splits, nodes = SPLITS.findall(log)[-1]
    reserves = [g for g in graphs if g["kind"] == "reserve" and g["phase"] == "mmproj"]
    return {"mmproj": cfg["mmproj"] + ".gguf",
            "text_model": None if cfg["mmproj"] in WITHOUT_TEXT else TEXT.name,
            "device": cfg["device"], "flash_attn": cfg["flash_attn"],
            "flash_attn_resolved": FA.findall(log)[-1] == "enabled",
            "warmup_image_size": int(WARMUP.findall(log)[-1][0]),
            "n_nodes": int(nodes), "n_splits": int(splits), "n_reserves": len(SPLITS.findall(log)),
            "backends": {k: backends[k] for k in sorted(backends, key=lambda k: (k == "CPU", k))},
            "node_backends": [[n["op"], n["backend"]] for n in reserves[-1]["nodes"]] if reserves else []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "llamacpp" / "mmproj.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="record only projectors whose name holds this")
    args = parser.parse_args(argv)
    if args.child:
        run_child(json.loads(args.child), args.endpoint)
        return 0
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        shim = record.compile_shim(Path(tmp))
        server, endpoint = record.start_rpc_server()
        try:
            for cfg in [c for c in CONFIGS if args.only in c["mmproj"]]:
                records.append(record_one(cfg, endpoint, shim, Path(tmp)))
                print(json.dumps({k: v for k, v in records[-1].items() if k != "node_backends"}), flush=True)
        finally:
            server.kill()
            server.wait()
    args.out.write_text(json.dumps({**record.versions(), "configs": records}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
