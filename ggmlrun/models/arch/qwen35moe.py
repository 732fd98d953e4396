"""llama.cpp's qwen35moe graph (src/models/qwen35moe.cpp; Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B
and Qwen3.6-35B-A3B): qwen35's hybrid layers (models/arch/delta_net.py, delta_net_graph.py)
with, in place of the dense FFN, build_moe_ffn (soft_max routing, the top expert_used_count of
expert_count, weights normalised) beside one shared expert whose output is scaled by a
per-token sigmoid gate (ffn_gate_inp_shexp, a single row). feed_forward_length is optional: the experts' widths have
keys of their own (expert_feed_forward_length, expert_shared_feed_forward_length), the real
files carry only those."""

from __future__ import annotations


from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import delta_net
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import Arch, TensorSpec, moe_tensors
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts


def read_hparams(get, common: dict, sections: bool = True) -> HParams:
    """`sections`: delta_net.read_hparams' (qwen3next's NEOX rope has no IMROPE sections)."""
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    n_ff_exp = check_experts(common["arch"], n_expert, n_used, common["n_ff"],
                             int(get("expert_feed_forward_length", 0) or 0))
    n_ff_shexp = int(get("expert_shared_feed_forward_length", 0) or 0) or common["n_ff"]
    if n_ff_shexp <= 0:
        raise InputError(f"{common['arch']} needs expert_shared_feed_forward_length (or "
                         "feed_forward_length)")
    return delta_net.read_hparams(get, common, sections, n_expert=n_expert, n_expert_used=n_used,
                                  n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_shexp)


def ffn_tensors(hp: HParams, name, il: int) -> dict[str, TensorSpec]:
    """A layer's FFN in llama.cpp's load order: the router, the routed experts (down, gate,
    up), then the shared expert's gate row and its gate, up and down."""
    n, n_sh = hp.n_embd, hp.n_ff_shexp
    routed = moe_tensors(hp, name, il)
    out = {name(t, bid=il): routed[name(t, bid=il)]
           for t in (T.FFN_GATE_INP, T.FFN_DOWN_EXP, T.FFN_GATE_EXP, T.FFN_UP_EXP)}
    out[name(T.FFN_GATE_INP_SHEXP, bid=il)] = TensorSpec((n,))
    out[name(T.FFN_GATE_SHEXP, bid=il)] = TensorSpec((n_sh, n))
    out[name(T.FFN_UP_SHEXP, bid=il)] = TensorSpec((n_sh, n))
    out[name(T.FFN_DOWN_SHEXP, bid=il)] = TensorSpec((n, n_sh))
    return out


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    """load_arch_tensors: qwen35's, with each layer's FFN the experts, then the MTP blocks
    (optional: never loaded)."""
    name = lambda t, s="weight", bid=None: tn("qwen35moe", t, s, bid)   # noqa: E731
    n = hp.n_embd
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n)),
           name(T.OUTPUT_NORM): TensorSpec((n,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n), False)}
    for il in range(hp.n_layer):
        out.update(delta_net.layer_tensors("qwen35moe", hp, il))
        out.update(ffn_tensors(hp, name, il))
    out.update(delta_net.mtp_tensors("qwen35moe", hp, lambda _, il: ffn_tensors(hp, name, il)))
    return out


def moe_ffn(d, cur, il: int):
    """build_layer_ffn: the routed experts, then the shared expert (build_ffn on the *_shexp
    tensors) times sigmoid(ffn_gate_inp_shexp . cur), one gate per token, added to them."""
    hp, b = d.hp, d.b
    routed = b.cb(d.moe_ffn(il, cur, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                            norm_w=True), "ffn_moe_out", il)
    shared = b.cb(d.ffn_swiglu(il, cur, up=T.FFN_UP_SHEXP, gate=T.FFN_GATE_SHEXP,
                               down=T.FFN_DOWN_SHEXP), "ffn_shexp", il)
    # ggml_mul_mat of the 1-D gate row {n_embd} and cur {n_embd, T}: {1, T}
    gate = b.op("mul_mat", [d.weight(T.FFN_GATE_INP_SHEXP, il), cur], (d.n_tokens_of(cur), 1))
    gate = b.cb(gate, "shared_expert_gate", il)
    gate = b.cb(b.op("sigmoid", [gate], gate.shape), "shared_expert_gate_sigmoid", il)
    shared = b.cb(b.op("mul", [shared, gate], shared.shape), "ffn_shexp_gated", il)
    return b.cb(d.add(routed, shared), "ffn_out", il)


def build(d):
    from ggmlrun.models.graph import delta_net as delta_net_graph

    return delta_net_graph.build(d, moe_ffn)


ARCH = Arch(name="qwen35moe", rope_type=delta_net.ROPE_TYPE_IMROPE, tensors=tensors, build=build,
            read_hparams=read_hparams, n_pos_per_embd=4, rows_after_norm=True, hybrid=True,
            card_tensor=delta_net.card_tensor, n_ff_optional=True,
            card_hparams=delta_net.CARD_HPARAMS | {
                "n_ff": ("feed_forward_length", False, None),
                "n_expert": ("expert_count", True, None),
                "n_expert_used": ("expert_used_count", True, None),
                "n_ff_exp": ("expert_feed_forward_length", False, None),
                "n_ff_shexp": ("expert_shared_feed_forward_length", False, None)})
