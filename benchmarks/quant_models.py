"""The GGUF files bench_quant runs: the bundled tiny llamas and a one-layer 8B-dims llama,
each as q8_0, q4_0 and q4_K.

The f16 source of the 8B-dims layer is written by scripts/llamacpp/make_tiny_gguf.py's own
writer (imported, not copied); the quantized files come from llama.cpp's quantizer
(`llama_model_quantize`, pure: every matrix the one type), so they are the files llama.cpp
itself would make. Everything lands in a cache directory (scratch/quant_models by default,
git-ignored) and is reused while present: the 8B-dims f16 source is 0.4 GiB.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "llamacpp"))

import make_tiny_gguf as tiny   # noqa: E402  (a script directory, not a package)

CACHE = ROOT / "scratch" / "quant_models"
BUNDLED = ROOT / "examples" / "models"
TYPES = ("q8_0", "q4_0", "q4_K")

# Llama-3-8B's layer: dim 4096, 32 heads / 8 kv heads, ffn 14336; the vocabulary stays tiny
LAYER_8B = tiny.TinyModel("llama8b-dims-1layer-f16", "f16", n_embd=4096, n_head=32,
                          n_head_kv=8, n_ff=14336, n_layer=1, seed=11)


def llama_cpp_or_none():
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


def quantize(llama_cpp, source: Path, target: Path, qtype: str) -> Path:
    """llama.cpp's quantizer, every matrix as `qtype` (pure); written under a temporary name
    and renamed, so a half-written file is never taken for a finished one."""
    if target.exists():
        return target
    ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
             "q4_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S}[qtype]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.pure = True
    params.nthread = 2
    tmp = target.with_suffix(".gguf.tmp")
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize {source} -> {qtype} failed ({rc})")
    tmp.replace(target)
    return target


def model_files(big: bool, cache: Path = CACHE) -> dict[str, dict[str, Path]]:
    """{model: {type: path}}; without llama-cpp-python only the bundled tiny q8_0 file (the
    quantizer is llama.cpp's), and the 8B-dims layer only when `big`."""
    files: dict[str, dict[str, Path]] = {"tiny-llama": {"q8_0": BUNDLED / "tiny-llama-q8_0.gguf"}}
    llama_cpp = llama_cpp_or_none()
    if llama_cpp is None:
        return files
    cache.mkdir(parents=True, exist_ok=True)
    llama_cpp.llama_backend_init()
    for qtype in ("q4_0", "q4_K"):
        files["tiny-llama"][qtype] = quantize(llama_cpp, BUNDLED / "tiny-llama-f16.gguf",
                                              cache / f"tiny-llama-{qtype}.gguf", qtype)
    if big:
        source = cache / f"{LAYER_8B.name}.gguf"
        if not source.exists():
            tiny.write_model(LAYER_8B, cache)
        files["llama8b-1layer"] = {
            qtype: quantize(llama_cpp, source, cache / f"llama8b-dims-1layer-{qtype}.gguf", qtype)
            for qtype in TYPES}
    return files


if __name__ == "__main__":
    for model, by_type in model_files(big="--quick" not in sys.argv).items():
        for qtype, path in by_type.items():
            print(f"{model:16s} {qtype:5s} {path}  {path.stat().st_size:,} bytes")
