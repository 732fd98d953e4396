"""clip_graph's shared pieces (tools/mtmd/clip.cpp): the raw image input and its patch
embedding (build_inp: ggml_conv_2d, which is im2col + mul_mat + permute), the ViT blocks
(build_vit with build_norm, build_attn, build_ffn) over one image at the warm-up size.

Each call is one of clip.cpp's, in its order, on models/graph/builder.py's GraphBuilder, so
the nodes and their order are libmtmd's. Tensors clip loads only when present (biases, pre /
post norms, layer scales) enter the graph only when the file has them, as in clip.cpp.
`im2col`, `pool_2d` and `upscale` (ggml_interpolate) are ggml ops ggmlrun only sizes (the
projector is never computed), kept out of the op registry of graph files: their shapes are
ggml's (ggml_calc_conv_output_size, ggml_calc_pool_output_size, the sizes asked for), and
none of them is one ggml's allocator runs in place.
"""

from __future__ import annotations

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.graph.builder import GraphBuilder
from ggmlrun.models.projector.clip import ClipModel

UNSUPPORTED_TENSORS = ("attn_qkv", "attn_q_norm", "attn_k_norm", "ffn_gate")
# load_tensors' is_ffn_swapped: the types whose up/down it swaps back when stored the other way
FFN_SWAPPED = ("mlp", "mlp_norm", "ldp", "ldpv2", "qwen2vl_merger", "qwen2.5vl_merger",
               "exaone4_5", "glm_edge", "gemma3", "idefics3", "minicpmv", "minicpmv4_6")


