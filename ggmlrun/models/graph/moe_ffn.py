"""llama.cpp's build_moe_ffn: a mixture-of-experts FFN for one layer of the graph a `Decoder`
(`d` below) is building: the router, the top experts, their products by mul_mat_id, the
weighted sum. Apart from models/graph/decoder.py because only the MoE architectures use it; they call
it as `d.moe_ffn(il, cur, ...)`, so an architecture module reads as llama.cpp's
src/models/<arch>.cpp. `d` is not annotated: decoder.py imports this module, and an import
back (even for annotations) is a cycle tests/test_layers.py refuses.
"""

from __future__ import annotations

import math

from ggmlrun.core.ir.graph import Tensor
from ggmlrun.core.ir.types import TYPES
from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.graph.builder import GraphBuilder


def build_moe_ffn(d, il: int, cur: Tensor, *, n_expert: int, n_expert_used: int,
                  norm_w: bool, w_scale: float = 0.0, gating: str = "softmax",
                  exp_probs_b: Tensor | None = None, logits: Tensor | None = None,
                  biases: bool = False, glu: str | dict = "swiglu",
                  weight_before_ffn: bool = False) -> Tensor:
    """build_moe_ffn (LLM_FFN_SILU unless `glu` says otherwise): the router
    (ffn_gate_inp), its soft_max (or sigmoid) probabilities, the top n_expert_used by
    argsort (a view of its first columns), their weights (get_rows; with `norm_w` divided
    by their sum, clamped at f16's smallest normal), the experts' products (mul_mat_id),
    each weighted, then the experts' outputs added up in order (views of one tensor).
    `logits`: the router's output made by the architecture (llama.cpp's probs_in, gemma4);
    `glu`: the experts' gate ("geglu": LLM_FFN_GELU; "relu_sqr": LLM_FFN_RELU_SQR, no gate;
    gpt-oss's LLM_FFN_SWIGLU_OAI_MOE: the glu op's params, op swiglu_oai with its alpha and
    limit); experts_ffn says the rest.
    gpt-oss's variant: `biases` (the router's bias added to its logits, each expert's
    bias row added to its products by add_id), gating "softmax_weight" (the top experts
    by raw logit, their weights a soft_max over the chosen ones). llama4's
    `weight_before_ffn`: the input repeated once per chosen expert and weighted before the
    experts' products, which are then summed unweighted."""
    b, cb = d.b, d.b.cb
    n_tokens, n_embd = d.n_tokens_of(cur), cur.shape[-1]
    if logits is None:
        logits = cb(d.ctx.mul_mat(d.weight(T.FFN_GATE_INP, il), cur), "ffn_moe_logits", il)
    if biases:
        logits = cb(d.add(logits, d.weight(T.FFN_GATE_INP, il, "bias")),
                    "ffn_moe_logits_biased", il)
    if gating == "softmax_weight":
        probs = logits
    elif gating == "softmax":
        probs = b.op("soft_max", [logits], logits.shape)
    elif gating == "sigmoid":
        probs = b.op("sigmoid", [logits], logits.shape)
    else:
        raise InputError(f"expert gating '{gating}' is not built")
    probs = cb(probs, "ffn_moe_probs", il)
    selection = probs
    if exp_probs_b is not None:
        selection = cb(d.add(probs, exp_probs_b), "ffn_moe_probs_biased", il)
    order = b.op("argsort", [selection], selection.shape, "i32", order="desc")
    selected = b.view(order, (n_tokens, n_expert_used), (order.strides[-2], order.strides[-1]))
    cb(order, "ffn_moe_argsort", il)
    cb(selected, "ffn_moe_topk", il)
    probs3 = b.reshape(probs, (n_tokens, n_expert, 1))
    weights = cb(b.op("get_rows", [probs3, selected], (n_tokens, n_expert_used, 1)),
                 "ffn_moe_weights", il)
    if gating == "softmax_weight":
        weights = b.reshape(weights, (n_tokens, n_expert_used))
        weights = b.op("soft_max", [weights], weights.shape)
        weights = cb(b.reshape(weights, (n_tokens, n_expert_used, 1)), "ffn_moe_weights_softmax",
                     il)
    if norm_w:
        weights = b.reshape(weights, (n_tokens, n_expert_used))
        total = cb(b.op("sum_rows", [weights], (n_tokens, 1)), "ffn_moe_weights_sum", il)
        total = cb(b.op("clamp", [total], total.shape, min=6.103515625e-5, max=math.inf),
                   "ffn_moe_weights_sum_clamped", il)
        weights = cb(b.op("div", [weights, total], weights.shape), "ffn_moe_weights_norm", il)
        weights = b.reshape(weights, (n_tokens, n_expert_used, 1))
    if w_scale not in (0.0, 1.0):
        weights = cb(b.op("scale", [weights], weights.shape, s=w_scale),
                     "ffn_moe_weights_scaled", il)
    b.expand(weights)
    cur = b.reshape(cur, (n_tokens, 1, n_embd))
    if weight_before_ffn:
        cur = b.op("repeat", [cur], (n_tokens, n_expert_used, n_embd),
                   shape=[n_tokens, n_expert_used, n_embd])
        cur = cb(b.op("mul", [cur, weights], cur.shape), "ffn_moe_weighted", il)
    experts = experts_ffn(d, il, cur, selected, glu, biases)
    if not weight_before_ffn:
        experts = cb(b.op("mul", [experts, weights], experts.shape), "ffn_moe_weighted", il)
    b.expand(experts)
    views = []
    for i in range(n_expert_used):
        v = b.view(experts, (n_tokens, n_embd), (experts.strides[-3], experts.strides[-1]),
                   i * experts.strides[-2])
        b.expand(v)
        views.append(v)
    out = views[0]
    for v in views[1:]:
        out = b.op("add", [out, v], out.shape)
        b.expand(out)
    if n_expert_used == 1:
        out = b.cont(out)
    return cb(out, "ffn_moe_out", il)


