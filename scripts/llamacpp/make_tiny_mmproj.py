"""A tiny random gemma3 vision projector (mmproj) GGUF that real libmtmd loads beside
examples/models/tiny-gemma3-f16.gguf, for tests/test_mmproj.py and record_mmproj.py.

Laid out as convert_hf_to_gguf.py writes Gemma 3's mmproj: the SigLIP tower (`v.*`: patch
embedding conv with bias, learned positions, pre-norm blocks with biased Q/K/V/O and a GELU
FFN, post-norm) and the gemma3 projector (`mm.soft_emb_norm`, `mm.input_projection`, whose
width is the text model's n_embd, 64). 1-D tensors f32, the rest f16. Fixed seed: rerunning
rewrites a byte-identical file.

    python3 scripts/llamacpp/make_tiny_mmproj.py [--out tests/data/llamacpp]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

IMAGE, PATCH, HIDDEN, HEADS, FF, LAYERS, TEXT_EMBD = 64, 8, 32, 2, 64, 2, 64
EPS = 1e-6


def tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """numpy shapes (ggml's ne reversed)."""
    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float16 if len(shape) > 1 else np.float32)

    n_pos = (IMAGE // PATCH) ** 2
    out = {"v.patch_embd.weight": w(HIDDEN, 3, PATCH, PATCH), "v.patch_embd.bias": w(HIDDEN),
           "v.position_embd.weight": w(n_pos, HIDDEN)}
    for il in range(LAYERS):
        p = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[p + name + ".weight"], out[p + name + ".bias"] = w(HIDDEN, HIDDEN), w(HIDDEN)
        for name in ("ln1", "ln2"):
            out[p + name + ".weight"], out[p + name + ".bias"] = w(HIDDEN) + 1, w(HIDDEN)
        out[p + "ffn_up.weight"], out[p + "ffn_up.bias"] = w(FF, HIDDEN), w(FF)
        out[p + "ffn_down.weight"], out[p + "ffn_down.bias"] = w(HIDDEN, FF), w(HIDDEN)
    out["v.post_ln.weight"], out["v.post_ln.bias"] = w(HIDDEN) + 1, w(HIDDEN)
    out["mm.soft_emb_norm.weight"] = w(HIDDEN)
    out["mm.input_projection.weight"] = w(HIDDEN, TEXT_EMBD)    # ne [TEXT_EMBD, HIDDEN]
    return out


def write(out_dir: Path) -> Path:
    path = out_dir / "tiny-mmproj-gemma3-f16.gguf"
    tmp = path.with_suffix(".gguf.tmp")
    writer = GGUFWriter(str(tmp), "clip")
    writer.add_name("tiny-mmproj-gemma3")
    writer.add_file_type(1)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", IMAGE)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", HIDDEN)
    writer.add_uint32("clip.vision.feed_forward_length", FF)
    writer.add_uint32("clip.vision.block_count", LAYERS)
    writer.add_uint32("clip.vision.projection_dim", TEXT_EMBD)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", EPS)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for name, data in tensors(np.random.default_rng(31)).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/llamacpp"))
    print(write(parser.parse_args(argv).out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
