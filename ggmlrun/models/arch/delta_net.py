"""What the hybrid Qwen3.5 family's gated delta-net layers are made of, as tables: their
hyperparameters (llama_hparams' ssm_* keys, the recurrent-layer pattern, the state sizes
llama_memory_hybrid allocates), a card's keys for them, and the tensors load_block_trunk and
load_block_mtp create (src/models/qwen35.cpp, qwen35moe.cpp; qwen3next.cpp's differ by
ssm_ba and the absent IMROPE sections: parameters here). `validate` and a card need
these and no graph code; the layers themselves are delta_net_graph's.
"""

from __future__ import annotations


from ggmlrun.core.util.errors import InputError
from ggmlrun.models.gguf.names import MODEL_TENSOR as T
from ggmlrun.models.arch.base import ROPE_TYPE_IMROPE, TensorSpec  # noqa: F401 (qwen35's)
from ggmlrun.models.gguf.names import tn
from ggmlrun.models.hparams.record import HParams
from ggmlrun.models.hparams.rules import check_rope_sections


# a card's own keys: card key -> (GGUF key under the architecture, required, default)
CARD_HPARAMS = {"ssm_d_conv": ("ssm.conv_kernel", True, None),
                "ssm_d_inner": ("ssm.inner_size", True, None),
                "ssm_d_state": ("ssm.state_size", True, None),
                "ssm_dt_rank": ("ssm.time_step_rank", True, None),
                "ssm_n_group": ("ssm.group_count", True, None),
                "full_attention_interval": ("full_attention_interval", False, None),
                "rope_sections": ("rope.dimension_sections", True, None),
                "n_layer_nextn": ("nextn_predict_layers", False, None)}


def read_hparams(get, common: dict, sections: bool = True, **extra) -> HParams:
    """The delta-net keys (`extra`: an architecture's own on top, qwen35moe's experts);
    `sections`: IMROPE's rope.dimension_sections are required (qwen3next's NEOX rope has none)."""
    # the last nextn_predict_layers blocks are MTP (multi-token prediction) blocks: counted by
    # block_count, so by -ngl and the layer split, but never loaded (TENSOR_SKIP without
    # load_mtp) nor run, and without KV cache or state (the memory's filters take il < n_layer)
    nextn = int(get("nextn_predict_layers", 0) or 0)
    if nextn >= common["n_layer"]:
        raise InputError(f"nextn_predict_layers {nextn} leaves no layers of block_count "
                         f"{common['n_layer']} to run")
    common = dict(common, n_layer=common["n_layer"] - nextn)
    hp = HParams(**common, **extra, n_layer_nextn=nextn,
             recurrent_layers=get("attention.recurrent_layers", ()),
             ssm_d_conv=get("ssm.conv_kernel"), ssm_d_inner=get("ssm.inner_size"),
             ssm_d_state=get("ssm.state_size"), ssm_dt_rank=get("ssm.time_step_rank"),
             ssm_n_group=get("ssm.group_count"),
             full_attention_interval=get("full_attention_interval", 4),
             rope_sections=get("rope.dimension_sections") if sections else ())
    if hp.ssm_d_inner % hp.ssm_dt_rank or hp.ssm_d_inner // hp.ssm_dt_rank != hp.ssm_d_state:
        raise InputError(f"ssm.inner_size {hp.ssm_d_inner} must be ssm.time_step_rank "
                         f"{hp.ssm_dt_rank} heads of ssm.state_size {hp.ssm_d_state} "
                         f"(llama.cpp's fused gated delta net: S_k == S_v)")
    if hp.ssm_dt_rank % hp.ssm_n_group:
        raise InputError(f"ssm.time_step_rank {hp.ssm_dt_rank} must be a multiple of "
                         f"ssm.group_count {hp.ssm_n_group}")
    if hp.n_embd_head_k != hp.n_embd_head_v:
        raise InputError(f"attention.key_length {hp.n_embd_head_k} must equal "
                         f"attention.value_length {hp.n_embd_head_v}")
    if sections:
        check_rope_sections(hp.rope_sections, hp.n_rot)
    return hp