def experts_ffn(d, il: int, cur: Tensor, selected: Tensor, glu: str | dict,
                biases: bool = False) -> Tensor:
    """The selected experts' FFN: up and gate products (or, with a fused ffn_gate_up_exps,
    one product and its two halves as views), the GLU, the down product; each product
    times its per-expert scale where the file has one (build_lora_mm_id's w_s: the scale
    repeated over the tokens, its selected rows by get_rows)."""
    b, cb = d.b, d.b.cb
    if glu == "relu_sqr":      # LLM_FFN_RELU_SQR without a gate (nemotron_h_moe): up only
        up = scaled_id(d, T.FFN_UP_EXP, il, cur, selected, "ffn_moe_up")
        act = b.op("sqr", [b.op("relu", [up], up.shape)], up.shape)
        act = cb(act, "ffn_moe_relu_sqr", il)
        return scaled_id(d, T.FFN_DOWN_EXP, il, act, selected, "ffn_moe_down")
    gate_up = d.optional(T.FFN_GATE_UP_EXP, il)
    if gate_up is not None:
        gate_up = cb(mul_mat_id(b, gate_up, cur, selected), "ffn_moe_gate_up", il)
        n_tokens, used, n_ff2 = gate_up.shape
        n_ff, item = n_ff2 // 2, TYPES[gate_up.dtype].type_size
        strides = (gate_up.strides[-3], gate_up.strides[-2], item)
        gate = cb(b.view(gate_up, (n_tokens, used, n_ff), strides), "ffn_moe_gate", il)
        up = cb(b.view(gate_up, (n_tokens, used, n_ff), strides, n_ff * item), "ffn_moe_up", il)
    else:
        up = biased_id(d, scaled_id(d, T.FFN_UP_EXP, il, cur, selected, "ffn_moe_up"),
                       T.FFN_UP_EXP, il, selected, "ffn_moe_up", biases)
        gate = biased_id(d, scaled_id(d, T.FFN_GATE_EXP, il, cur, selected, "ffn_moe_gate"),
                         T.FFN_GATE_EXP, il, selected, "ffn_moe_gate", biases)
    params = dict(glu) if isinstance(glu, dict) else {"op": glu}
    act = cb(b.op("glu", [gate, up], gate.shape, swapped=False, **params),
             f"ffn_moe_{params['op']}", il)
    down = scaled_id(d, T.FFN_DOWN_EXP, il, act, selected, "ffn_moe_down")
    return biased_id(d, down, T.FFN_DOWN_EXP, il, selected, "ffn_moe_down", biases)


def biased_id(d, x: Tensor, t, il: int, ids: Tensor, label: str, biases: bool) -> Tensor:
    """gpt-oss: each selected expert's bias row added to its product (add_id)."""
    if not biases:
        return x
    row = d.weight(t, il, "bias")
    return d.b.cb(d.b.op("add_id", [x, row, ids], x.shape), f"{label}_biased", il)


def scaled_id(d, t, il: int, cur: Tensor, ids: Tensor, name: str) -> Tensor:
    """The product named `name`; scaled, `name`_scaled (llama.cpp names it twice)."""
    b = d.b
    res = mul_mat_id(b, d.weight(t, il), cur, ids)
    scale = d.optional(t, il, "scale")
    if scale is None:
        return b.cb(res, name, il)
    (n_tokens, used, _), n_expert = res.shape, scale.shape[-1]
    s = b.reshape(scale, (1, n_expert, 1))
    s = b.op("repeat", [s], (n_tokens, n_expert, 1), shape=[n_tokens, n_expert, 1])
    s = b.op("get_rows", [s, ids], (n_tokens, used, 1))
    return b.cb(b.op("mul", [res, s], res.shape), f"{name}_scaled", il)


def mul_mat_id(b: GraphBuilder, w: Tensor, cur: Tensor, ids: Tensor) -> Tensor:
    """ggml_mul_mat_id(w, cur, ids): w [E, M, K], cur [T, B, K], ids [T, U] -> [T, U, M]."""
    return b.op("mul_mat_id", [w, cur, ids], (cur.shape[-3], ids.shape[-1], w.shape[-2]))
