"""llama.cpp's logits with a q8_0 KV cache and flash attention (`-ctk q8_0 -ctv q8_0 -fa on`),
for tests/test_kv_q8_0.py.

The bundled tiny models have 16-wide heads, which a q8_0 cache (32-value blocks) cannot hold:
llama.cpp refuses them ("K cache type q8_0 with block size 32 does not divide
n_embd_head_k=16"). So these models, written by make_tiny_gguf.py's writer (byte-identical on
every run; the sha256 is recorded), have 32- and 64-wide heads; 64 also takes llama.cpp's
Hadamard rotation of the cache (recorded
also without it, LLAMA_ATTN_ROT_DISABLE=1, to tell flash attention from the rotation). Needs llama-cpp-python 0.3.36.

    python3 scripts/llamacpp/record_kv_q8_0.py [--out tests/data/llamacpp/kv_q8_0.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_gguf import TinyModel, write_model  # noqa: E402

TOKENS = [1, 15, 100, 7, 42]
CTX, UBATCH = 256, 32
MODELS = [
    TinyModel("tiny-llama-h32-q8_0", "q8_0", n_embd=128, n_head=4, n_head_kv=2, n_ff=192, seed=5),
    TinyModel("tiny-llama-h32-f16", "f16", n_embd=128, n_head=4, n_head_kv=2, n_ff=192, seed=6),
    TinyModel("tiny-llama-h64-q8_0", "q8_0", n_embd=128, n_head=2, n_head_kv=1, n_ff=192, seed=7),
]


def logits(path: Path, kv_type: str, rotate: bool = True) -> list[float]:
    """`rotate` False: LLAMA_ATTN_ROT_DISABLE=1, read as each cache is made."""
    import os

    import llama_cpp

    os.environ["LLAMA_ATTN_ROT_DISABLE"] = "0" if rotate else "1"

    kv = {"q8_0": llama_cpp.GGML_TYPE_Q8_0, "f16": llama_cpp.GGML_TYPE_F16}[kv_type]
    model = llama_cpp.Llama(str(path), n_ctx=CTX, n_batch=512, n_ubatch=UBATCH, n_threads=2,
                            n_gpu_layers=0, flash_attn=True, type_k=kv, type_v=kv, verbose=False)
    model.eval(TOKENS)
    row = llama_cpp.llama_get_logits_ith(model.ctx, -1)
    return [float(f"{row[i]:.7g}") for i in range(model.n_vocab())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/llamacpp/kv_q8_0.json"))
    args = parser.parse_args(argv)
    import llama_cpp

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in MODELS:
            path = write_model(m, Path(tmp))
            record = {"model": vars(m), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                      "logits": {kv: logits(path, kv) for kv in ("q8_0", "f16")}}
            if m.n_embd // m.n_head % 64 == 0:     # the cache is rotated: also without it
                record["logits"]["q8_0_unrotated"] = logits(path, "q8_0", rotate=False)
            records.append(record)
    args.out.write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__, "tokens": TOKENS,
                                    "ctx": CTX, "ubatch": UBATCH, "flash_attn": True,
                                    "records": records}) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
