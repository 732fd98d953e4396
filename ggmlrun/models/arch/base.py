"""What every architecture module gives the registry, and the helpers they share.

- `Arch`: the architecture's name (as llama.cpp and `general.architecture` spell it), its rope
  type (llama_model_rope_type), how its own hyperparameters are read (load_arch_hparams), its
  tensor table (load_arch_tensors) and its graph (the layer loop of src/models/<arch>.cpp).
- `tn` (models/gguf/names.py): a tensor's GGUF name from the `gguf` package's tables, never
  retyped; the tensor tables below spell every name through it.
- `TensorSpec`: one tensor llama.cpp creates: NumPy-order shape, and whether the file must have
  it (`required` True), may have it (False), or must have it unless another tensor is present
  (`required` = that tensor's name: separate Q/K/V unless a fused attn_qkv is there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.names import MODEL_TENSOR, tn

ROPE_TYPE_NORM = 0      # LLAMA_ROPE_TYPE_NORM: pairs of consecutive values
ROPE_TYPE_NEOX = 2      # LLAMA_ROPE_TYPE_NEOX: pairs n_rot/2 apart
ROPE_TYPE_IMROPE = 40   # LLAMA_ROPE_TYPE_IMROPE: NeoX pairs, interleaved multi-section positions


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    required: bool | str = True


@dataclass(frozen=True)
class Arch:
    name: str
    rope_type: int
    tensors: Callable            # (hparams) -> dict[name, TensorSpec], in llama.cpp's load order
    build: Callable              # (Decoder) -> None: the layers, between inputs and output head
    read_hparams: Callable | None = None   # (get, common kwargs) -> HParams; None: the common ones
    is_70b: Callable = lambda hp: False    # llama.cpp's LLM_TYPE_70B (the quantizer's attn_v rule)
    longrope: bool = False                 # builds LongRoPE's rope_factors_long / _short
    n_pos_per_embd: int = 1                # positions per token in inp_pos (4 for M-RoPE/IMROPE)
    hybrid: bool = False                   # llama_memory_hybrid: a recurrent state beside the KV
    # the optional tensors a model card's model has, by name without "blk.<i>."
    card_tensors: frozenset = frozenset({"output.weight"})
    # or, per tensor: (name, hparams) -> whether a card's model has it (gemma4: attn_v only on
    # the sliding layers)
    card_tensor: Callable | None = None
    # card hyperparameters of its own: card key -> (GGUF key under the architecture, kind)
    card_hparams: dict = field(default_factory=dict)
    # keys whose per-layer arrays may differ between layers (hparam_rules.check per_layer)
    per_layer: frozenset = frozenset()
    # the output norm over every row (h_nextn), then the output rows (gemma4; the qwen35 family:
    # llama.cpp's embeddings_nextn_masked off), rather than the last layer keeping only the
    # output rows
    rows_after_norm: bool = False
    # every row out of the last layer (h_nextn, an output), then the output rows, then the
    # output norm (gpt-oss: llama.cpp's embeddings_nextn_masked off, get_rows before the norm)
    rows_before_norm: bool = False
    # feed_forward_length may be absent (0): the FFN widths have keys of their own (qwen35moe)
    n_ff_optional: bool = False
    # attention.layer_norm_rms_epsilon may be absent, attention.layer_norm_epsilon standing for
    # it (nemotron_h: its converter writes only the latter)
    rms_eps_fallback: bool = False
    # the fewest tensors a layer has (attn_norm, Q/K/V or QKV, attn_output, ffn_norm, FFN up
    # and down; nemotron_h's MLP layer: attn_norm, up, down)
    min_layer_tensors: int = 6

    def tensor_shapes(self, hp) -> dict[str, tuple[int, ...]]:
        return {name: spec.shape for name, spec in self.tensors(hp).items()}


def default_kq_scale(hp) -> float:
    """llama.cpp's kq_scale for most architectures: 1/sqrt(head size)."""
    return 1.0 / math.sqrt(float(hp.n_embd_head_k))


T = MODEL_TENSOR


