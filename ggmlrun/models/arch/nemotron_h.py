"""llama.cpp's nemotron_h graph (src/models/nemotron-h.cpp; NVIDIA Nemotron-H / Nemotron Nano 2):
a hybrid whose every layer is one of three kinds, told apart by the per-layer
attention.head_count_kv and feed_forward_length: both 0, a Mamba-2 layer (models/graph/
mamba2.py, llama_memory_hybrid's recurrent state); KV heads but no FFN, attention without rope;
an FFN width, a squared-ReLU MLP (up, relu, sqr, down). Each layer is attn_norm, its block and
the residual; the KV cache holds only the attention layers. nemotron_h_moe
(models/arch/nemotron_h_moe.py) puts routed experts in the MLP layers. Not built: the MTP block
(nextn_predict_layers), never loaded by a plain context.
"""

from __future__ import annotations

import math

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.base import ROPE_TYPE_NORM, Arch, TensorSpec
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams

SSM_KEYS = (("ssm_d_conv", "ssm.conv_kernel"), ("ssm_d_inner", "ssm.inner_size"),
            ("ssm_d_state", "ssm.state_size"), ("ssm_dt_rank", "ssm.time_step_rank"),
            ("ssm_n_group", "ssm.group_count"))


def ssm_hparams(get, arch: str) -> dict:
    """The Mamba-2 sizes every Mamba-2 hybrid reads (all required), checked as
    build_mamba2_layer asserts them."""
    out = {field: get(key) for field, key in SSM_KEYS}
    if get("nextn_predict_layers", 0, required=False):
        raise InputError(f"{arch}.nextn_predict_layers: {arch}'s MTP block is not built")
    if out["ssm_d_inner"] % out["ssm_dt_rank"] or out["ssm_d_inner"] % out["ssm_n_group"] \
            or out["ssm_dt_rank"] % out["ssm_n_group"]:
        raise InputError(f"{arch}.ssm.inner_size {out['ssm_d_inner']} must be a multiple of "
                         f"ssm.time_step_rank {out['ssm_dt_rank']} (the SSM heads), and they of "
                         f"ssm.group_count {out['ssm_n_group']}")
    return out


def read_hparams(get, common: dict, **extra) -> HParams:
    """load_arch_hparams: a layer is recurrent iff it has neither KV heads nor an FFN;
    attention.layer_norm_epsilon is required (the MTP head's norm; the RMS norms' epsilon when
    the file has no attention.layer_norm_rms_epsilon, as the converter writes them)."""
    n_layer, arch = common["n_layer"], common["arch"]
    get("attention.layer_norm_epsilon")
    kv = get.arrays.get("attention.head_count_kv", (common["n_head_kv"],) * n_layer)
    ff = get.arrays.get("feed_forward_length", (common["n_ff"],) * n_layer)
    if any(common["n_head"] % h for h in kv if h):
        raise InputError(f"{arch}.attention.head_count {common['n_head']} must be a multiple "
                         f"of every attention layer's KV heads {sorted(set(kv) - {0})}")
    return HParams(**common, n_head_kv_arr=tuple(kv), n_ff_arr=tuple(ff),
                   recurrent_layers=tuple(h == 0 and f == 0 for h, f in zip(kv, ff)),
                   **ssm_hparams(get, arch), **extra)


