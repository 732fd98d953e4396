"""llama.cpp's llama4 graph (src/models/llama4.cpp; Llama-4-Scout, -Maverick): llama's block
with three of every four layers chunked (llama_kv_cache_iswa's second cache, of the "chunked"
kind: a token sees only its own chunk of 8192 positions) and the fourth without rope (NoPE),
its Q multiplied by the attention temperature instead (inp_attn_scale: log(floor((pos + 1) /
8192) + 1) * 0.1 + 1); on the roped layers unweighted RMS norms over each Q and K head (not
for the 128-expert Maverick). Every interleave_moe_layer_step-th layer is a mixture of experts
(sigmoid gates, the top experts' weights applied to the input before the experts: llama.cpp's
weight_before_ffn) beside a shared expert of the experts' width; the others a dense FFN.

llama.cpp fixes the chunk at 8192 whatever attention.sliding_window says; a file whose
attention.sliding_window is 0 would have no chunks, rope on all but the last layer, and abort
at its first ubatch (the temperature is 0), so ggmlrun refuses it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch.base import (ROPE_TYPE_NORM, Arch, TensorSpec, decoder_tensors,
                                      default_kq_scale, moe_tensors)
from ggmlrun.models.arch.gemma3 import swa_pattern
from ggmlrun.models.arch.mistral3 import attn_temperature
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_experts

if TYPE_CHECKING:     # the graph builders load with the first graph (docs/models.md)
    from ggmlrun.models.graph.decoder import Decoder

CHUNK = 8192     # llama4's n_swa, n_attn_temp_floor_scale (load_arch_hparams)


def read_hparams(get, common: dict) -> HParams:
    arch, n_layer = common["arch"], common["n_layer"]
    n_expert, n_used = int(get("expert_count", 0) or 0), int(get("expert_used_count", 0) or 0)
    if n_expert == 0:
        raise InputError(f"{arch} model cannot have zero experts (llama.cpp refuses it)")
    n_ff_exp = check_experts(arch, n_expert, n_used, common["n_ff"],
                             int(get("expert_feed_forward_length")), derive_width=False)
    step = int(get("interleave_moe_layer_step"))
    if get("attention.sliding_window", None, required=False) == 0:
        raise InputError(f"{arch}.attention.sliding_window is 0: llama.cpp then builds no "
                         f"chunks and aborts at the first ubatch (attention temperature 0)")
    pattern = get("attention.sliding_window_pattern", 4)
    layers = tuple(pattern) if isinstance(pattern, tuple) else swa_pattern(n_layer, pattern)
    if common["n_rot"] != common["n_embd_head_k"]:
        raise InputError(f"{arch}.rope.dimension_count {common['n_rot']} must be the head "
                         f"size {common['n_embd_head_k']} (llama.cpp asserts it)")
    return HParams(**common, n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp,
                   n_moe_layer_step=step, gating="sigmoid", use_kq_norm=n_expert != 128,
                   n_swa=CHUNK, swa_type="chunked", swa_layers=layers,
                   rope_freq_base_swa=float(get("rope.freq_base_swa", common["rope_freq_base"])),
                   rope_freq_scale_swa=common["rope_freq_scale"],
                   n_attn_temp_floor_scale=CHUNK, attn_temp_scale=0.1, attn_temp_offset=1.0)


def is_moe(hp, il: int) -> bool:
    return hp.n_moe_layer_step > 0 and (il + 1) % hp.n_moe_layer_step == 0


def tensors(hp: HParams) -> dict[str, TensorSpec]:
    def ffn(name, il):
        if not is_moe(hp, il):
            return {name(t, bid=il): TensorSpec(shape) for t, shape in (
                (T.FFN_GATE, (hp.n_ff, hp.n_embd)), (T.FFN_DOWN, (hp.n_embd, hp.n_ff)),
                (T.FFN_UP, (hp.n_ff, hp.n_embd)))}
        n_sh = hp.n_ff_exp
        return {**moe_tensors(hp, name, il),
                name(T.FFN_GATE_SHEXP, bid=il): TensorSpec((n_sh, hp.n_embd)),
                name(T.FFN_DOWN_SHEXP, bid=il): TensorSpec((hp.n_embd, n_sh)),
                name(T.FFN_UP_SHEXP, bid=il): TensorSpec((n_sh, hp.n_embd))}
    return decoder_tensors("llama4", hp, rope_freqs=True, ffn=ffn)


def build(d: Decoder):
    hp, b = d.hp, d.b
    kq_scale = hp.f_attention_scale or default_kq_scale(hp)
    # build_inp_attn_scale: ne [1, 1, n_tokens]
    attn_scale = d.inputs["attn_scale"] = b.cb(b.leaf("inp_attn_scale", (d.n_tokens, 1, 1),
                                                      "f32"), "inp_attn_scale", -1)
    d.extra_inputs[attn_scale] = lambda pos: attn_temperature(hp, pos)
    inpL = d.inpL
    for il in range(hp.n_layer):
        inpSA = inpL
        use_rope = hp.n_no_rope_layer_step > 0 and (il + 1) % hp.n_no_rope_layer_step != 0
        q, k, v = d.layer_qkv(il, inpL)
        if use_rope:
            factors, rope = d.rope_factors(il), d.rope_for(il)
            q, k = d.rope_ext(q, factors, rope), d.rope_ext(k, factors, rope)
        else:
            q = b.op("mul", [q, attn_scale], q.shape)
        q, k, v = b.cb(q, "Qcur", il), b.cb(k, "Kcur", il), b.cb(v, "Vcur", il)
        if use_rope and hp.use_kq_norm:      # Llama4TextL2Norm: no weight, not build_norm
            q = b.cb(b.op("rms_norm", [q], q.shape, eps=hp.norm_rms_eps), "Qcur_normed", il)
            k = b.cb(b.op("rms_norm", [k], k.shape, eps=hp.norm_rms_eps), "Kcur_normed", il)
        cur = b.cb(d.attn(il, q, k, v, kq_scale), "attn_out", il)
        cur, inpSA = d.last_rows(il, cur, inpSA)
        ffn_inp = b.cb(d.add(cur, inpSA), "ffn_inp", il)
        cur = b.cb(d.norm(ffn_inp, d.weight(T.FFN_NORM, il), il), "ffn_norm", il)
        if not is_moe(hp, il):
            cur = b.cb(d.ffn_swiglu(il, cur), "ffn_out", il)
        else:
            moe = d.moe_ffn(il, cur, n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                            norm_w=False, gating="sigmoid", weight_before_ffn=True)
            shexp = b.cb(d.ffn_swiglu(il, cur, up=T.FFN_UP_SHEXP, gate=T.FFN_GATE_SHEXP,
                                      down=T.FFN_DOWN_SHEXP), "ffn_moe_shexp", il)
            cur = b.cb(d.add(moe, shexp), "ffn_moe_out_merged", il)
        cur = b.cb(d.add(cur, ffn_inp), "ffn_out", il)
        inpL = b.cb(cur, "l_out", il)
    return inpL


ARCH = Arch(name="llama4", rope_type=ROPE_TYPE_NORM, tensors=tensors, build=build,
            read_hparams=read_hparams,
            card_hparams={"n_expert": ("expert_count", True, None),
                          "n_expert_used": ("expert_used_count", True, None),
                          "n_ff_exp": ("expert_feed_forward_length", True, None),
                          "n_moe_layer_step": ("interleave_moe_layer_step", True, None),
                          "n_swa": ("attention.sliding_window", False, None),
                          "swa_pattern": ("attention.sliding_window_pattern", False, None),
                          "rope_freq_base_swa": ("rope.freq_base_swa", False, None)})
