"""The tensors clip_model_loader::load_tensors asks for (get_tensor), for a vision projector:
the common ones, every block's, then the projector type's own. Only those are allocated (a
tensor of the file it never asks for stays on disk); the ones the file lacks are skipped."""

from __future__ import annotations

COMMON = ("v.class_embd", "v.pre_ln.weight", "v.pre_ln.bias", "v.post_ln.weight",
          "v.post_ln.bias", "v.patch_embd.bias", "v.patch_embd.weight", "v.patch_embd.weight.1",
          "v.norm_embd.weight", "v.norm_embd.bias", "v.position_embd.weight")
BLOCK = ("attn_k.weight", "attn_q.weight", "attn_v.weight", "attn_out.weight",
         "attn_qkv.weight", "attn_k_norm.weight", "attn_q_norm.weight", "ln1.weight",
         "ln2.weight", "ls1.weight", "ls2.weight", "out_scale.weight", "attn_post_norm.weight",
         "ffn_post_norm.weight", "attn_k.bias", "attn_q.bias", "attn_v.bias", "attn_out.bias",
         "attn_qkv.bias", "ln1.bias", "ln2.bias", "ffn_gate_inp.weight", "ffn_gate_exps.weight",
         "ffn_up_exps.weight", "ffn_down_exps.weight", "exp_probs_b.weight", "ffn_up.weight",
         "ffn_up.bias", "ffn_gate.weight", "ffn_gate.bias", "ffn_down.weight", "ffn_down.bias",
         "attn_sinks")
DEEPSTACK = ("norm.weight", "norm.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
PROJECTOR = {"gemma3": ("mm.input_projection.weight", "mm.soft_emb_norm.weight"),
             "qwen3vl_merger": ("mm.0.weight", "mm.0.bias", "mm.2.weight", "mm.2.bias")}


def requested(projector_type: str, n_layer: int) -> list[str]:
    names = list(COMMON)
    for il in range(n_layer):
        names += [f"v.blk.{il}.{what}" for what in BLOCK]
        names += [f"v.deepstack.{il}.{what}" for what in DEEPSTACK]
    return names + list(PROJECTOR[projector_type])
