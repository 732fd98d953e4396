"""llama.cpp's figures under llama-server's defaults, for tests/test_server_defaults.py:
`-fa auto` (llama_context_params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO) and `-np` auto
(tools/server/server.cpp: n_parallel 4, kv_unified true -> n_seq_max 4, one KV stream), with
the context and ubatch ggmlrun defaults to (min(n_ctx_train, 4096), 512). Per configuration:
bytes per backend, nodes and splits, and which flash attention llama.cpp resolved (its log:
"resolve_fused_ops: Flash Attention enabled" or "... not supported, set to disabled").

The models: a dense llama, gemma3 (iSWA: the SWA cache of 4 windows), qwen3moe and qwen35
(hybrid: 4 recurrent state rows). Each on the CPU alone, on one RPC device with every layer
(-ngl all) and with none (-ngl 0); a few more where the answer could differ: -nkvo (the cache on
the CPU while the layers are not, llama.cpp's probe's own TODO), llama-cli's -np 1, -ctv q8_0
(auto enabled outright), -fa off under -np auto. Needs llama-cpp-python 0.3.36 built with
-DGGML_RPC=ON; record.py's child and shim.c do the work.

    python3 scripts/llamacpp/record_server_defaults.py  # -> tests/data/llamacpp/server_defaults.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE)]

import record as rec  # noqa: E402

OUT = REPO / "tests" / "data" / "llamacpp" / "server_defaults.json"
EXAMPLES = REPO / "examples" / "models"
MODELS = ("tiny-llama-f16", "tiny-gemma3-q8_0", "tiny-qwen3moe-f16", "tiny-qwen35-q8_0")
EXTRA_MODELS = ("tiny-qwen3-f16",)        # heads of 32: a q8_0 V cache fits
SERVER = {"parallel": 4, "kv_unified": True}          # -np auto as server.cpp sets it
# (model, where, extra options): where is "cpu" (no RPC device) or "rpc" (one RPC device)
CONFIGS = ([(m, "cpu", {"ngl": 0}) for m in MODELS]
           + [(m, "rpc", {"ngl": "all"}) for m in MODELS]
           + [(m, "rpc", {"ngl": 0}) for m in MODELS]
           + [("tiny-llama-f16", "rpc", {"ngl": "all", "no_kv_offload": True}),
              ("tiny-gemma3-q8_0", "rpc", {"ngl": 3, "no_kv_offload": True}),
              ("tiny-llama-f16", "rpc", {"ngl": "all", "parallel": 1, "kv_unified": False}),
              ("tiny-qwen35-q8_0", "rpc", {"ngl": 2, "parallel": 2, "kv_unified": False}),
              ("tiny-qwen3-f16", "rpc", {"ngl": 2, "type_v": "q8_0"}),
              ("tiny-gemma3-q8_0", "rpc", {"ngl": "all", "flash_attn": False})])
FA_LINE = re.compile(r"resolve_fused_ops: Flash Attention (enabled|not supported, set to disabled)")


def config_id(model: str, where: str, extra: dict) -> str:
    words = [f"{k}-{v}" for k, v in extra.items()]
    return "/".join([model, where] + words)


def n_ctx_train(path: Path) -> int:
    from gguf import GGUFReader
    fields = GGUFReader(path).fields
    arch = fields["general.architecture"].contents()
    return int(fields[f"{arch}.context_length"].contents())


def record(cfg: dict, endpoints: list[str], shim: Path, workdir: Path) -> tuple[dict, str]:
    """record.record_one, keeping llama.cpp's log (the flash attention it resolved)."""
    shim_log = workdir / "shim.log"
    shim_log.unlink(missing_ok=True)
    env = dict(os.environ, LD_PRELOAD=str(shim), SHIM_LOG=str(shim_log), GGML_SCHED_DEBUG="2",
               OMP_NUM_THREADS=str(rec.N_THREADS))
    proc = subprocess.run([sys.executable, rec.__file__, "--child", json.dumps(cfg),
                           "--endpoints", ",".join(endpoints)], env=env, capture_output=True,
                          text=True, timeout=300, preexec_fn=rec.cap_memory)
    if proc.returncode != 0:
        raise RuntimeError(f"{cfg['id']}: llama.cpp child failed:\n{proc.stderr[-3000:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    log = child["log"]
    entry, _ = rec.figures_of(cfg, child, shim_log.read_text(), endpoints)
    return entry, log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only ids containing this (writes nothing)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    entries, models = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        paths = {name: EXAMPLES / f"{name}.gguf" for name in MODELS + EXTRA_MODELS}
        for name, path in paths.items():
            models[name] = {"file": f"examples/models/{name}.gguf",
                            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        shim = rec.compile_shim(workdir)
        server, endpoint = rec.start_rpc_server()
        try:
            for model, where, extra in CONFIGS:
                cid = config_id(model, where, extra)
                if args.only not in cid:
                    continue
                path = paths[model]
                opts = {"ctx": min(n_ctx_train(path), 4096), "ubatch": 512, "flash_attn": "auto",
                        "kv_type": "f16", "no_kv_offload": False, "overrides": [],
                        "tensor_split": [], "swa_full": False, **SERVER, **extra}
                cfg = opts | {"model": model, "id": cid, "path": str(path),
                              "n_layer": rec.model_layers(path)}
                entry, log = record(cfg, [endpoint] if where == "rpc" else [], shim, workdir)
                found = FA_LINE.search(log)
                entry["where"] = where
                entry["options"] |= {k: opts[k] for k in ("parallel", "kv_unified", "flash_attn")}
                entry["options"] |= {k: extra[k] for k in ("type_v",) if k in extra}
                entry["flash_attn_resolved"] = (None if not found
                                                else found.group(1) == "enabled")
                entry.pop("buffers")
                entry.pop("logits")
                entries.append(entry)
                sizes = " ".join(f"{b}:kv{f['kv_bytes']}/c{f['arena_bytes']}"
                                 for b, f in entry["backends"].items())
                print(f"{cid:60s} fa {entry['flash_attn_resolved']} nodes {entry['n_nodes']:4d} "
                      f"splits {entry['n_splits']:2d} {sizes}", flush=True)
        finally:
            server.kill()
            server.wait()
    data = rec.versions() | {"tokens": rec.TOKENS,
                             "backends_file": "graphs/backends/llamacpp_rpc.yaml",
                             "models": models, "configs": entries}
    if args.only:
        return 0
    OUT.write_text(json.dumps(data, indent=0, separators=(",", ":")) + "\n")
    print(f"recorded {len(entries)} configurations in {time.monotonic() - started:.0f}s -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
