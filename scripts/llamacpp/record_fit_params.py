"""llama.cpp's own --fit (common_fit_params, common/fit.cpp) recorded on the tiny models, for
tests/test_llamacpp_fit.py (issue 30 item 2).

fit_params_driver.cpp runs common_fit_params as tools/fit-params does (built here from the
vendored fit.cpp and log.cpp, linked against llama-cpp-python's libllama: the whole
llama-fit-params target needs all of libcommon, an hour on two cores). The devices are RPC
servers on loopback ports (record.py's); fit_mem_shim.c, preloaded into the driver, makes each
report the free memory a case gives it (bytes, picked around the model's needs so the answers
land on edges: a layer more or less, experts moved, the context shortened). Each case records
what the driver prints (`-c N -ngl N [-ts ..] [-ot "..."]`) or llama.cpp's refusal message.

    python3 scripts/llamacpp/record_fit_params.py   # -> tests/data/llamacpp/fit_params.json
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE)]

import record as rec  # noqa: E402

OUT = REPO / "tests" / "data" / "llamacpp" / "fit_params.json"
VENDOR = Path("/tmp/x/lcp/vendor/llama.cpp")
GiB = 1 << 30

# (model, devices: each a fraction of the model's device bytes at every layer, options)
FA = {"flash_attn": "on"}     # off, the compute buffer outweighs the tiny layers
DENSE = ["tiny-llama-f16", "tiny-gemma3-f16", "tiny-qwen35-f16"]
MOE = ["tiny-qwen3moe-f16", "tiny-gpt-oss-f16", "tiny-glm4moe-f16"]
CASES = (
    [(m, [f], FA) for m in DENSE for f in (0.2, 0.5, 0.8, 1.2)]
    + [(m, [a, b], FA) for m in DENSE for a, b in ((0.2, 0.3), (0.5, 0.3), (0.8, 0.8))]
    + [(m, [f], FA) for m in MOE for f in (0.1, 0.3, 0.5, 0.8)]
    + [(m, [a, b], FA) for m in MOE for a, b in ((0.2, 0.2), (0.4, 0.3), (0.6, 0.5))]
    + [("tiny-llama-f16", [0.5], {}),                  # flash attention off
       ("tiny-qwen3moe-f16", [0.4], {}),
       # MoE over two devices, flash attention off: a layer's FFN overflowing to the next device
       ("tiny-glm4moe-f16", [0.6, 0.5], {}),
       ("tiny-qwen3moe-f16", [0.6, 0.5], {}),
       ("tiny-gpt-oss-f16", [0.6, 0.5], {}),
       ("tiny-llama-f16", [0.5], {"fit_ctx": 256}),
       ("tiny-llama-f16", [0.3, 0.3], {"fit_ctx": 256}),
       ("tiny-qwen3moe-f16", [0.5], {"fit_ctx": 256, "parallel": 2}),
       ("tiny-llama-f16", [0.6], {"ctx": 1024}),
       ("tiny-llama-f16", [0.6], {"parallel": 2, "kv_unified": True}),
       # refusals
       ("tiny-llama-f16", [0.5], {"ngl": 3}),
       ("tiny-llama-f16", [0.3, 0.3], {"ts": [1, 1]}),
       ("tiny-llama-f16", [0.3], {"split_mode": "tensor"}),
       ("tiny-qwen3moe-f16", [0.3], {"ot": [r"blk\.0\.ffn_up_exps=CPU"]}),
       ("tiny-qwen3moe-f16", [0.3], {"n_cpu_moe": 1}),
       ("tiny-llama-f16", [2.0], {"ngl": 3}),          # fits: no change, nothing refused
       ("tiny-llama-f16", [], {"cpu_bytes": 0.5}),      # CPU only: too small
       ("tiny-llama-f16", [], {"cpu_bytes": 3.0}),      # CPU only: fits
       ("tiny-llama-f16", [], {"cpu_bytes": 0.6, "fit_ctx": 256}),
       ]
)


def build(workdir: Path) -> tuple[Path, Path]:
    """The driver and the shim, against the vendored sources and the installed libraries."""
    lib = rec.llama_cpp_dir() / "lib"
    inc = lib.parents[1] / "include"
    driver, shim = workdir / "fit_driver", workdir / "fit_mem_shim.so"
    common = VENDOR / "common"
    # -DNDEBUG as in a release build (llama-server's): fit.cpp's asserts are off there
    subprocess.run(["g++", "-O1", "-DNDEBUG", "-std=c++17", f"-I{inc}", f"-I{common}",
                    f"-I{VENDOR / 'src'}", f"-I{VENDOR / 'vendor'}", "-o", str(driver),
                    str(HERE / "fit_params_driver.cpp"),
                    str(common / "fit.cpp"), str(common / "log.cpp"), str(common / "json.cpp"),
                    f"-L{lib}", "-lllama", "-lggml", "-lggml-base", "-lggml-cpu", "-lggml-rpc",
                    f"-Wl,-rpath,{lib}"], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", f"-I{inc}", "-o", str(shim),
                    str(HERE / "fit_mem_shim.c"), "-ldl"], check=True)
    return driver, shim


def needs(model: str, opts: dict) -> tuple[int, int]:
    """The bytes the model takes on one device at every layer, and on the CPU alone, at its
    training context (ggmlrun's measure: only to pick device sizes near the edges)."""
    from ggmlrun.core.frontend.backends_file import load_backends
    from ggmlrun.models.modelfile import read_gguf
    from ggmlrun.models.reserve import measure_model

    m = read_gguf(REPO / "examples" / "models" / f"{model}.gguf")
    backends = load_backends(REPO / "graphs" / "backends" / "llamacpp_rpc.yaml")
    o = model_options(opts, m.hparams.n_ctx_train)
    dev = measure_model(m, backends, o).backends[0]
    cpu = measure_model(m, [backends[-1]], replace(o, ngl=0)).backends[0]
    return (dev.weights_bytes + dev.kv_bytes + dev.state_bytes + dev.arena_bytes,
            cpu.weights_bytes + cpu.kv_bytes + cpu.state_bytes + cpu.arena_bytes)


def model_options(opts: dict, n_ctx_train: int):
    from ggmlrun.models.options.params import ModelOptions

    return ModelOptions(ctx=opts.get("ctx", n_ctx_train),
                        flash_attn=opts.get("flash_attn") == "on",
                        parallel=opts.get("parallel", 1), kv_unified=opts.get("kv_unified", False))


def run_case(driver, shim, endpoints, model, fractions, opts) -> dict:
    dev_need, cpu_need = needs(model, opts)
    devices = [GiB + int(f * dev_need) for f in fractions]
    eps = endpoints[:len(devices)]
    mem = [f"{ep}={size}" for ep, size in zip(eps, devices)]
    cpu = int(opts["cpu_bytes"] * cpu_need) if "cpu_bytes" in opts else None
    if cpu is not None:
        mem.append(f"CPU={GiB + cpu}")
    args = [str(driver), f"model={REPO / 'examples' / 'models' / (model + '.gguf')}",
            f"flash_attn={opts.get('flash_attn', 'off')}",
            f"parallel={opts.get('parallel', 1)}",
            f"kv_unified={int(opts.get('kv_unified', False))}",
            f"fit_ctx={opts.get('fit_ctx', 4096)}"]
    if eps:
        args.append("rpc=" + ",".join(eps))
    for key in ("ctx", "ngl", "split_mode"):
        if key in opts:
            args.append(f"{key}={opts[key]}")
    if "ts" in opts:
        args.append("ts=" + ",".join(map(str, opts["ts"])))
    for rule in opts.get("ot", []):
        args.append("ot=" + rule.rsplit("=", 1)[0])
    for i in range(opts.get("n_cpu_moe", 0)):      # common/arg.cpp's llm_ffn_block_regex
        args.append(f"ot=blk\\.{i}\\.ffn_(up|down|gate|gate_up)_(ch|)exps")
    env = dict(os.environ, FIT_MEM=";".join(mem), LD_PRELOAD=str(shim))
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    if not out.stdout.strip():
        sys.exit(f"record_fit_params.py: the driver failed on {model} {fractions} {opts}:\n"
                 f"{out.stderr[-2000:]}")
    line = out.stdout.strip().splitlines()[-1]
    case = {"model": model, "devices": devices, "cpu_bytes": None if cpu is None else GiB + cpu,
            "options": {k: v for k, v in opts.items() if k != "cpu_bytes"}}
    if line.startswith("REFUSED"):
        why = re.search(r"failed to fit params to free device memory: (.*)", out.stderr)
        return case | {"refused": why.group(1).strip() if why else out.stderr.strip()[-300:]}
    got = re.fullmatch(r'-c (\d+) -ngl (-?\d+)(?: -ts ([\d,]+))?(?: -ot "(.*)")?', line)
    ot = got.group(4).split(",") if got.group(4) else []
    names = {f"RPC0[{ep}]": f"RPC{i}" for i, ep in enumerate(eps)}
    ot = [re.sub(r"=(RPC0\[[^\]]+\])$", lambda m: "=" + names[m.group(1)], r) for r in ot]
    return case | {"refused": None, "ctx": int(got.group(1)), "ngl": int(got.group(2)),
                   "tensor_split": [int(x) for x in got.group(3).split(",")] if got.group(3)
                   else None, "override_tensor": ot}


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        driver, shim = build(Path(tmp))
        servers = [rec.start_rpc_server() for _ in range(2)]
        try:
            endpoints = [ep for _, ep in servers]
            cases = [run_case(driver, shim, endpoints, *c) for c in CASES]
        finally:
            for server, _ in servers:
                server.kill()
    OUT.write_text(json.dumps({"llama_cpp": "llama-cpp-python 0.3.36 (vendored common/fit.cpp)",
                               "backends": "graphs/backends/llamacpp_rpc2.yaml",
                               "cases": cases}, indent=1) + "\n")
    print(f"{len(cases)} cases -> {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