def layer_tensors(arch: str, hp: HParams, il: int, beta_alpha: bool = False
                  ) -> dict[str, TensorSpec]:
    """load_block_trunk up to the FFN: the norms, then the attention or delta-net tensors;
    `beta_alpha`: qwen3next's one ssm_beta_alpha projection ([b, a] per key head) in place of
    ssm_beta and ssm_alpha."""
    name = lambda t, s="weight": tn(arch, t, s, il)   # noqa: E731
    n, hd = hp.n_embd, hp.n_embd_head_k
    out = {name(T.ATTN_NORM): TensorSpec((n,)), name(T.ATTN_POST_NORM): TensorSpec((n,))}
    if not hp.is_recurrent(il):
        n_q, n_k, n_v = hd * hp.n_head * 2, hp.n_embd_k_gqa, hp.n_embd_v_gqa
        out[name(T.ATTN_Q)] = TensorSpec((n_q, n))
        out[name(T.ATTN_K)] = TensorSpec((n_k, n))
        out[name(T.ATTN_V)] = TensorSpec((n_v, n))
        out[name(T.ATTN_OUT)] = TensorSpec((n, hd * hp.n_head))
        out[name(T.ATTN_Q_NORM)] = TensorSpec((hd,))
        out[name(T.ATTN_K_NORM)] = TensorSpec((hd,))
        return out
    key_dim = hp.ssm_d_state * hp.ssm_n_group
    value_dim = hp.ssm_d_state * hp.ssm_dt_rank
    conv_dim = 2 * key_dim + value_dim
    out[name(T.ATTN_QKV)] = TensorSpec((conv_dim, n))
    out[name(T.ATTN_GATE)] = TensorSpec((value_dim, n))
    out[name(T.SSM_CONV1D)] = TensorSpec((conv_dim, hp.ssm_d_conv))
    out[name(T.SSM_DT, "bias")] = TensorSpec((hp.ssm_dt_rank,))
    out[tn(arch, T.SSM_A, "", il)] = TensorSpec((hp.ssm_dt_rank,))    # "blk.N.ssm_a"
    if beta_alpha:
        out[name(T.SSM_BETA_ALPHA)] = TensorSpec((2 * hp.ssm_dt_rank, n))
    else:
        out[name(T.SSM_BETA)] = TensorSpec((hp.ssm_dt_rank, n))
        out[name(T.SSM_ALPHA)] = TensorSpec((hp.ssm_dt_rank, n))
    out[name(T.SSM_NORM)] = TensorSpec((hp.ssm_d_state,))
    out[name(T.SSM_OUT)] = TensorSpec((n, value_dim))
    return out


def mtp_tensors(arch: str, hp: HParams, ffn, beta_alpha: bool = False
                ) -> dict[str, TensorSpec]:
    """load_block_mtp for each MTP block (il >= n_layer): a full-attention block (its FFN from
    `ffn(name, il)`: dense or the experts) and the nextn.* tensors, all optional: llama.cpp
    skips them without load_mtp."""
    out = {}
    for il in range(hp.n_layer, hp.n_layer_all):
        name = lambda t, s="weight": tn(arch, t, s, il)   # noqa: E731
        block = dict(layer_tensors(arch, hp, il, beta_alpha))
        block.update(ffn(name, il))
        n = hp.n_embd
        block[name(T.NEXTN_EH_PROJ)] = TensorSpec((n, 2 * n))
        block[name(T.NEXTN_ENORM)] = TensorSpec((n,))
        block[name(T.NEXTN_HNORM)] = TensorSpec((n,))
        block[name(T.NEXTN_EMBED_TOKENS)] = TensorSpec((hp.n_vocab, n))
        block[name(T.NEXTN_SHARED_HEAD_HEAD)] = TensorSpec((hp.n_vocab, n))
        block[name(T.NEXTN_SHARED_HEAD_NORM)] = TensorSpec((n,))
        out.update((k, TensorSpec(v.shape, False)) for k, v in block.items())
    return out


def card_tensor(name: str, hp: HParams) -> bool:
    """A card's model carries its MTP blocks' tensors as the converters write them (all but
    nextn.embed_tokens and nextn.shared_head_head), so the quantizer's counters see them; they
    are never loaded."""
    if not name.startswith("blk."):
        return False
    il = int(name.split(".")[1])
    return il >= hp.n_layer and not name.endswith(("nextn.embed_tokens.weight",
                                                   "nextn.shared_head_head.weight"))
