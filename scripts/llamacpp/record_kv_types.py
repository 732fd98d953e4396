"""llama.cpp's figures with every KV cache type, K and V apart (`-ctk T -ctv T`), for
tests/test_kv_types.py: KV bytes per backend, compute bytes, graph nodes and splits, the last
token's logits, and llama.cpp's own refusals (its error line) for the pairs it will not take.

The types are common/arg.cpp's kv_cache_types: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0,
q5_1. The models: tiny-qwen3-f16 (heads of 32: every block type fits, no rotation), a llama
of 64-wide heads written by make_tiny_gguf.py's writer (the Hadamard rotation of a quantized
K and V), tiny-gemma3-q8_0 (the iSWA pair of caches), tiny-deepseek2-f16 (MLA: K only, K and V
of one type) and tiny-llama-f16 (heads of 16, which no block type divides). Each runs on the
CPU alone (-ngl 0) and on one RPC device (-ngl all) through record.py's child and shim.c.
Needs llama-cpp-python 0.3.36 built with -DGGML_RPC=ON.

    python3 scripts/llamacpp/record_kv_types.py   # -> tests/data/llamacpp/kv_types.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO), str(HERE)]

import make_tiny_gguf as mk  # noqa: E402
import record as rec  # noqa: E402

OUT = REPO / "tests" / "data" / "llamacpp" / "kv_types.json"
EXAMPLES = REPO / "examples" / "models"
TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
CTX, UBATCH = 256, 32
# name -> a bundled file, or the TinyModel the test writes again (sha256 recorded)
WRITTEN = {"tiny-llama-h64-q8_0": mk.TinyModel("tiny-llama-h64-q8_0", "q8_0", n_embd=128,
                                                n_head=2, n_head_kv=1, n_ff=192, seed=7)}
BUNDLED = ("tiny-qwen3-f16", "tiny-gemma3-q8_0", "tiny-deepseek2-f16", "tiny-llama-f16")

SAME = [(t, t) for t in TYPES]
# K and V apart, flash attention on: each block type beside another kind of type
APART_FA = [("q8_0", "f16"), ("f16", "q4_0"), ("q4_1", "iq4_nl"), ("q5_0", "q5_1"),
            ("bf16", "f32"), ("iq4_nl", "q8_0")]
# flash attention off: a quantized K is taken (V stored transposed must not be quantized)
APART_NOFA = [("q4_0", "f16"), ("q8_0", "bf16"), ("iq4_nl", "f32"), ("q5_1", "f16"),
              ("bf16", "bf16"), ("f32", "f32"), ("f16", "bf16")]

CONFIGS: list[tuple[str, str, str, bool, int | str]] = (
    [(m, k, v, True, ngl) for m in ("tiny-qwen3-f16", "tiny-llama-h64-q8_0")
     for k, v in SAME for ngl in ("all", 0)]
    + [(m, k, v, True, "all") for m in ("tiny-qwen3-f16", "tiny-llama-h64-q8_0")
       for k, v in APART_FA]
    + [(m, k, v, False, ngl) for m in ("tiny-qwen3-f16", "tiny-llama-h64-q8_0")
       for k, v in APART_NOFA for ngl in (("all", 0) if k != v else ("all",))]
    + [("tiny-gemma3-q8_0", k, v, fa, "all") for k, v, fa in
       (("q4_0", "q4_0", True), ("iq4_nl", "q5_1", True), ("bf16", "bf16", True),
        ("q8_0", "f16", False), ("q5_0", "bf16", False))]
    + [("tiny-gemma3-q8_0", "q4_1", "q4_1", True, 0)]
    + [("tiny-deepseek2-f16", t, t, fa, ngl) for t in ("f32", "bf16") for fa in (True, False)
       for ngl in ("all", 0)]
)
# what llama.cpp refuses (or aborts on): (model, K, V, flash attention)
REFUSED = [
    ("tiny-qwen3-f16", "f16", "q8_0", False),      # a quantized V without flash attention
    ("tiny-qwen3-f16", "q4_0", "iq4_nl", False),
    ("tiny-deepseek2-f16", "f16", "bf16", True),   # MLA: K and V of one type
    ("tiny-deepseek2-f16", "q8_0", "f16", False),
    ("tiny-deepseek2-f16", "q8_0", "q8_0", True),  # 48-wide K heads, 32-value blocks
    ("tiny-llama-f16", "q4_0", "f16", True),       # 16-wide heads
    ("tiny-llama-f16", "f16", "q5_1", True),
]
# taken unchecked: without flash attention llama.cpp checks no block size, and ggml_row_size's
# assert is compiled out of the release build, so K's views split blocks (recorded, refused here)
UNCHECKED = [("tiny-llama-f16", "q8_0", "f16", False, "all")]


def config_id(model: str, k: str, v: str, fa: bool, ngl) -> str:
    return f"{model}/ctk-{k}/ctv-{v}/fa{int(fa)}/ngl{ngl}"


def refusal(text: str) -> str:
    """llama.cpp's own line: a GGML_ASSERT's (an abort), or llama_init_from_model's error."""
    lines = text.splitlines()
    for line in lines:
        if "GGML_ASSERT" in line:
            return re.sub(r"^.*?: (GGML_ASSERT)", r"\1", line.strip())
    said = [m.group(1) for line in lines
            if (m := re.search(r"llama_init_from_model: (.*\S)", line))]
    if said:
        return said[0]
    raise RuntimeError("no refusal found in:\n" + text[-2000:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="only ids containing this (a trial: "
                        "writes nothing)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    entries, refusals, models = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        paths = {name: EXAMPLES / f"{name}.gguf" for name in BUNDLED}
        paths |= {name: mk.write_model(m, workdir) for name, m in WRITTEN.items()}
        for name, path in paths.items():
            models[name] = ({"tiny": vars(WRITTEN[name])} if name in WRITTEN
                            else {"file": f"examples/models/{name}.gguf"})
            models[name]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        shim = rec.compile_shim(workdir)
        server, endpoint = rec.start_rpc_server()

        def cfg_of(model, k, v, fa, ngl):
            cfg = {"model": model, "ctx": CTX, "ubatch": UBATCH, "flash_attn": fa, "ngl": ngl,
                   "kv_type": k, "type_k": k, "type_v": v, "no_kv_offload": False,
                   "overrides": [], "tensor_split": [], "swa_full": False,
                   "path": str(paths[model]), "n_layer": rec.model_layers(paths[model])}
            return cfg | {"id": config_id(model, k, v, fa, ngl)}

        try:
            for model, k, v, fa, ngl in CONFIGS + UNCHECKED:
                cfg = cfg_of(model, k, v, fa, ngl)
                if args.only not in cfg["id"]:
                    continue
                entry, _ = rec.record_one(cfg, [endpoint], shim, workdir)
                entry["options"].pop("kv_type")
                entry["options"].update(type_k=k, type_v=v)
                entry.pop("buffers")
                if (model, k, v, fa, ngl) in UNCHECKED:
                    entry["unchecked"] = True
                entries.append(entry)
                sizes = " ".join(f"{b}:kv{f['kv_bytes']}/c{f['arena_bytes']}"
                                 for b, f in entry["backends"].items())
                print(f"{entry['id']:55s} nodes {entry['n_nodes']:4d} splits "
                      f"{entry['n_splits']:2d} {sizes}", flush=True)
            for model, k, v, fa in REFUSED:
                cfg = cfg_of(model, k, v, fa, "all")
                if args.only not in cfg["id"]:
                    continue
                try:
                    rec.record_one(cfg, [endpoint], shim, workdir)
                except RuntimeError as err:
                    said = refusal(str(err))
                else:
                    raise RuntimeError(f"{cfg['id']}: llama.cpp took it")
                refusals.append({"model": model, "type_k": k, "type_v": v, "flash_attn": fa,
                                 "llama_cpp": said})
                print(f"{cfg['id']:55s} refused: {said}", flush=True)
        finally:
            server.kill()
            server.wait()
    data = rec.versions() | {"tokens": rec.TOKENS, "ctx": CTX, "ubatch": UBATCH,
                             "backends_file": "graphs/backends/llamacpp_rpc.yaml",
                             "models": models, "configs": entries, "refused": refusals}
    if args.only:
        return 0
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"recorded {len(entries)} configurations and {len(refusals)} refusals in "
          f"{time.monotonic() - started:.0f}s -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