class ClipGraph:
    """One warm-up graph: `flash_attn` as resolved (clip's CLIP_FLASH_ATTN_TYPE_ENABLED)."""

    def __init__(self, model: ClipModel, flash_attn: bool):
        self.hp, self.flash_attn = model.hparams, flash_attn
        self.b = GraphBuilder()
        self.weights = {name: GraphBuilder.leaf(name, t.shape, t.dtype, role="weight")
                        for name, t in model.tensors.items()}
        size = self.hp.warmup_image_size
        self.nx = self.ny = size
        self.n_patches_x = self.n_patches_y = size // self.hp.patch_size
        self.n_patches = self.n_patches_x * self.n_patches_y

    # --- helpers -----------------------------------------------------------------------------
    def w(self, name: str) -> Tensor | None:
        return self.weights.get(name)

    def need(self, name: str) -> Tensor:
        if name not in self.weights:
            raise InputError(f"--mmproj: the file lacks tensor '{name}' (libmtmd: unable to "
                             f"find tensor {name})")
        return self.weights[name]

    def op(self, kind: str, srcs: list[Tensor], dims, out_dtype: str = "f32", **params) -> Tensor:
        return self.b.op(kind, srcs, dims, out_dtype, **params)

    def mul_mat(self, a: Tensor, x: Tensor) -> Tensor:
        """ggml_mul_mat(a, x): a [.., M, K], x [.., N, K] -> [.., N, M], f32."""
        batch = x.shape[:-2] if len(x.shape) >= len(a.shape) else a.shape[:-2]
        return self.op("mul_mat", [a, x], (*batch, x.shape[-2], a.shape[-2]))

    def add(self, a: Tensor, c: Tensor | None) -> Tensor:
        return a if c is None else self.op("add", [a, c], a.shape)

    def mul(self, a: Tensor, c: Tensor | None) -> Tensor:
        return a if c is None else self.op("mul", [a, c], a.shape)

    def norm(self, cur: Tensor, w: Tensor | None, bias: Tensor | None, rms: bool = False) -> Tensor:
        """build_norm: NORM_TYPE_NORMAL (ggml_norm) or RMS, then the optional weight and bias."""
        cur = self.op("rms_norm" if rms else "norm", [cur], cur.shape, eps=self.hp.eps)
        return self.add(self.mul(cur, w), bias)

    # --- build_inp ---------------------------------------------------------------------------
    def inp_raw(self) -> Tensor:
        """build_inp_raw: [1, 3, ny, nx] f32, an input (ggml's sched puts it on the CPU)."""
        return GraphBuilder.leaf("inp_raw", (1, 3, self.ny, self.nx), "f32", role="input")

    def conv_2d(self, kernel: Tensor, inp: Tensor) -> Tensor:
        """ggml_conv_2d(kernel, inp, patch, patch, 0, 0, 1, 1): im2col (f16 unless the kernel
        is bf16), mul_mat, reshape, permute, cont: [N, OC, OH, OW]."""
        b, p = self.b, self.hp.patch_size
        oc, ic, kh, kw = kernel.shape
        oh, ow = (inp.shape[-2] - kh) // p + 1, (inp.shape[-1] - kw) // p + 1
        col = self.op("im2col", [kernel, inp], (1, oh, ow, ic * kh * kw),
                      "f32" if kernel.dtype == "bf16" else "f16", s0=p, s1=p, p0=0, p1=0,
                      d0=1, d1=1, is_2d=True)
        conv = self.mul_mat(b.reshape(col, (oh * ow, ic * kh * kw)),
                            b.reshape(kernel, (oc, ic * kh * kw)))      # [OC, N·OH·OW]
        conv = b.reshape(conv, (oc, 1, oh, ow))
        return b.cont(b.permute(conv, (1, 0, 2, 3)))

    def build_inp(self) -> Tensor:
        """inp_raw, the patch conv, [1, n_patches, n_embd], the bias."""
        b = self.b
        conv = self.conv_2d(self.need("v.patch_embd.weight"), self.inp_raw())
        inp = b.reshape(conv, (1, self.hp.n_embd, self.n_patches))
        inp = b.cont(b.transpose(inp))
        patch_bias = self.w("v.patch_embd.bias")
        if patch_bias is not None:
            inp = b.cb(self.add(inp, patch_bias), "patch_bias", -1)
        return inp

    # --- build_vit ---------------------------------------------------------------------------
    def build_vit(self, inp: Tensor, pos_embd: Tensor | None) -> Tensor:
        b, hp, n_pos = self.b, self.hp, self.n_patches
        for il in range(hp.n_layer):
            for what in UNSUPPORTED_TENSORS:
                if f"v.blk.{il}.{what}.weight" in self.weights:
                    raise InputError(f"--mmproj: tensor 'v.blk.{il}.{what}.weight' takes a "
                                     f"ViT block ggmlrun does not build for "
                                     f"{hp.projector_type}")
        if pos_embd is not None:
            inp = b.cb(self.add(inp, pos_embd), "pos_embed", -1)
        inpL = b.reshape(inp, (n_pos, hp.n_embd))
        if self.w("v.pre_ln.weight") is not None:
            inpL = self.norm(inpL, self.w("v.pre_ln.weight"), self.w("v.pre_ln.bias"))
        for il in range(hp.n_layer):
            blk = f"v.blk.{il}."
            cur = self.norm(inpL, self.w(blk + "ln1.weight"), self.w(blk + "ln1.bias"))
            qkv = []
            for what, heads in (("attn_q", hp.n_head), ("attn_k", hp.n_head_kv),
                                ("attn_v", hp.n_head_kv)):
                t = self.add(self.mul_mat(self.need(blk + what + ".weight"), cur),
                             self.w(blk + what + ".bias"))
                qkv.append(t)
            q, k, v = (b.reshape(t, (1, n_pos, heads, hp.d_head)) for t, heads
                       in zip(qkv, (hp.n_head, hp.n_head_kv, hp.n_head_kv)))
            cur = self.build_attn(q, k, v, il)
            cur = self.add(self.mul_mat(self.need(blk + "attn_out.weight"), cur),
                           self.w(blk + "attn_out.bias"))
            cur = self.mul(cur, self.w(blk + "ls1.weight"))
            if self.w(blk + "attn_post_norm.weight") is not None:
                cur = self.norm(cur, self.w(blk + "attn_post_norm.weight"), None)
            cur = self.op("add", [cur, inpL], cur.shape)
            inpL = cur
            cur = self.norm(cur, self.w(blk + "ln2.weight"), self.w(blk + "ln2.bias"))
            cur = self.build_ffn(cur, blk)
            if self.w(blk + "ffn_post_norm.weight") is not None:
                cur = self.norm(cur, self.w(blk + "ffn_post_norm.weight"), None)
            cur = self.mul(cur, self.w(blk + "ls2.weight"))
            cur = self.op("add", [inpL, cur], inpL.shape)
            inpL = self.mul(cur, self.w(blk + "out_scale.weight"))
        if self.w("v.post_ln.weight") is not None:
            inpL = self.norm(inpL, self.w("v.post_ln.weight"), self.w("v.post_ln.bias"))
        return b.reshape(inpL, (1, n_pos, hp.n_embd))

    def build_attn(self, q_cur: Tensor, k_cur: Tensor, v_cur: Tensor, il: int) -> Tensor:
        """clip_graph::build_attn without a mask: Q, K, V ordered into the graph first
        (ggml_build_forward_order), then flash attention (K and V cast to f16) or KQ,
        soft_max, KQV."""
        b = self.b
        for t in (q_cur, k_cur, v_cur):
            b.expand(t)
        # ggml_permute(0, 2, 1, 3) and (1, 2, 0, 3) in NumPy's axes, for [(B,) P, H, D]
        lead = (0,) if len(q_cur.shape) == 4 else ()
        x = len(lead)
        swap, v_axes = (*lead, x + 1, x, x + 2), (*lead, x + 1, x + 2, x)
        q = b.permute(q_cur, swap)
        k = b.permute(k_cur, swap)
        *batch, n_pos, n_head, d_head = q_cur.shape
        B = batch[0] if batch else 1
        if self.flash_attn:
            v = b.permute(v_cur, swap)
            k, v = (self.op("cast", [t], t.shape, "f16", dtype="f16") for t in (k, v))
            cur = self.op("flash_attn_ext", [q, k, v], (B, n_pos, n_head, v.shape[-1]),
                          scale=1.0 / d_head ** 0.5, max_bias=0.0, logit_softcap=0.0,
                          prec="f32")
            cur = b.reshape(cur, (B * n_pos, n_head * cur.shape[-1]))
        else:
            v = b.cont(b.permute(v_cur, v_axes))
            kq = self.mul_mat(k, q)
            kq = self.op("soft_max", [kq], kq.shape, scale=1.0 / d_head ** 0.5, max_bias=0.0)
            kqv = self.mul_mat(v, kq)
            cur = b.permute(kqv, swap)
            cur = b.cont(cur, (B * n_pos, n_head * kqv.shape[-1]))
        b.cb(cur, "kqv_out", il)
        return cur

    def ffn(self, cur: Tensor, up: Tensor, up_b: Tensor | None, down: Tensor,
            down_b: Tensor | None, op: str) -> Tensor:
        """build_ffn without a gate."""
        cur = self.add(self.mul_mat(up, cur), up_b)
        cur = self.op(op, [cur], cur.shape)
        return self.add(self.mul_mat(down, cur), down_b)

    def ffn_op(self) -> str:
        """The block FFN's activation op (clip.use_gelu / use_silu); gelu_quick is not built."""
        op = {"gelu": "gelu", "silu": "silu"}.get(self.hp.ffn_op)
        if op is None:
            raise InputError(f"--mmproj: the {self.hp.ffn_op} FFN is not built by ggmlrun")
        return op

    def build_ffn(self, cur: Tensor, blk: str) -> Tensor:
        """A block's FFN: up (+bias), the activation, down (+bias). Files whose up and down are
        named the other way round (ffn_down's ne[0] is n_embd: older conversions) are swapped
        back, weights and biases, as load_tensors does for the FFN_SWAPPED types."""
        op = self.ffn_op()
        up, down = self.need(blk + "ffn_up.weight"), self.need(blk + "ffn_down.weight")
        up_b, down_b = self.w(blk + "ffn_up.bias"), self.w(blk + "ffn_down.bias")
        if self.hp.projector_type in FFN_SWAPPED and down.shape[-1] == self.hp.n_embd:
            up, down, up_b, down_b = down, up, down_b, up_b
        return self.ffn(cur, up, up_b, down, down_b, op)