def decoder_tensors(arch: str, hp, *, output_bias: bool = False, q_k_norm: bool = False,
                    attn_out_bias: bool = False, ffn_bias: bool = False,
                    rope_freqs: bool = False, fused_qkv: bool = False,
                    fused_gate_up: bool = False, longrope: bool = False,
                    post_norms: bool = False,
                    ffn: Callable | None = None) -> dict[str, TensorSpec]:
    """The tensors of a dense pre-norm decoder (token_embd, output_norm, optional output, then per
    layer: attn_norm, Q/K/V (separate, each with an optional bias, or with `fused_qkv` an
    optional attn_qkv instead), attn_output, ffn_norm and the gated FFN), in llama.cpp's
    create_tensor order. `ffn(name, il)`: the layer's FFN tensors after ffn_norm instead of
    the dense ones (a mixture of experts: moe_tensors)."""
    n_embd, n_q = hp.n_embd, hp.n_embd_head_k * hp.n_head
    n_k, n_v = hp.n_embd_k_gqa, hp.n_embd_v_gqa
    name = lambda t, s="weight", bid=None: tn(arch, t, s, bid)   # noqa: E731
    out = {name(T.TOKEN_EMBD): TensorSpec((hp.n_vocab, n_embd)),
           name(T.OUTPUT_NORM): TensorSpec((n_embd,)),
           name(T.OUTPUT): TensorSpec((hp.n_vocab, n_embd), False)}
    if output_bias:
        out[name(T.OUTPUT, "bias")] = TensorSpec((hp.n_vocab,), False)
    if rope_freqs:
        out[name(T.ROPE_FREQS)] = TensorSpec((hp.n_rot // 2,), False)
    if longrope:     # made in layer 0, duplicated into the others (placement LAYER_DUPLICATED)
        out[name(T.ROPE_FACTORS_LONG)] = TensorSpec((hp.n_rot // 2,), False)
        out[name(T.ROPE_FACTORS_SHORT)] = TensorSpec((hp.n_rot // 2,), False)
    for i in range(hp.n_layer):
        out[name(T.ATTN_NORM, bid=i)] = TensorSpec((n_embd,))
        qkv = name(T.ATTN_QKV, bid=i) if fused_qkv else None
        if fused_qkv:
            out[qkv] = TensorSpec((n_q + n_k + n_v, n_embd), False)
            out[name(T.ATTN_QKV, "bias", i)] = TensorSpec((n_q + n_k + n_v,), False)
        need = qkv or True
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_k), (T.ATTN_V, n_v)):
            out[name(t, bid=i)] = TensorSpec((n, n_embd), need)
        for t, n in ((T.ATTN_Q, n_q), (T.ATTN_K, n_k), (T.ATTN_V, n_v)):
            out[name(t, "bias", i)] = TensorSpec((n,), False)
        out[name(T.ATTN_OUT, bid=i)] = TensorSpec((n_embd, n_q))
        if attn_out_bias:
            out[name(T.ATTN_OUT, "bias", i)] = TensorSpec((n_embd,), False)
        if post_norms:            # gemma3: a norm after attention, another after the FFN
            out[name(T.ATTN_POST_NORM, bid=i)] = TensorSpec((n_embd,))
        if q_k_norm:
            out[name(T.ATTN_K_NORM, bid=i)] = TensorSpec((hp.n_embd_head_k,))
            out[name(T.ATTN_Q_NORM, bid=i)] = TensorSpec((hp.n_embd_head_k,))
        out[name(T.FFN_NORM, bid=i)] = TensorSpec((n_embd,))
        if ffn is not None:
            out.update(ffn(name, i))
            continue
        if fused_gate_up:
            out[name(T.FFN_DOWN, bid=i)] = TensorSpec((n_embd, hp.n_ff))
            out[name(T.FFN_UP, bid=i)] = TensorSpec((2 * hp.n_ff, n_embd))
            continue
        out[name(T.FFN_GATE, bid=i)] = TensorSpec((hp.n_ff, n_embd))
        out[name(T.FFN_DOWN, bid=i)] = TensorSpec((n_embd, hp.n_ff))
        out[name(T.FFN_UP, bid=i)] = TensorSpec((hp.n_ff, n_embd))
        if ffn_bias:
            out[name(T.FFN_GATE, "bias", i)] = TensorSpec((hp.n_ff,), False)
            out[name(T.FFN_DOWN, "bias", i)] = TensorSpec((n_embd,), False)
            out[name(T.FFN_UP, "bias", i)] = TensorSpec((hp.n_ff,), False)
        if post_norms:
            out[name(T.FFN_POST_NORM, bid=i)] = TensorSpec((n_embd,))
    return out


def moe_tensors(hp, name, il: int) -> dict[str, TensorSpec]:
    """A layer's mixture of experts as llama.cpp creates it (qwen3moe and its kin): the router
    ffn_gate_inp [n_expert, n_embd], then the experts' gate, down and up, each [n_expert, ...]
    (one matrix per expert; ggml's ne {n_embd, n_ff_exp, n_expert})."""
    n_embd, n_exp, n_ff_exp = hp.n_embd, hp.n_expert, hp.n_ff_exp
    return {name(T.FFN_GATE_INP, bid=il): TensorSpec((n_exp, n_embd)),
            name(T.FFN_GATE_EXP, bid=il): TensorSpec((n_exp, n_ff_exp, n_embd)),
            name(T.FFN_DOWN_EXP, bid=il): TensorSpec((n_exp, n_embd, n_ff_exp)),
            name(T.FFN_UP_EXP, bid=il): TensorSpec((n_exp, n_ff_exp, n_embd))}


def nextn_tensors(hp, name, il: int) -> dict[str, TensorSpec]:
    """A NextN (multi-token prediction) block's own tensors, in llama.cpp's order: all optional,
    since llama.cpp counts the block as a layer (-ngl) but never loads it. `name(t, bid)`."""
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    return {name(t, il): TensorSpec(shape, False) for t, shape in (
        (T.NEXTN_EH_PROJ, (n_embd, 2 * n_embd)), (T.NEXTN_ENORM, (n_embd,)),
        (T.NEXTN_HNORM, (n_embd,)), (T.NEXTN_EMBED_TOKENS, (n_vocab, n_embd)),
        (T.NEXTN_SHARED_HEAD_HEAD, (n_vocab, n_embd)), (T.NEXTN_SHARED_HEAD_NORM, (n_embd,)))}




def check_tensors(arch, hp, tensors: dict, where: str | None, table: dict | None = None) -> dict:
    """Every tensor llama.cpp requires for the architecture, and every optional one present, in
    the shape the hyperparameters give it (TensorSpec above)."""
    least = hp.n_layer * arch.min_layer_tensors
    if least > len(tensors):   # before listing a corrupt block_count's
        raise InputError(f"block_count {hp.n_layer} needs at least "
                         f"{least} tensors but the model has "
                         f"{len(tensors)}", file=where)
    table = table if table is not None else arch.tensors(hp)
    for name, spec in table.items():
        info = tensors.get(name)
        if info is None:
            if spec.required is True or (isinstance(spec.required, str)
                                         and spec.required not in tensors):
                raise InputError(f"model lacks tensor '{name}', which a {arch.name} model "
                                 f"needs", file=where)
            continue
        if info.shape != spec.shape:
            raise InputError(f"tensor '{name}' has shape {list(info.shape)}; the model's "
                             f"hyperparameters make it {list(spec.shape)}", file=where)
    return table