def mamba2_tensors(arch: str, hp, il: int) -> dict[str, TensorSpec]:
    """A Mamba-2 layer's tensors, load_arch_tensors' order (ssm_a and ssm_d without a suffix)."""
    name = lambda t, s="weight": tn(arch, t, s, il)   # noqa: E731
    d_inner, G, N, H = hp.ssm_d_inner, hp.ssm_n_group, hp.ssm_d_state, hp.ssm_dt_rank
    conv_dim = d_inner + 2 * G * N
    return {name(T.SSM_IN): TensorSpec((2 * d_inner + 2 * G * N + H, hp.n_embd)),
            name(T.SSM_CONV1D): TensorSpec((conv_dim, hp.ssm_d_conv)),
            name(T.SSM_CONV1D, "bias"): TensorSpec((conv_dim,), False),
            name(T.SSM_DT, "bias"): TensorSpec((H,)),
            name(T.SSM_A, ""): TensorSpec((H, 1)), name(T.SSM_D, ""): TensorSpec((H, 1)),
            name(T.SSM_NORM): TensorSpec((G, d_inner // G)),
            name(T.SSM_OUT): TensorSpec((hp.n_embd, d_inner))}


def attention_tensors(arch: str, hp, il: int) -> dict[str, TensorSpec]:
    """create_tensor_qkv (separate Q/K/V, optional biases) and wo with its optional bias."""
    name = lambda t, s="weight": tn(arch, t, s, il)   # noqa: E731
    n, hd = hp.n_embd, hp.n_embd_head_k
    rows = {T.ATTN_Q: hd * hp.heads(il), T.ATTN_K: hp.n_embd_k_gqa_l(il),
            T.ATTN_V: hp.n_embd_v_gqa_l(il)}
    out = {name(t): TensorSpec((r, n)) for t, r in rows.items()}
    out.update({name(t, "bias"): TensorSpec((r,), False) for t, r in rows.items()})
    out[name(T.ATTN_OUT)] = TensorSpec((n, hd * hp.heads(il)))
    out[name(T.ATTN_OUT, "bias")] = TensorSpec((n,), False)
    return out


def tensors(hp: HParams, arch: str = "nemotron_h", experts=None) -> dict[str, TensorSpec]:
    """load_arch_tensors: token_embd, output_norm, the optional output, then per layer
    attn_norm and its block's tensors (`experts(il)`: nemotron_h_moe's MLP layers)."""
    name = lambda t, s="weight", bid=None: tn(arch, t, s, bid)   # noqa: E731
    n = hp.n_embd
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n)),
           name(T.OUTPUT_NORM): TensorSpec((n,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n), False)}
    for il in range(hp.n_layer):
        out[name(T.ATTN_NORM, bid=il)] = TensorSpec((n,))
        if hp.is_recurrent(il):
            out.update(mamba2_tensors(arch, hp, il))
        elif hp.ff(il) == 0:
            out.update(attention_tensors(arch, hp, il))
        elif experts is not None:
            out.update(experts(il))
        else:
            ff = hp.ff(il)
            out[name(T.FFN_DOWN, bid=il)] = TensorSpec((n, ff))
            out[name(T.FFN_UP, bid=il)] = TensorSpec((ff, n))
            out[name(T.FFN_DOWN, "bias", il)] = TensorSpec((n,), False)
            out[name(T.FFN_UP, "bias", il)] = TensorSpec((ff,), False)
    return out


def relu_sqr_ffn(d, cur, il: int, up=T.FFN_UP, down=T.FFN_DOWN):
    """build_ffn(up, no gate, down, LLM_FFN_RELU_SQR, LLM_FFN_PAR), optional biases."""
    b, cb = d.b, d.b.cb
    cur = cb(d.ctx.mul_mat(d.weight(up, il), cur), "ffn_up", il)
    bias = d.optional(up, il, "bias")
    if bias is not None:
        cur = cb(d.add_bias(cur, bias), "ffn_up_b", il)
    cur = cb(b.op("relu", [cur], cur.shape), "ffn_relu", il)
    cur = cb(b.op("sqr", [cur], cur.shape), "ffn_sqr(relu)", il)
    cur = d.ctx.mul_mat(d.weight(down, il), cur)
    bias = d.optional(down, il, "bias")
    if bias is not None:
        cur = d.add_bias(cb(cur, "ffn_down", il), bias)
    return cur


def attention(d, cur, il: int, rope: bool = False):
    """build_attention_layer: Q/K/V (roped only with `rope`: granitehybrid's files with
    rope.scaling.finetuned), attention over the KV cache, wo."""
    hp = d.hp
    d.add_kv_layer(il)
    hd = hp.n_embd_head_k
    q, k, v = d.qkv(il, cur, hd, hp.heads(il), hp.heads_kv(il))
    if rope:
        q, k = d.rope_ext(q, d.rope_factors(il)), d.rope_ext(k, d.rope_factors(il))
        q, k = d.b.cb(q, "Qcur", il), d.b.cb(k, "Kcur", il)
    scale = hp.f_attention_scale or 1.0 / math.sqrt(float(hd))
    return d.b.cb(d.attn(il, q, k, v, scale), "attn_out", il)


def build(d, ffn=None):
    """The layer loop (`ffn(d, cur, il)`: nemotron_h_moe's experts; default the squared-ReLU
    MLP); the output rows are picked after the final norm (embeddings_nextn_masked off)."""
    from ggmlrun.models.graph.mamba2 import mamba2_layer
    from ggmlrun.models.graph.shortconv import memory_inputs

    hp, b = d.hp, d.b
    memory_inputs(d)
    inpL = d.inpL
    for il in range(hp.n_layer):
        cur = b.cb(d.norm(inpL, d.weight(T.ATTN_NORM, il), il), "attn_norm", il)
        if hp.is_recurrent(il):
            cur = mamba2_layer(d, cur, il)
        elif hp.ff(il) == 0:
            cur = attention(d, cur, il)
        else:
            cur = ffn(d, cur, il) if ffn else b.cb(relu_sqr_ffn(d, cur, il), "ffn_out", il)
            cur = b.cb(cur, "l_out", il)
        inpL = b.cb(d.add(cur, inpL), "nemotron_h_block_out", il)
    return inpL


ARCH = Arch(name="nemotron_h", rope_type=ROPE_TYPE_NORM, tensors=tensors, build=build,
            read_hparams=read_hparams, hybrid=True, rows_after_norm=True, min_layer_tensors=3,
            rms_eps_fallback=True,
            per_layer=frozenset({"attention.head_count_kv", "feed_forward_length"}))
