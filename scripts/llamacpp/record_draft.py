"""llama.cpp's figures for a target model with a draft model (speculative decoding, -md), for
tests/test_draft.py: each model's weights, KV and compute bytes per backend, nodes and splits.

Both models load in one process (a child of record.py's kind, shim.c preloaded), the target as
record.py loads it and then the draft as llama-server loads it (common/speculative.cpp:
common_base_params_to_speculative, common_speculative_init_result): the target's context
parameters except the KV types (-ctkd/-ctvd, f16 by default), n_ctx = llama_n_ctx(target's
context), n_outputs_max = n_parallel with one output per sequence, n_rs_seq 0, ctx_other the
target's context; the model parameters the target's (-ts too) except -ngld and no tensor
overrides. Shim marks "load"/"context" for the target and "draft_load"/"draft_context" for the
draft split the buffers. Devices: one RPC server (two for the -ts configuration).
Needs llama-cpp-python 0.3.36 built with -DGGML_RPC=ON.

    python3 scripts/llamacpp/record_draft.py   # -> tests/data/llamacpp/draft.json
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE)]

import record as rec  # noqa: E402

OUT = REPO / "tests" / "data" / "llamacpp" / "draft.json"
EXAMPLES = REPO / "examples" / "models"
BASE = {"ctx": 256, "ubatch": 32, "flash_attn": False, "ngl": "all", "ngl_draft": "all",
        "parallel": 1, "kv_unified": False, "tensor_split": [], "overrides": [],
        "type_k": "f16", "type_v": "f16", "type_k_draft": "f16", "type_v_draft": "f16",
        "devices_draft": None}
# (target, draft, what differs from BASE)
CONFIGS = [
    ("tiny-llama-f16", "tiny-llama-q8_0", {}),
    ("tiny-llama-f16", "tiny-llama-q8_0", {"ctx": 1024, "ubatch": 512, "flash_attn": True}),
    ("tiny-llama-f16", "tiny-llama-q8_0", {"ngl_draft": 0}),
    ("tiny-llama-f16", "tiny-qwen3-q8_0", {"ngl": 2, "ngl_draft": 3}),
    # the draft's context is the target's after padding (300 -> 512), its ubatch clamped to it
    ("tiny-llama-f16", "tiny-qwen3-f16", {"ctx": 300, "ubatch": 512}),
    # a stream per sequence: the draft gets n_ctx_seq x n_seq_max and one output per sequence
    ("tiny-qwen3-f16", "tiny-llama-f16", {"parallel": 3, "ubatch": 64}),
    ("tiny-qwen3-f16", "tiny-llama-f16", {"parallel": 4, "kv_unified": True, "ctx": 512}),
    # the draft's own KV types, not the target's; the target's -ot is not the draft's
    ("tiny-qwen3-f16", "tiny-qwen3-q8_0", {"flash_attn": True, "type_k": "q8_0",
                                           "type_v": "q8_0", "type_k_draft": "q4_0",
                                           "type_v_draft": "f16",
                                           "overrides": [["blk\\.1\\.ffn_.*", "CPU"]]}),
    # two devices: the draft splits its layers as the target's -ts
    ("tiny-llama-f16", "tiny-llama-q8_0", {"tensor_split": [3.0, 1.0]}),
    ("tiny-gemma3-f16", "tiny-llama-f16", {"ctx": 512}),
    # -devd: the draft on its own devices (in its order, the target's -ts read over them)
    ("tiny-llama-f16", "tiny-llama-q8_0", {"tensor_split": [3.0, 1.0],
                                           "devices_draft": ["RPC1"]}),
    ("tiny-llama-f16", "tiny-llama-q8_0", {"tensor_split": [3.0, 1.0],
                                           "devices_draft": ["RPC1", "RPC0"]}),
    ("tiny-llama-f16", "tiny-qwen3-f16", {"tensor_split": [1.0, 1.0], "devices_draft": []}),
]


def config_id(target: str, draft: str, diff: dict) -> str:
    opts = ",".join(f"{k}={v}" for k, v in diff.items()) or "base"
    return f"{target}+{draft}/{opts}"


def run_pair(cfg: dict, endpoints: list[str]) -> dict:
    """The child: the target, then the draft, as llama-server loads them (module docstring);
    llama.cpp's log up to the draft and from it, for their node and split counts."""
    libs = rec.load_ggml(rec.llama_cpp_dir() / "lib")
    ggml, rpc = libs["libggml.so.0"], libs["libggml-rpc.so.0"]
    rpc.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    rpc.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    for endpoint in endpoints[:max(1, len(cfg["tensor_split"]))]:
        ggml.ggml_backend_register(rpc.ggml_backend_rpc_add_server(endpoint.encode()))
    shim = ctypes.CDLL(None)
    shim.shim_mark.argtypes = [ctypes.c_char_p]

    import llama_cpp

    log: list[str] = []

    @llama_cpp.llama_log_callback
    def keep_log(level, text, user_data):
        log.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(keep_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*cfg["tensor_split"])
    overrides = rec.buffer_overrides(ggml, cfg["overrides"])

    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_name.restype = ctypes.c_char_p
    ggml.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    # the RPC devices are named RPC0, RPC1 in their registration order (endpoints' order)
    by_name = {ggml.ggml_backend_dev_name(dev).decode(): dev for dev in
               (ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count()))}
    chosen = cfg["devices_draft"]
    # -devd: a NULL-terminated list of devices (none: the NULL alone), as parse_device_list
    devd = None if chosen is None else (ctypes.c_void_p * (len(chosen) + 1))(
        *[by_name[name] for name in chosen], None)

    def model_params(ngl, n_layer, rules: bool):
        mparams = llama_cpp.llama_model_default_params()
        if not rules and devd is not None:            # the draft's -devd
            mparams.devices = ctypes.addressof(devd)
        mparams.n_gpu_layers = n_layer + 1 if ngl == "all" else ngl
        if cfg["tensor_split"]:
            mparams.tensor_split = split
        if rules and cfg["overrides"]:
            mparams.tensor_buft_overrides = ctypes.addressof(overrides)
        return mparams

    def context_params(n_ctx, type_k, type_v):
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = rec.N_BATCH
        cparams.n_ubatch = cfg["ubatch"]
        cparams.n_threads = cparams.n_threads_batch = rec.N_THREADS
        cparams.flash_attn_type = 1 if cfg["flash_attn"] else 0
        cparams.type_k, cparams.type_v = rec.KV_TYPES[type_k], rec.KV_TYPES[type_v]
        cparams.swa_full = False
        cparams.n_seq_max = cfg["parallel"]
        cparams.kv_unified = cfg["kv_unified"]
        return cparams

    shim.shim_mark(b"load")
    model = llama_cpp.llama_model_load_from_file(
        cfg["path"].encode(), model_params(cfg["ngl"], cfg["n_layer"], True))
    if not model:
        raise RuntimeError("llama.cpp could not load the target\n" + "".join(log[-20:]))
    shim.shim_mark(b"context")
    ctx = llama_cpp.llama_init_from_model(model, context_params(cfg["ctx"], cfg["type_k"],
                                                                cfg["type_v"]))
    if not ctx:
        raise RuntimeError("llama.cpp could not make the target's context\n" + "".join(log[-20:]))
    n_log = len(log)
    shim.shim_mark(b"draft_load")
    draft = llama_cpp.llama_model_load_from_file(
        cfg["draft_path"].encode(), model_params(cfg["ngl_draft"], cfg["draft_n_layer"], False))
    if not draft:
        raise RuntimeError("llama.cpp could not load the draft\n" + "".join(log[-20:]))
    dparams = context_params(llama_cpp.llama_n_ctx(ctx), cfg["type_k_draft"],
                             cfg["type_v_draft"])
    dparams.n_outputs_max = cfg["parallel"]          # common_base_params_to_speculative
    dparams.n_outputs_max_per_seq = 1
    dparams.n_rs_seq = 0
    dparams.ctx_other = ctx
    shim.shim_mark(b"draft_context")
    dctx = llama_cpp.llama_init_from_model(draft, dparams)
    if not dctx:
        raise RuntimeError("llama.cpp could not make the draft's context\n" + "".join(log[-20:]))
    shim.shim_mark(b"done")
    out = {"log": "".join(log[:n_log]), "log_draft": "".join(log[n_log:]),
           "n_ctx": llama_cpp.llama_n_ctx(ctx), "n_ctx_draft": llama_cpp.llama_n_ctx(dctx)}
    llama_cpp.llama_free(dctx)
    llama_cpp.llama_model_free(draft)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return out


