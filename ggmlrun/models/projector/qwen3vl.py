"""PROJECTOR_TYPE_QWEN3VL (tools/mtmd/models/qwen3vl.cpp, clip_graph_qwen3vl): the two
temporal patch convs added, patches merged 2x2 in order (permute, cont, reshape), the bias,
learned positions interpolated to the image (resize_position_embeddings, bilinear with
aligned corners) and merged the same way, then pre-norm ViT blocks with a fused QKV and
M-RoPE (vision mode, 4 positions per patch), a deepstack merger after each block that has
one, the final norm and the 2x2 merger (mm.0, GELU, mm.2); the deepstack features are
concatenated after the merger's output."""

from __future__ import annotations

import math

from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.graph.builder import GraphBuilder
from ggmlrun.models.projector.vit import ClipGraph

ROPE_TYPE_VISION = 24                 # ggml.h GGML_ROPE_TYPE_VISION
SCALE_BILINEAR_ALIGN_CORNERS = 1 | (1 << 8)    # GGML_SCALE_MODE_BILINEAR | FLAG_ALIGN_CORNERS


def _merge_2x2(g: ClipGraph, t: Tensor) -> Tensor:
    """[.., npy, npx, E] rows in patch order -> each 2x2 block's 4 patches next to each other:
    cont_4d(2E, npx/2, npy, 1), reshape_4d(2E, npx/2, 2, npy/2), permute(0, 2, 1, 3),
    cont_3d(E, n_patches, 1)."""
    b, e = g.b, g.hp.n_embd
    px, py = g.n_patches_x, g.n_patches_y
    t = b.cont(t, (1, py, px // 2, 2 * e))
    t = b.reshape(t, (py // 2, 2, px // 2, 2 * e))
    t = b.permute(t, (0, 2, 1, 3))
    return b.cont(t, (1, px * py, e))


def _positions(g: ClipGraph) -> Tensor:
    """resize_position_embeddings: the learned grid as it is when the image has its size,
    else bilinearly interpolated (ggml_interpolate) to the patches."""
    b, e = g.b, g.hp.n_embd
    pos = g.need("v.position_embd.weight")
    side = math.isqrt(pos.shape[0])
    w, h = g.n_patches_x, g.n_patches_y
    if (w, h) == (side, side):
        return pos
    if pos.dtype != "f32":
        raise InputError(f"--mmproj: 'v.position_embd.weight' is {pos.dtype}; libmtmd "
                         f"interpolates it with ggml_interpolate, which takes f32 only (it "
                         f"aborts)")
    pos = b.reshape(pos, (side, side, e))
    pos = b.permute(pos, (2, 0, 1))
    pos = g.op("upscale", [pos], (1, e, h, w), mode=SCALE_BILINEAR_ALIGN_CORNERS)
    pos = b.permute(pos, (0, 2, 3, 1))
    return b.cont(pos, (w * h, e))


def build(g: ClipGraph) -> tuple[Graph, Tensor]:
    b, hp = g.b, g.hp
    e, n_pos, d_head = hp.n_embd, g.n_patches, hp.d_head
    raw = g.inp_raw()
    inp = g.op("add", [g.conv_2d(g.need("v.patch_embd.weight"), raw),
                       g.conv_2d(g.need("v.patch_embd.weight.1"), raw)],
               (1, e, g.n_patches_y, g.n_patches_x))
    inp = _merge_2x2(g, b.permute(inp, (0, 2, 3, 1)))              # [w, h, c] -> [c, w, h]
    inp = b.cb(g.add(inp, g.need("v.patch_embd.bias")), "patch_bias", -1)
    inp = b.cb(g.add(inp, _merge_2x2(g, _positions(g))), "inp_pos_emb", -1)
    positions = GraphBuilder.leaf("positions", (4 * n_pos,), "i32", role="input")
    inpL = inp
    if g.w("v.pre_ln.weight") is not None:
        inpL = g.norm(inpL, g.w("v.pre_ln.weight"), g.w("v.pre_ln.bias"))
    merge = hp.n_merge * hp.n_merge if hp.n_merge > 0 else 4
    rope = dict(n_dims=d_head // 2, mode=ROPE_TYPE_VISION, sections=[d_head // 4] * 4,
                n_ctx_orig=32768, freq_base=10000.0, freq_scale=1.0, ext_factor=0.0,
                attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
    deepstack = None
    for il in range(hp.n_layer):
        blk, ds = f"v.blk.{il}.", f"v.deepstack.{il}."
        cur = g.norm(inpL, g.w(blk + "ln1.weight"), g.w(blk + "ln1.bias"))
        cur = g.add(g.mul_mat(g.need(blk + "attn_qkv.weight"), cur), g.w(blk + "attn_qkv.bias"))
        row, f = cur.strides[-2], cur.strides[-1]
        q, k, v = (b.view(cur, (n_pos, hp.n_head, d_head), (row, d_head * f, f), i * e * f)
                   for i in range(3))
        q, k = (g.op("rope", [t, positions], t.shape, **rope) for t in (q, k))
        cur = g.build_attn(q, k, v, il)
        cur = g.add(g.mul_mat(g.need(blk + "attn_out.weight"), cur), g.w(blk + "attn_out.bias"))
        cur = g.op("add", [cur, inpL], cur.shape)
        inpL = cur
        cur = g.norm(cur, g.w(blk + "ln2.weight"), g.w(blk + "ln2.bias"))
        cur = g.ffn(cur, g.need(blk + "ffn_up.weight"), g.w(blk + "ffn_up.bias"),
                    g.need(blk + "ffn_down.weight"), g.w(blk + "ffn_down.bias"), g.ffn_op())
        cur = g.op("add", [inpL, cur], inpL.shape)
        if g.w(ds + "fc1.weight") is not None:
            feat = b.reshape(cur, (1, n_pos // merge, e * merge))
            feat = g.norm(feat, g.w(ds + "norm.weight"), g.w(ds + "norm.bias"))
            feat = g.ffn(feat, g.need(ds + "fc1.weight"), g.w(ds + "fc1.bias"),
                         g.need(ds + "fc2.weight"), g.w(ds + "fc2.bias"), "gelu")
            deepstack = feat if deepstack is None else g.op(
                "concat", [deepstack, feat], (*feat.shape[:-1], deepstack.shape[-1]
                                              + feat.shape[-1]), axis=-1)
        inpL = cur
    if g.w("v.post_ln.weight") is not None:
        inpL = g.norm(inpL, g.w("v.post_ln.weight"), g.w("v.post_ln.bias"))
    cur = b.reshape(inpL, (1, n_pos // 4, e * 4))
    cur = g.ffn(cur, g.need("mm.0.weight"), g.w("mm.0.bias"), g.need("mm.2.weight"),
                g.w("mm.2.bias"), "gelu")
    if deepstack is not None:
        cur = g.op("concat", [cur, deepstack],
                   (*cur.shape[:-1], cur.shape[-1] + deepstack.shape[-1]), axis=-1)
    b.expand(cur)
    return b.graph("mmproj", [cur]), cur
