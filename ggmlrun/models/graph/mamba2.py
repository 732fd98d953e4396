"""llama.cpp's Mamba-2 block (src/models/mamba-base.cpp's build_mamba2_layer), shared by the
hybrid Nemotron-H and Granite-4.0-H families: one projection gives z, xBC and dt; xBC follows
the conv state's d_conv - 1 columns (concat), the last columns go back into the state, SSM_CONV
plus its bias and silu give x, B and C; SSM_SCAN runs the selective scan over the SSM state
(d_state x d_inner per sequence, read by row id inside the op), its new state copied back; the
D skip, silu(z) as gate, the grouped RMS norm and ssm_out close it.

A ubatch of d.n_seqs sequences of equal length (a reserve with -np N sees its n_seq_max rows
whole), no rollback snapshots (n_rs_seq 0: K = 1, one slot written).
"""

from __future__ import annotations

from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.graph.builder import build_rs


def mamba2_layer(d, cur, il: int):
    hp, b, ctx = d.hp, d.b, d.ctx
    w = d.weight
    ns = d.n_seqs
    Tn = d.n_tokens // ns
    d_conv, d_inner, N = hp.ssm_d_conv, hp.ssm_d_inner, hp.ssm_d_state
    H, G = hp.ssm_dt_rank, hp.ssm_n_group
    P, conv_dim = d_inner // H, d_inner + 2 * G * N
    d.cache.add_recurrent(il)
    r_l, s_l = d.cache.r[il], d.cache.s[il]
    rows = s_l.shape[0]
    conv = build_rs(b, d.inputs, r_l, hp.n_embd_r, ns, d.n_rs, 0, d.rs_zero)
    conv = b.reshape(conv, (ns, conv_dim, d_conv - 1))
    zxbcdt = ctx.mul_mat(w(T.SSM_IN, il), cur)
    width = zxbcdt.shape[-1]
    zxbcdt = b.reshape(zxbcdt, (ns, Tn, width))
    s2, s1 = zxbcdt.strides[0], zxbcdt.strides[1]
    z = b.view(zxbcdt, (ns, Tn, H, P), (s2, s1, P * 4, 4), 0)
    xbc = b.view(zxbcdt, (ns, Tn, conv_dim), (s2, s1, 4), d_inner * 4)
    dt = b.view(zxbcdt, (ns, Tn, H), (s2, s1, 4), (d_inner + conv_dim) * 4)
    conv_x = b.op("concat", [conv, b.transpose(xbc)], (ns, conv_dim, d_conv - 1 + Tn), axis=2)
    last = b.view(conv_x, (ns, conv_dim, d_conv - 1), (conv_x.strides[0], conv_x.strides[1], 4),
                  Tn * 4)
    b.expand(b.cpy(last, b.view(r_l, (ns, hp.n_embd_r), (r_l.strides[0], 4), 0)))
    xbc = b.op("ssm_conv", [conv_x, w(T.SSM_CONV1D, il)], (ns, Tn, conv_dim))
    xbc = d.add(xbc, w(T.SSM_CONV1D, il, "bias"))
    xbc = b.op("silu", [xbc], xbc.shape)
    s2, s1 = xbc.strides[0], xbc.strides[1]
    x = b.view(xbc, (ns, Tn, H, P), (s2, s1, P * 4, 4), 0)
    B = b.view(xbc, (ns, Tn, G, N), (s2, s1, N * 4, 4), d_inner * 4)
    C = b.view(xbc, (ns, Tn, G, N), (s2, s1, N * 4, 4), (d_inner + G * N) * 4)
    dt = d.add(b.cont(dt), w(T.SSM_DT, il, "bias"))
    A = w(T.SSM_A, il, "")
    n_x = ns * Tn * H * P

    def scan(states, ids):
        ssm = b.reshape(states, (rows, H, P, N))
        return b.op("ssm_scan", [ssm, x, dt, A, B, C, ids], (n_x + N * P * H * ns,), K=1)

    y_ssm = build_rs(b, d.inputs, s_l, hp.n_embd_s, ns, d.n_rs, 0, d.rs_zero, scan)
    D = N * d_inner
    new = b.view(y_ssm, (1, ns, D), (D * 4 * ns, D * 4, 4), n_x * 4)
    b.expand(b.cpy(new, b.view(s_l, (1, ns, D), (rows * D * 4, s_l.strides[0], 4), 0)))
    y = b.view(y_ssm, (ns, Tn, H, P), (Tn * H * P * 4, H * P * 4, P * 4, 4), 0)
    y = d.add(y, b.op("mul", [x, w(T.SSM_D, il, "")], x.shape))
    y = b.cb(y, "mamba2_y_add_d", il)
    z = b.cont(z)
    y = b.op("glu", [z, y], z.shape, op="swiglu", swapped=False)
    norm = d.optional(T.SSM_NORM, il)
    if norm is not None:              # the grouped RMS norm
        y = d.norm(b.reshape(y, (ns, Tn, G, d_inner // G)), norm, il)
    y = b.reshape(y, (Tn * ns, d_inner))
    return b.cb(ctx.mul_mat(w(T.SSM_OUT, il), y), "mamba_out", il)