def split_shim(text: str) -> tuple[str, str]:
    """The shim's lines of the target, and of the draft with its marks renamed to the ones
    record.figures_of reads (load, context)."""
    target, draft, into = [], [], None
    for line in text.splitlines():
        if line.startswith("M\t"):
            into = draft if line.split("\t")[1].startswith("draft_") else target
            line = line.replace("draft_", "")
        (into if into is not None else target).append(line)
    return "\n".join(target), "\n".join(draft)


def figures(cfg: dict, shim_text: str, log: str, endpoints: list[str]) -> dict:
    entry, _ = rec.figures_of(cfg | {"kv_type": cfg["type_k"], "no_kv_offload": False,
                                     "swa_full": False},
                              {"log": log, "logits": []}, shim_text, endpoints)
    return {k: entry[k] for k in ("n_nodes", "n_splits", "n_nodes_tg", "n_splits_tg",
                                  "backends", "output_buffer_bytes")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only ids containing this (writes nothing)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--endpoints", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_pair(json.loads(args.child), args.endpoints.split(","))))
        return 0
    started = time.monotonic()
    entries, models = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        shim = rec.compile_shim(workdir)
        servers = [rec.start_rpc_server() for _ in range(2)]
        endpoints = [endpoint for _, endpoint in servers]
        try:
            for target, draft, diff in CONFIGS:
                cfg = BASE | diff | {"id": config_id(target, draft, diff), "model": target,
                                     "draft": draft}
                if args.only not in cfg["id"]:
                    continue
                for name in (target, draft):
                    path = EXAMPLES / f"{name}.gguf"
                    models[name] = {"file": f"examples/models/{name}.gguf",
                                    "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
                tp, dp = EXAMPLES / f"{target}.gguf", EXAMPLES / f"{draft}.gguf"
                cfg |= {"path": str(tp), "n_layer": rec.model_layers(tp),
                        "draft_path": str(dp), "draft_n_layer": rec.model_layers(dp)}
                shim_log = workdir / "shim.log"
                shim_log.unlink(missing_ok=True)
                env = dict(os.environ, LD_PRELOAD=str(shim), SHIM_LOG=str(shim_log),
                           OMP_NUM_THREADS=str(rec.N_THREADS))
                proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg),
                                       "--endpoints", ",".join(endpoints)], env=env,
                                      capture_output=True, text=True, timeout=300,
                                      preexec_fn=rec.cap_memory)
                if proc.returncode != 0:
                    raise RuntimeError(f"{cfg['id']}: child failed:\n{proc.stderr[-3000:]}")
                child = json.loads(proc.stdout.strip().splitlines()[-1])
                shim_t, shim_d = split_shim(shim_log.read_text())
                entry = {"id": cfg["id"], "target": target + ".gguf", "draft": draft + ".gguf",
                         "options": {k: cfg[k] for k in BASE},
                         "n_ctx": child["n_ctx"], "n_ctx_draft": child["n_ctx_draft"],
                         "target_figures": figures(cfg, shim_t, child["log"], endpoints),
                         "draft_figures": figures(cfg, shim_d, child["log_draft"], endpoints)}
                entries.append(entry)
                sizes = " ".join(f"{b}:w{f['weights_bytes']}/kv{f['kv_bytes']}/c{f['arena_bytes']}"
                                 for b, f in entry["draft_figures"]["backends"].items())
                print(f"{entry['id']:70s} n_ctx {entry['n_ctx']}/{entry['n_ctx_draft']} "
                      f"draft nodes {entry['draft_figures']['n_nodes']} {sizes}", flush=True)
        finally:
            for server, _ in servers:
                server.kill()
                server.wait()
    if args.only:
        return 0
    data = rec.versions() | {"n_batch": rec.N_BATCH, "models": models, "configs": entries,
                             "backends_files": {"1": "graphs/backends/llamacpp_rpc.yaml",
                                                "2": "graphs/backends/llamacpp_rpc2.yaml"}}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"recorded {len(entries)} configurations in {time.monotonic() - started:.0f}s "
          f"-> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
