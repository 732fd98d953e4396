"""llama.cpp's short-conv block (lfm2.cpp's build_shortconv_block): a gated causal conv over
each sequence with llama_memory_recurrent's conv state (l_cache - 1 columns per channel) as
its left context. One projection gives three n_embd chunks b, c, x; b * x, transposed, follows
the state's columns (concat), the last l_cache - 1 columns go back into the state, SSM_CONV
runs the kernel over them, c gates the result and out_proj closes it.

A ubatch of d.n_seqs sequences of equal length (a reserve with -np N: its n_seq_max rows of
state seen whole), causal attention, no rollback snapshots (n_rs_seq 0: one slot written).
"""

from __future__ import annotations

from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.graph.builder import build_rs


def memory_inputs(d) -> None:
    """build_inp_mem_hybrid's recurrent half: rs_s_copy and its views."""
    from ggmlrun.models.graph.builder import rs_inputs

    d.inputs.update(rs_inputs(d.b, d.n_rs, d.n_seqs))


def shortconv(d, cur, il: int):
    hp, b, ctx = d.hp, d.b, d.ctx
    cb, w = b.cb, d.weight
    n, ns = hp.n_embd, d.n_seqs
    Tn, d_conv = d.n_tokens // ns, hp.n_shortconv_l_cache - 1
    d.cache.add_recurrent(il)
    r_l = d.cache.r[il]
    cur = b.reshape(cur, (ns, Tn, n))
    bcx = cb(ctx.mul_mat(w(T.SHORTCONV_INPROJ, il), cur), "model.layers.{}.conv.in_proj", il)
    s1, s2 = bcx.strides[1], bcx.strides[0]
    b_, c, x = (b.view(bcx, (ns, Tn, n), (s2, s1, 4), k * n * 4) for k in range(3))
    bx = b.transpose(b.op("mul", [b_, x], (ns, Tn, n)))
    conv = build_rs(b, d.inputs, r_l, hp.n_embd_r, ns, d.n_rs, 0, d.rs_zero)
    conv = b.reshape(conv, (ns, n, d_conv))
    bx = b.op("concat", [conv, bx], (ns, n, d_conv + Tn), axis=2)
    snap = b.view(bx, (ns, n, d_conv), (bx.strides[0], bx.strides[1], 4), Tn * 4)
    b.expand(b.cpy(snap, b.view(r_l, (ns, d_conv * n), (r_l.strides[0], 4), 0)))
    conv_out = cb(b.op("ssm_conv", [bx, w(T.SHORTCONV_CONV, il)], (ns, Tn, n)),
                  "model.layers.{}.conv.conv", il)
    y = b.op("mul", [c, conv_out], (ns, Tn, n))
    y = cb(ctx.mul_mat(w(T.SHORTCONV_OUTPROJ, il), y), "model.layers.{}.conv.out_proj", il)
    return b.reshape(y, (Tn * ns, n))
