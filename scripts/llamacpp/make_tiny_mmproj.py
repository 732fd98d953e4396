"""Tiny random gemma3 vision projector (mmproj) GGUFs that real libmtmd loads beside
examples/models/tiny-gemma3-f16.gguf, for tests/test_mmproj.py and record_mmproj.py.

Laid out as convert_hf_to_gguf.py writes Gemma 3's mmproj: the SigLIP tower (`v.*`: patch
embedding conv with bias, learned positions, pre-norm blocks with biased Q/K/V/O and a GELU
FFN, post-norm) and the gemma3 projector (`mm.soft_emb_norm`, `mm.input_projection`, whose
width is the text model's n_embd, 64). Fixed seeds: rerunning rewrites byte-identical files.

    python3 scripts/llamacpp/make_tiny_mmproj.py [--out tests/data/llamacpp]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants

TEXT_EMBD = 64                     # tiny-gemma3-f16.gguf's n_embd


@dataclass(frozen=True)
class TinyProjector:
    """One file: the encoder's sizes, the matrices' type (f16 or q8_0; the patch conv stays
    f16, 1-D tensors f32), the pooling kernel written as clip.vision.projector.scale_factor
    (None: the key left out, libmtmd's default 4), and `swapped`: FFN up and down stored
    under each other's names, as older conversions did (libmtmd swaps them back)."""
    name: str
    image: int
    patch: int
    hidden: int
    heads: int
    ff: int
    layers: int
    weight_type: str = "f16"
    scale_factor: int | None = None
    swapped: bool = False
    seed: int = 31
    ptype: str = "gemma3"
    deepstack: tuple[int, ...] = ()    # qwen3vl: the blocks with a deepstack merger
    out: int = TEXT_EMBD               # the projector's output width
    merge: int | None = None           # qwen3vl: clip.vision.spatial_merge_size (None: absent)


EPS = 1e-6
PROJECTORS = [
    TinyProjector("tiny-mmproj-gemma3-f16", image=64, patch=8, hidden=32, heads=2, ff=64, layers=2),
    TinyProjector("tiny-mmproj-gemma3-b-q8_0", image=96, patch=8, hidden=64, heads=4, ff=128,
                  layers=3, weight_type="q8_0", scale_factor=3, swapped=True, seed=32),
    # Qwen3-VL's layout (convert_hf_to_gguf.py Qwen3VLVisionModel): two patch convs (the two
    # temporal frames), fused QKV, M-RoPE, learned positions interpolated to the image, the
    # 2x2 merger mm.0/mm.2 and a deepstack merger on block 1; libmtmd warms it up at 46x46
    # merged tokens whatever the image size (recorded without a text model: no n_embd check)
    TinyProjector("tiny-mmproj-qwen3vl-f16", image=16, patch=4, hidden=32, heads=2, ff=64,
                  layers=3, ptype="qwen3vl_merger", deepstack=(1,), out=48, seed=33),
    # two deepstack mergers (their features concatenated), q8_0, the merge size written
    TinyProjector("tiny-mmproj-qwen3vl-b-q8_0", image=8, patch=4, hidden=64, heads=2, ff=128,
                  layers=3, weight_type="q8_0", ptype="qwen3vl_merger", deepstack=(0, 2),
                  out=32, seed=34, merge=2),
]


def tensors(p: TinyProjector) -> dict[str, np.ndarray]:
    """numpy shapes (ggml's ne reversed), f32 or f16 as they are written."""
    rng = np.random.default_rng(p.seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float16 if len(shape) > 1 else np.float32)

    if p.ptype == "qwen3vl_merger":
        return qwen3vl_tensors(p, w)

    h, n_pos = p.hidden, (p.image // p.patch) ** 2
    out = {"v.patch_embd.weight": w(h, 3, p.patch, p.patch), "v.patch_embd.bias": w(h),
           "v.position_embd.weight": w(n_pos, h)}
    for il in range(p.layers):
        b = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[b + name + ".weight"], out[b + name + ".bias"] = w(h, h), w(h)
        for name in ("ln1", "ln2"):
            out[b + name + ".weight"], out[b + name + ".bias"] = w(h) + 1, w(h)
        up, down = ("ffn_down", "ffn_up") if p.swapped else ("ffn_up", "ffn_down")
        out[b + up + ".weight"], out[b + up + ".bias"] = w(p.ff, h), w(p.ff)
        out[b + down + ".weight"], out[b + down + ".bias"] = w(h, p.ff), w(h)
    out["v.post_ln.weight"], out["v.post_ln.bias"] = w(h) + 1, w(h)
    out["mm.soft_emb_norm.weight"] = w(h)
    out["mm.input_projection.weight"] = w(h, TEXT_EMBD)    # ne [TEXT_EMBD, hidden]
    return out


def qwen3vl_tensors(p: TinyProjector, w) -> dict[str, np.ndarray]:
    h, merged = p.hidden, 4 * p.hidden
    out = {"v.patch_embd.weight": w(h, 3, p.patch, p.patch),
           "v.patch_embd.weight.1": w(h, 3, p.patch, p.patch), "v.patch_embd.bias": w(h),
           # f32: ggml_interpolate takes f32 only (convert writes it so)
           "v.position_embd.weight": w((p.image // p.patch) ** 2, h).astype(np.float32)}
    for il in range(p.layers):
        b = f"v.blk.{il}."
        out[b + "attn_qkv.weight"], out[b + "attn_qkv.bias"] = w(3 * h, h), w(3 * h)
        out[b + "attn_out.weight"], out[b + "attn_out.bias"] = w(h, h), w(h)
        for name in ("ln1", "ln2"):
            out[b + name + ".weight"], out[b + name + ".bias"] = w(h) + 1, w(h)
        out[b + "ffn_up.weight"], out[b + "ffn_up.bias"] = w(p.ff, h), w(p.ff)
        out[b + "ffn_down.weight"], out[b + "ffn_down.bias"] = w(h, p.ff), w(h)
        if il in p.deepstack:
            d = f"v.deepstack.{il}."
            out[d + "norm.weight"], out[d + "norm.bias"] = w(merged) + 1, w(merged)
            out[d + "fc1.weight"], out[d + "fc1.bias"] = w(merged, merged), w(merged)
            out[d + "fc2.weight"], out[d + "fc2.bias"] = w(p.out, merged), w(p.out)
    out["v.post_ln.weight"], out["v.post_ln.bias"] = w(h) + 1, w(h)
    out["mm.0.weight"], out["mm.0.bias"] = w(merged, merged), w(merged)
    out["mm.2.weight"], out["mm.2.bias"] = w(p.out, merged), w(p.out)
    return out


def write(p: TinyProjector, out_dir: Path) -> Path:
    path = out_dir / f"{p.name}.gguf"
    tmp = path.with_suffix(".gguf.tmp")
    writer = GGUFWriter(str(tmp), "clip")
    writer.add_name(p.name)
    writer.add_file_type(7 if p.weight_type == "q8_0" else 1)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", p.ptype)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", p.image)
    writer.add_uint32("clip.vision.patch_size", p.patch)
    writer.add_uint32("clip.vision.embedding_length", p.hidden)
    writer.add_uint32("clip.vision.feed_forward_length", p.ff)
    writer.add_uint32("clip.vision.block_count", p.layers)
    writer.add_uint32("clip.vision.projection_dim", p.out)
    writer.add_uint32("clip.vision.attention.head_count", p.heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", EPS)
    if p.deepstack:
        writer.add_array("clip.vision.is_deepstack_layers",
                         [il in p.deepstack for il in range(p.layers)])
    if p.merge is not None:
        writer.add_uint32("clip.vision.spatial_merge_size", p.merge)
    if p.scale_factor is not None:
        writer.add_uint32("clip.vision.projector.scale_factor", p.scale_factor)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for name, data in tensors(p).items():
        if p.weight_type == "q8_0" and data.ndim == 2 and name != "v.position_embd.weight":
            # (the patch convs are 4-D and stay f16, as convert keeps them)
            qtype = GGMLQuantizationType.Q8_0
            writer.add_tensor(name, quants.quantize(data.astype(np.float32), qtype), raw_dtype=qtype)
        else:
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
    out = parser.parse_args(argv).out
    for p in PROJECTORS:
        print(write(p, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
