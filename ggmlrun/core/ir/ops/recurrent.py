"""The ops of recurrent (linear-attention) layers llama.cpp's hybrid models use: ssm_conv (the
short causal convolution over a sequence, its past taken from the conv state), ssm_scan (the
selective scan of Mamba-2's SSM, its state read by row ids) and gated_delta_net (the fused
gated delta rule of Qwen3-Next / Qwen3.5, its result holding the attention output and the new
state side by side). Shapes are NumPy order (ggml's ne reversed);
each kernel follows ggml-cpu's (ggml/src/ggml-cpu/ops.cpp), in f32.
"""

from __future__ import annotations

from ggmlrun.core.util.errors import InputError
from ggmlrun.core.util.lazynumpy import np
from ggmlrun.core.ir.ops.common import (
    F32, fmt, need_contiguous, need_dtype, need_ndim, need_rows, quiet, want_int, who)
from ggmlrun.core.ir.ops.registry import OpResult, OpSpec, register


def _pad(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


# --- ssm_conv --------------------------------------------------------------------------------

def _ssm_conv_infer(srcs):
    a, c = srcs
    need_dtype("ssm_conv", a, ("f32",), "a (conv input)")
    need_dtype("ssm_conv", c, ("f32",), "c (conv weight)")
    need_ndim("ssm_conv", a, 2, 3, "a (conv input)")
    need_ndim("ssm_conv", c, 2, 2, "c (conv weight)")
    need_rows("ssm_conv", a, "a (conv input)")
    if a.strides[-2] != a.shape[-1] * 4:        # ggml-cpu: nb[1] == ne[0]*sizeof(float)
        need_contiguous("ssm_conv", a, "a (conv input)")
    need_rows("ssm_conv", c, "c (conv weight)")
    n_s, d_inner, n_cols = _pad(a.shape, 3)
    d_inner_c, d_conv = c.shape
    if d_inner != d_inner_c or n_cols < d_conv:
        raise InputError(f"ssm_conv: a (conv input) {fmt(a.shape)} must be [S, C, d_conv - 1 + T] "
                         f"for c (conv weight) {fmt(c.shape)} = [C, d_conv]")
    return OpResult((n_s, n_cols - d_conv + 1, d_inner), "f32")


@quiet
def _ssm_conv_kernel(out, a, c):
    """out[s, t, i] = sum_k a[s, i, t + k] * c[i, k] (a sliding window per channel)."""
    a3 = a.reshape(_pad(a.shape, 3))
    d_conv = c.shape[1]
    n_t = out.shape[-2]
    acc = np.zeros((a3.shape[0], n_t, a3.shape[1]), F32)
    cw = np.asarray(c, dtype=F32)
    for k in range(d_conv):                 # ggml sums k in order, in f32
        acc += np.swapaxes(a3[:, :, k:k + n_t], 1, 2) * cw[:, k]
    out[...] = acc.reshape(out.shape)


register(OpSpec(name="ssm_conv", n_src=(2, 2), infer=_ssm_conv_infer, kernel=_ssm_conv_kernel,
                flops=lambda out, srcs: 2 * out.n_elements * srcs[1].shape[-1],
                summary="causal conv: a f32 [S, C, d_conv-1+T] by c f32 [C, d_conv] -> "
                        "[S, T, C]"))


# --- ssm_scan ----------------------------------------------------------------------------------

def _ssm_scan_infer(srcs, *, K):
    s, x, dt, A, B, C, ids = srcs
    for name, t in zip(("s", "x", "dt", "A", "B", "C"), srcs):
        need_dtype("ssm_scan", t, ("f32",), name)
    need_dtype("ssm_scan", ids, ("i32",), "ids")
    for name, t in (("s", s), ("dt", dt), ("A", A)):
        need_contiguous("ssm_scan", t, name)
    for name, t in (("x", x), ("B", B), ("C", C)):
        need_ndim("ssm_scan", t, 1, 4, name)
        shape, st = _pad(t.shape, 2), _pad(t.strides, 2)
        if st[-1] != 4 or (shape[-2] > 1 and st[-2] != 4 * shape[-1]):
            raise InputError(f"ssm_scan: {name} {who(t)} must have packed rows and heads "
                             f"(ggml: nb[0] and nb[1] packed): insert a cont before it")
    K = want_int("ssm_scan", "K", K, lo=1)
    n_seqs, T, H, P = _pad(x.shape, 4)
    N = s.shape[-1]
    if (len(s.shape) != 4 or tuple(s.shape[1:3]) != (H, P)
            or _pad(dt.shape, 3) != (n_seqs, T, H)
            or len(A.shape) != 2 or A.shape[0] != H or A.shape[1] not in (1, N)
            or tuple(B.shape) != tuple(C.shape) or _pad(B.shape, 4)[0:2] != (n_seqs, T)
            or B.shape[-1] != N or H % _pad(B.shape, 4)[2] or tuple(ids.shape) != (n_seqs,)):
        raise InputError(f"ssm_scan: s {fmt(s.shape)}, x {fmt(x.shape)}, dt {fmt(dt.shape)}, "
                         f"A {fmt(A.shape)}, B {fmt(B.shape)}, C {fmt(C.shape)}, ids "
                         f"{fmt(ids.shape)} must be [rows, H, P, N], [S, T, H, P], [S, T, H], "
                         f"[H, 1 or N], [S, T, G, N] twice (G dividing H), [S]")
    if A.shape[1] != 1 and K != 1:
        raise InputError("ssm_scan: a per-state decay A [H, N] (Mamba-1) takes K 1")
    return OpResult((n_seqs * T * H * P + K * N * P * H * n_seqs,), "f32")


@quiet
def _ssm_scan_kernel(out, s, x, dt, A, B, C, ids, *, K):
    """ggml_compute_forward_ssm_scan_f32: per sequence, its state row ids[i] [H, P, N] decays
    by exp(softplus(dt) A) (per head; Mamba-1: per state column too) and takes B x
    softplus(dt), its group's B and C shared by H / G heads; y is the state read by C. The
    output: y [S, T, H, P], then the final states (slot 0), then with K > 1 the states
    before each of the last tokens (slot k: k tokens back)."""
    n_seqs, T, H, P = _pad(x.shape, 4)
    N = s.shape[-1]
    x4 = np.asarray(x, dtype=F32).reshape(n_seqs, T, H, P)
    dt3 = np.asarray(dt, dtype=F32).reshape(n_seqs, T, H)
    B4, C4 = (np.asarray(t, dtype=F32).reshape(_pad(t.shape, 4)) for t in (B, C))
    group = np.arange(H) // (H // B4.shape[2])          # repeat_interleave
    a = np.asarray(A, dtype=F32)
    state = np.array(np.asarray(s, dtype=F32)[np.asarray(ids, dtype=np.int64)])
    flat = out.reshape(-1)
    y = flat[:n_seqs * T * H * P].reshape(n_seqs, T, H, P)
    states = flat[n_seqs * T * H * P:].reshape(K, n_seqs, H, P, N)
    for t in range(T):
        d = dt3[:, t]
        soft = np.where(d > F32(20), d, np.log(F32(1) + np.exp(np.minimum(d, F32(20)))))
        if a.shape[1] == 1:                               # Mamba-2: a scalar per head
            dA = np.exp(soft * a[:, 0])[:, :, None, None]
        else:                                             # Mamba-1: per state column
            dA = np.exp(soft[:, :, None] * a)[:, :, None, :]
        x_dt = (x4[:, t] * soft[:, :, None])[..., None]   # [S, H, P, 1]
        state = state * dA + B4[:, t][:, group][:, :, None, :] * x_dt
        y[:, t] = np.sum(state * C4[:, t][:, group][:, :, None, :], axis=-1, dtype=F32)
        slot = T - 1 - t
        if K > 1 and 0 < slot < K:
            states[slot] = state
    states[0] = state


register(OpSpec(name="ssm_scan", n_src=(7, 7), infer=_ssm_scan_infer, kernel=_ssm_scan_kernel,
                params={"K": 1},
                flops=lambda out, srcs: 6 * srcs[1].n_elements * srcs[0].shape[-1],
                summary="selective scan: s [rows, H, P, N], x [S, T, H, P], dt [S, T, H], "
                        "A [H, 1], B, C [S, T, G, N], ids i32 [S] -> [S*T*H*P + K*S*H*P*N]: "
                        "y, then states"))


# --- gated_delta_net ---------------------------------------------------------------------------

def _gdn_infer(srcs, *, K):
    q, k, v, g, beta, state = srcs
    for name, t in zip(("q", "k", "v", "g", "beta", "state"), srcs):
        need_dtype("gated_delta_net", t, ("f32",), name)
        need_ndim("gated_delta_net", t, 1, 4, name)
    for name, t in zip(("q", "k", "v"), srcs):
        need_rows("gated_delta_net", t, name)
    for name, t in zip(("g", "beta", "state"), srcs[3:]):
        need_contiguous("gated_delta_net", t, name)
    K = want_int("gated_delta_net", "K", K, lo=1)
    n_seqs, T, H, S_v = _pad(v.shape, 4)
    qs, ks = _pad(q.shape, 4), _pad(k.shape, 4)
    if qs != ks or qs[1] != T or qs[3] != S_v or H % qs[2] or n_seqs % qs[0]:
        raise InputError(f"gated_delta_net: q {fmt(q.shape)} and k {fmt(k.shape)} must be "
                         f"[B, T, H_k, S] with H_k dividing v's heads, v {fmt(v.shape)}")
    gs = _pad(g.shape, 4)
    if gs[:3] != (n_seqs, T, H) or gs[3] not in (1, S_v):
        raise InputError(f"gated_delta_net: g {who(g)} must be [B, T, H, 1 or S] for v "
                         f"{fmt(v.shape)}")
    if _pad(beta.shape, 4) != (n_seqs, T, H, 1):
        raise InputError(f"gated_delta_net: beta {who(beta)} must be [B, T, H, 1]")
    if _pad(state.shape, 4) != (n_seqs, H, S_v, S_v):
        raise InputError(f"gated_delta_net: state {who(state)} must be [B, H, S, S] = "
                         f"{fmt((n_seqs, H, S_v, S_v))}")
    return OpResult((T * n_seqs + K * S_v * n_seqs, S_v * H), "f32")


@quiet
def _gdn_kernel(out, q, k, v, g, beta, state, *, K):
    """ggml_compute_forward_gated_delta_net: per sequence and value head, the state M (stored
    transposed: M[j, i] = S[i][j]) decays by exp(g), takes the delta rule's rank-one update
    with k and beta, and is read by q (scaled by 1/sqrt(S)). The output's first rows are the
    attention output [B*T, H*S]; after them the last min(T, K) states (slot 0 the newest)."""
    n_seqs, T, H, S = _pad(v.shape, 4)
    q4, k4, v4 = (np.asarray(x, dtype=F32).reshape(_pad(x.shape, 4)) for x in (q, k, v))
    g4 = np.asarray(g, dtype=F32).reshape(_pad(g.shape, 4))
    b4 = np.asarray(beta, dtype=F32).reshape(_pad(beta.shape, 4))
    M = np.array(np.asarray(state, dtype=F32).reshape(n_seqs, H, S, S))
    hq = np.arange(H) % q4.shape[2]                 # iq1 = iv1 % neq1
    hk = np.arange(H) % k4.shape[2]
    sq = np.arange(n_seqs) // (n_seqs // q4.shape[0])
    sk = np.arange(n_seqs) // (n_seqs // k4.shape[0])
    scale = F32(1.0 / np.sqrt(F32(S)))
    flat = out.reshape(-1)
    attn = flat[:n_seqs * T * H * S].reshape(n_seqs, T, H, S)
    states = flat[n_seqs * T * H * S:].reshape(K, n_seqs, H, S, S)
    for t in range(T):
        qt = q4[sq][:, t][:, hq]                     # [B, H, S]
        kt = k4[sk][:, t][:, hk]
        decay = np.exp(g4[:, t])                     # [B, H, 1 or S]
        if g4.shape[-1] == 1:
            M *= decay[..., None]
        else:                                        # KDA: a decay per column i
            M *= decay[:, :, None, :]
        kv = np.einsum("bhji,bhi->bhj", M, kt, dtype=F32)
        delta = (v4[:, t] - kv) * b4[:, t]           # [B, H, S] (beta [B, H, 1])
        M += delta[..., :, None] * kt[..., None, :]
        attn[:, t] = np.einsum("bhji,bhi->bhj", M, qt, dtype=F32) * scale
        slot = T - 1 - t
        if K > 1 and 0 <= slot < K:
            states[slot] = M
    if K == 1:
        states[0] = M


register(OpSpec(name="gated_delta_net", n_src=(6, 6), infer=_gdn_infer, kernel=_gdn_kernel,
                params={"K": 1},
                flops=lambda out, srcs: 6 * srcs[2].n_elements * srcs[2].shape[-1],
                summary="gated delta rule of q, k, v [B, T, H, S], g, beta [B, T, H, 1], "
                        "state [B, H, S, S] -> [B*T + K*B*S, H*S]: output rows, then states"))
