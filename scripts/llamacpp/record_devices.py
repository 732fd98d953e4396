"""llama.cpp's host-memory figures for issue 23, recorded here: ggml 0.25.3's allocator leaf
order (1-layer f16 models whose CPU compute buffer peaks after the graph inputs are freed), the
CPU's repacked weights (q4_0, q4_K, q2_K models on this machine's CPU: `CPU_REPACK` buffers
beside the mapped range; `--no-mmap`), `-np` (n_seq_max, unified or split KV) and the output
(logits) buffer. The models are small and seeded: the test writes them again with
make_tiny_gguf.py and compares ggmlrun's figures with these.

    python3 scripts/llamacpp/record_devices.py   # -> tests/data/llamacpp/figures_devices.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE)]

import make_tiny_gguf as mk  # noqa: E402
import record as rec  # noqa: E402

OUT = REPO / "tests" / "data" / "llamacpp" / "figures_devices.json"

# name -> the file's shape (make_tiny_gguf.TinyModel); all 1-2 layers, the tiny vocabulary
MODELS = {
    "leaf-f16-128x1": mk.TinyModel("leaf-f16-128x1", "f16", n_embd=128, n_head=1, n_head_kv=1,
                                   n_ff=256, n_layer=1, seed=7),
    "leaf-f16-256x2": mk.TinyModel("leaf-f16-256x2", "f16", n_embd=256, n_head=2, n_head_kv=2,
                                   n_ff=512, n_layer=1, seed=7),
    "repack-q4_0": mk.TinyModel("repack-q4_0", "q4_0", n_embd=256, n_head=4, n_head_kv=2,
                                n_ff=512, n_layer=2, seed=11),
}
# a Q4_K_M file made by llama.cpp's own quantizer (gguf's Python writer has no k-quant
# encoder) from this f16 one, committed beside the figures (tests/data/llamacpp/)
Q4_K_M_SOURCE = mk.TinyModel("repack-f16", "f16", n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                             n_layer=2, seed=12)
Q4_K_M = REPO / "tests" / "data" / "llamacpp" / "repack-q4_K_M.gguf"


def quantize_q4_k_m(workdir: Path) -> Path:
    """llama_model_quantize(f16 -> Q4_K_M) in a child process, once (the file is committed)."""
    if Q4_K_M.exists():
        return Q4_K_M
    source = mk.write_model(Q4_K_M_SOURCE, workdir)
    code = ("import ctypes, sys, llama_cpp as l\n"
            "p = l.llama_model_quantize_default_params(); p.ftype = 15; p.nthread = 2\n"
            "sys.exit(l.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), "
            "ctypes.byref(p)))")
    tmp = Q4_K_M.with_suffix(".tmp")
    subprocess.run([sys.executable, "-c", code, str(source), str(tmp)], check=True,
                   capture_output=True)
    tmp.replace(Q4_K_M)
    return Q4_K_M


BASE = {"ctx": 256, "ubatch": 32, "flash_attn": False, "ngl": 0, "kv_type": "f16",
        "no_kv_offload": False, "overrides": [], "tensor_split": []}
CONFIGS = (
    [("leaf-f16-128x1", dict(flash_attn=fa, ubatch=ub)) for fa in (False, True) for ub in (32, 512)]
    + [("leaf-f16-256x2", dict(flash_attn=fa, ubatch=ub)) for fa in (False, True) for ub in (32, 512)]
    + [(m, dict(ngl=ngl, use_mmap=mmap)) for m in ("repack-q4_0",)
       for ngl in (0, 2, "all") for mmap in (True, False)]
    + [("repack-q4_0", dict(ngl=2, overrides=[["blk\\.0\\.", "RPC0"]]))]
    + [("repack-q4_K_M", dict(ngl=ngl, use_mmap=mmap)) for ngl in (0, 2) for mmap in (True, False)]
    + [("leaf-f16-256x2", dict(parallel=np_, kv_unified=uni)) for np_ in (2, 4) for uni in (False, True)]
    + [("leaf-f16-256x2", dict(parallel=4, kv_unified=uni, ctx=2048, ubatch=512, flash_attn=fa))
       for uni in (False, True) for fa in (False, True)]
    + [("repack-q4_0", dict(parallel=3, kv_unified=False, ctx=1000, ngl="all"))]
    + [("leaf-f16-256x2", dict(parallel=3, kv_unified=True, ubatch=ub, flash_attn=fa))
       for ub in (32, 512) for fa in (False, True)]
    + [("repack-q4_0", dict(parallel=3, kv_unified=True, ctx=1000, ngl="all"))]
)


def config_id(model: str, o: dict) -> str:
    cid = rec.config_id(model, o["ctx"], o["ubatch"], o["flash_attn"], o["ngl"])
    if not o.get("use_mmap", True):
        cid += "/nommap"
    if o.get("overrides"):
        cid += "/ot-blk0-rpc"
    if o.get("parallel", 1) != 1:
        cid += f"/np{o['parallel']}" + ("-kvu" if o.get("kv_unified") else "")
    return cid


def main() -> int:
    started = time.monotonic()
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        paths = {name: mk.write_model(m, workdir) for name, m in MODELS.items()}
        paths["repack-q4_K_M"] = quantize_q4_k_m(workdir)
        shim = rec.compile_shim(workdir)
        server, endpoint = rec.start_rpc_server()
        try:
            for name, opts in CONFIGS:
                cfg = BASE | opts | {"model": name}
                cfg["id"] = config_id(name, cfg)
                cfg.update(path=str(paths[name]),
                           n_layer=(MODELS[name] if name in MODELS else Q4_K_M_SOURCE).n_layer)
                entry, _ = rec.record_one(cfg, [endpoint], shim, workdir)
                entry["options"].update({k: cfg[k] for k in ("use_mmap", "parallel", "kv_unified")
                                         if k in cfg})
                entry.pop("logits")
                entries.append(entry)
                print(f"{entry['id']:45s} {entry['backends']} out {entry['output_buffer_bytes']}",
                      flush=True)
        finally:
            server.kill()
            server.wait()
    data = rec.versions() | {"cpu_flags": cpu_flags(), "configs": entries}
    rec.write_json_atomic(OUT, data)
    print(f"recorded {len(entries)} configurations in {time.monotonic() - started:.1f}s -> {OUT}")
    return 0


def cpu_flags() -> list[str]:
    """The recording CPU's flags that decide ggml-cpu's repack (avx2, avx512*, neon, ...)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return sorted(f for f in line.split(":", 1)[1].split()
                          if f.startswith(("avx", "neon", "asimd", "sve", "f16c", "fma")))
    return []


if __name__ == "__main__":
    sys.exit(main())
