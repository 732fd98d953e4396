"""PROJECTOR_TYPE_GEMMA3 (tools/mtmd/models/siglip.cpp, clip_graph_siglip): the SigLIP ViT
over the warm-up image, its patches average-pooled n_merge x n_merge (ggml_pool_2d), an RMS
norm by mm.soft_emb_norm and the projection into the text model's width by
mm.input_projection (transposed, made contiguous, then ggml_mul_mat)."""

from __future__ import annotations

from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.models.projector.vit import ClipGraph


def build(g: ClipGraph) -> tuple[Graph, Tensor]:
    b, hp = g.b, g.hp
    cur = g.build_vit(g.build_inp(), g.w("v.position_embd.weight"))
    side, k = g.n_patches_x, hp.n_merge
    cur = b.transpose(cur)
    cur = b.cont(cur, (1, hp.n_embd, side, side))
    out = (side - k) // k + 1
    cur = g.op("pool_2d", [cur], (1, hp.n_embd, out, out), op="avg", k0=k, k1=k, s0=k, s1=k,
               p0=0.0, p1=0.0)
    cur = b.reshape(cur, (1, hp.n_embd, out * out))
    cur = b.cont(b.transpose(cur))
    cur = g.op("rms_norm", [cur], cur.shape, eps=hp.eps)
    cur = g.mul(cur, g.need("mm.soft_emb_norm.weight"))
    proj = b.cont(b.transpose(g.need("mm.input_projection.weight")))
    cur = g.mul_mat(proj, cur)
    b.expand(cur)
    return b.graph("mmproj", [cur]), cur
