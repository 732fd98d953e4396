"""Tiny random GGUF files that real llama.cpp loads, for conformance tests and the README.

They exist so that llama.cpp itself can be the oracle for ggmlrun's model graphs: each file is
small enough to commit, yet covers what distinguishes real models (MHA and GQA, f32 / f16 /
q8_0 weights, tied output) and each architecture's own features (qwen2's Q/K/V biases, qwen3's
head size independent of n_embd and its Q/K head norms). The weights are random with a fixed
seed per model, so rerunning the script rewrites byte-identical files and the recorded
llama.cpp figures stay valid.

    python3 scripts/llamacpp/make_tiny_gguf.py [--out examples/models]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType, TokenType
from gguf import quants

N_VOCAB = 320          # <unk> <s> </s>, 256 byte tokens, 61 fillers; a multiple of 32
N_CTX_TRAIN = 2048
ROPE_FREQ_BASE = 10000.0
RMS_EPS = 1e-5


@dataclass(frozen=True)
class TinyModel:
    """One file's shape and weight type; `tied` drops output.weight, as many small models do."""
    name: str
    weight_type: str       # "f32" | "f16" | "q8_0": every 2-D weight; norms stay f32
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_layer: int = 4
    tied: bool = False
    seed: int = 0
    arch: str = "llama"
    head_dim: int = 0          # attention.key_length / value_length; 0: n_embd / n_head
    qkv_bias: bool = False     # attn_q/k/v.bias (qwen2)
    qk_norm: bool = False      # attn_q_norm / attn_k_norm (qwen3)
    metadata: tuple = ()       # further (key under the architecture, value) pairs
    fused: bool = False        # attn_qkv and a 2 n_ff ffn_up (gate and up), no ffn_gate (phi3)
    longrope: bool = False     # rope_factors_long / rope_factors_short (phi3)
    post_norms: bool = False   # post_attention_norm / post_ffw_norm after each block (gemma3)
    title: str = ""            # general.name; default the file's name
    n_expert: int = 0          # a mixture of experts (qwen3moe): experts, used per token,
    n_expert_used: int = 0     # and each expert's FFN width (expert_feed_forward_length)
    n_ff_exp: int = 0
    n_expert_shared: int = 0   # glm4moe: shared experts, leading dense layers, NextN layers
    dense_lead: int = 0        # (block_count counts the NextN ones), partial rope (n_rot)
    nextn: int = 0
    # qwen35 (gated delta-net layers with every `interval`-th layer full attention): n_rot,
    # the IMROPE sections and the SSM sizes (conv kernel, state, groups, time-step rank, inner)
    n_rot: int = 0
    ssm: tuple = ()            # (d_conv, d_state, n_group, dt_rank, d_inner)
    interval: int = 0          # full_attention_interval written when set (llama.cpp default 4)
    expert_scale: bool = False # gemma4: the down experts' per-expert scale (ffn_down_exps.scale)
    expert_type: str = ""      # the experts' type where it differs (gpt-oss: mxfp4)
    n_ff_shexp: int = 0        # qwen35moe: expert_shared_feed_forward_length written when set
    # deepseek2's MLA: (q_lora_rank, kv_lora_rank, nope head size, value head size); probs_b:
    # the routers' selection bias (exp_probs_b)
    mla: tuple = ()
    probs_b: bool = False
    sections: tuple = ()       # rope.dimension_sections of an IMROPE model without SSM (qwen3vl)
    l_cache: int = 0           # lfm2: shortconv.l_cache; attention.head_count_kv per layer
    kv_layers: tuple = ()      # (0: a short-conv layer)
    rms_eps: bool = True       # attention.layer_norm_rms_epsilon written (nemotron_h's converter
    #                            writes only attention.layer_norm_epsilon)

    @property
    def n_embd_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


GEMMA4_SWA = (True, False, True, False, True, False)
GEMMA4_KEYS = (("attention.sliding_window_pattern", GEMMA4_SWA),
               ("attention.shared_kv_layers", 2),
               ("attention.head_count_kv", (2, 1, 2, 1, 2, 1)),
               ("feed_forward_length", (128, 128, 128, 128, 256, 256)),
               ("attention.key_length_swa", 16), ("attention.value_length_swa", 16),
               ("rope.dimension_count_swa", 16), ("embedding_length_per_layer_input", 8),
               ("rope.freq_base", 1e6), ("rope.freq_base_swa", 10000.0),
               ("final_logit_softcapping", 30.0))

GEMMA4_MOE_SWA = (True, True, False, True, True, False)
GEMMA4_MOE_KEYS = (("attention.sliding_window_pattern", GEMMA4_MOE_SWA),
                   ("attention.head_count_kv", (2, 2, 1, 2, 2, 1)),
                   ("attention.key_length_swa", 16), ("attention.value_length_swa", 16),
                   ("rope.dimension_count_swa", 16), ("embedding_length_per_layer_input", 0),
                   ("rope.freq_base", 1e6), ("rope.freq_base_swa", 10000.0),
                   ("final_logit_softcapping", 30.0))

MODELS = [
    TinyModel("tiny-llama-f32", "f32", n_embd=64, n_head=4, n_head_kv=4, n_ff=128, seed=1),
    TinyModel("tiny-llama-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=2),
    TinyModel("tiny-llama-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=3),
    TinyModel("tiny-llama-tied-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
              tied=True, seed=4),
    # qwen2: Q/K/V biases; the f16 one tied as the small Qwen2.5 models are
    TinyModel("tiny-qwen2-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, tied=True,
              seed=5, arch="qwen2", qkv_bias=True),
    TinyModel("tiny-qwen2-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=6,
              arch="qwen2", qkv_bias=True),
    # qwen3: heads of 32 over an n_embd of 64 (4 heads: Q is 128 wide), Q/K head norms
    TinyModel("tiny-qwen3-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=7,
              arch="qwen3", head_dim=32, qk_norm=True),
    TinyModel("tiny-qwen3-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=8,
              arch="qwen3", head_dim=32, qk_norm=True),
    # mistral3 (Ministral 3): YaRN rope scaling and Llama 4's attention temperature (the
    # inp_attn_scale input) in the f16 file, as the real ones have; the q8_0 one without both
    TinyModel("tiny-mistral3-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=9,
              arch="mistral3", metadata=(("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0),
                                         ("rope.scaling.original_context_length", 512),
                                         ("rope.scaling.yarn_beta_fast", 32.0),
                                         ("rope.scaling.yarn_beta_slow", 1.0),
                                         ("rope.scaling.yarn_log_multiplier", 1.0),
                                         ("attention.temperature_scale", 0.1))),
    TinyModel("tiny-mistral3-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=10,
              arch="mistral3"),
    # phi3: fused QKV and gate/up, LongRoPE factors: an original context of 512 makes ctx 256
    # use the short factors and ctx 1024 the long ones. general.name avoids "phi3"/"phi-3",
    # for which llama.cpp's vocabulary wants Phi's <|endoftext|> token.
    TinyModel("tiny-phi3-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=96, seed=11,
              arch="phi3", fused=True, longrope=True, title="tiny-phi-three-f16",
              metadata=(("rope.scaling.type", "longrope"),
                        ("rope.scaling.original_context_length", 512),
                        ("rope.scaling.attn_factor", 1.1902380714238083))),
    TinyModel("tiny-phi3-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=4, n_ff=128, seed=12,
              arch="phi3", fused=True, longrope=True, title="tiny-phi-three-q8_0",
              metadata=(("rope.scaling.type", "longrope"),
                        ("rope.scaling.original_context_length", 512),
                        ("rope.scaling.attn_factor", 1.1902380714238083))),
    # gemma3: sliding-window layers (a window of 64 / 128 cells, so ctx 256 and 1024 with
    # ubatch 32 and 512 give SWA caches of 256 and 768 cells), heads of 32 over an n_embd of
    # 64, Q/K head norms, post-norms, GEGLU, tied output. The f16 file has no pattern key (6
    # layers: the default pattern 6 makes layers 0-4 SWA, 5 full), a full-layer rope base of
    # 1e6 scaled linearly by 8 (as Gemma-3-27B) and a final logit softcap; the q8_0 file has
    # pattern 3 (layers 2 and 5 full) and its own SWA rope base.
    TinyModel("tiny-gemma3-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_layer=6,
              seed=13, arch="gemma3", head_dim=32, qk_norm=True, post_norms=True, tied=True,
              metadata=(("attention.sliding_window", 64), ("rope.freq_base", 1e6),
                        ("rope.scaling.type", "linear"), ("rope.scaling.factor", 8.0),
                        ("final_logit_softcapping", 30.0))),
    TinyModel("tiny-gemma3-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=1, n_ff=192, n_layer=6,
              seed=14, arch="gemma3", head_dim=32, qk_norm=True, post_norms=True, tied=True,
              metadata=(("attention.sliding_window", 128), ("attention.sliding_window_pattern", 3),
                        ("rope.freq_base", 1e6), ("rope.freq_base_swa", 20000.0))),
    # gemma4 (dense, as Gemma-4-E2B in miniature): layers 0, 2, 4 slide (a bool array), 1, 3,
    # 5 are full; heads of 16 on the sliding layers over 2 KV heads, of 32 on the full ones
    # over 1 KV head with V = K (no attn_v: use_alternative_attention) and proportional rope
    # (rope_freqs, made with the first full layer); layers 4 and 5 read the caches of layers
    # 2 and 3 (shared_kv_layers 2) and have twice the FFN; per-layer embeddings of 8 (the
    # second token input); a layer output scale; V normed without a weight; logit softcap.
    TinyModel("tiny-gemma4-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_layer=6,
              seed=15, arch="gemma4", head_dim=32, qk_norm=True, post_norms=True, tied=True,
              metadata=GEMMA4_KEYS + (("attention.sliding_window", 64),)),
    # the q8_0 one: 2 KV heads everywhere, so V rows are 32 wide on the sliding layers and 64 on
    # the full ones (without flash attention the V cache pads them to 64: ggml_pad)
    TinyModel("tiny-gemma4-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_layer=6,
              seed=16, arch="gemma4", head_dim=32, qk_norm=True, post_norms=True, tied=True,
              metadata=tuple((k, (2,) * 6 if k == "attention.head_count_kv" else v)
                             for k, v in GEMMA4_KEYS) + (("attention.sliding_window", 128),)),
    # gemma4 with experts (Gemma-4-26B-A4B in miniature): 5 sliding layers to 1 full (layers 2
    # and 5 full: heads of 32 over 1 KV head, V = K, rope_freqs), no per-layer embeddings nor
    # KV sharing; each layer's dense GEGLU FFN of 128 beside 8 routed experts of 32 (2 used),
    # gate and up fused (ffn_gate_up_exps), the router on the attention output with its scale,
    # and in the f16 file the down experts' per-expert scale. The q8_0 one has 2 KV heads
    # everywhere, no per-expert scale and a dense layer 0 (no router: llama.cpp's is_moe_layer
    # is per layer).
    TinyModel("tiny-gemma4moe-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
              n_layer=6, seed=17, arch="gemma4", head_dim=32, qk_norm=True, post_norms=True,
              tied=True, n_expert=8, n_expert_used=2, n_ff_exp=32, expert_scale=True,
              metadata=GEMMA4_MOE_KEYS + (("attention.sliding_window", 64),)),
    TinyModel("tiny-gemma4moe-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
              n_layer=6, seed=18, arch="gemma4", head_dim=32, qk_norm=True, post_norms=True,
              tied=True, n_expert=8, n_expert_used=2, n_ff_exp=32, dense_lead=1,
              metadata=tuple((k, (2,) * 6 if k == "attention.head_count_kv" else v)
                             for k, v in GEMMA4_MOE_KEYS) + (("attention.sliding_window", 128),)),
    # qwen3moe: qwen3's attention and 8 experts of 32, 2 used per token
    TinyModel("tiny-qwen3moe-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=64, seed=13,
              arch="qwen3moe", head_dim=32, qk_norm=True, n_expert=8, n_expert_used=2,
              n_ff_exp=32),
    TinyModel("tiny-qwen3moe-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=64, seed=14,
              arch="qwen3moe", head_dim=32, qk_norm=True, n_expert=8, n_expert_used=2,
              n_ff_exp=32),
    # glm4moe (GLM-4.5-Air's shape, small): Q/K/V biases, half the head rotated (NeoX), layer 0
    # dense, then 8 routed experts of 32 (2 used, sigmoid gates with a selection bias, weights
    # normalised and scaled by 2.5) beside one shared expert, and a NextN block (layer 3) that
    # -ngl counts but llama.cpp never loads; Q/K head norms in the q8_0 file (GLM-4.5's)
    TinyModel("tiny-glm4moe-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, seed=15,
              arch="glm4moe", head_dim=32, qkv_bias=True, n_expert=8, n_expert_used=2,
              n_ff_exp=32, n_expert_shared=1, dense_lead=1, nextn=1, n_rot=16,
              metadata=(("expert_weights_scale", 2.5), ("expert_weights_norm", True),
                        ("expert_gating_func", 2))),
    TinyModel("tiny-glm4moe-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, seed=16,
              arch="glm4moe", head_dim=32, qkv_bias=True, qk_norm=True, n_expert=8,
              n_expert_used=2, n_ff_exp=32, n_expert_shared=1, dense_lead=1, nextn=1, n_rot=16,
              metadata=(("expert_weights_scale", 2.5), ("expert_weights_norm", True),
                        ("expert_gating_func", 2))),
    # qwen35 (Qwen3.5/3.6 dense): gated delta-net layers (state 16, 2 key heads, 4 value heads)
    # and gated full attention (heads of 32, a partial IMROPE of 16 dims in sections 3,3,2,0);
    # the f16 file has every second layer full attention, the q8_0 one llama.cpp's default 4
    TinyModel("tiny-qwen35-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=13,
              arch="qwen35", head_dim=32, n_rot=16, ssm=(4, 16, 2, 4, 64), interval=2),
    TinyModel("tiny-qwen35-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=14,
              arch="qwen35", head_dim=32, n_rot=16, ssm=(4, 16, 2, 4, 64)),
    # qwen35moe (Qwen3.5/3.6-35B-A3B in miniature): qwen35's layers with 8 experts of 32 (2
    # used) beside a shared expert with its sigmoid gate row. The f16 file is as the real ones
    # (no feed_forward_length; the shared expert's width, 64, from its own key; every second
    # layer full attention); the q8_0 one gives feed_forward_length 96 for the shared expert
    # and has an MTP block (block 4 of 5, as Qwen3.6's files: counted by -ngl, never loaded)
    TinyModel("tiny-qwen35moe-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=0, seed=17,
              arch="qwen35moe", head_dim=32, n_rot=16, ssm=(4, 16, 2, 4, 64), interval=2,
              n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64),
    TinyModel("tiny-qwen35moe-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=96, seed=18,
              arch="qwen35moe", head_dim=32, n_rot=16, ssm=(4, 16, 2, 4, 64), n_layer=5,
              nextn=1, n_expert=8, n_expert_used=2, n_ff_exp=32),
    # deepseek2 (DeepSeek-V3's shape, small): MLA with Q compressed to 32 and K/V to 32, heads
    # of 32 + 16 rotated (the cache row 48), V heads of 32; layer 0 dense, then 8 experts of
    # 32 (2 used) beside one shared expert. The f16 file has V3's sigmoid gates with a selection
    # bias, normalised weights scaled by 2.5 and YaRN (factor 4 over 512, V2-Lite's mscale_all_dim
    # 0.707); the q8_0 one has no gating key (llama.cpp then picks softmax, as for V2's files)
    TinyModel("tiny-deepseek2-f16", "f16", n_embd=64, n_head=4, n_head_kv=1, n_ff=128, seed=17,
              arch="deepseek2", n_expert=8, n_expert_used=2, n_ff_exp=32, n_expert_shared=1,
              dense_lead=1, n_rot=16, mla=(32, 32, 32, 32), probs_b=True,
              metadata=(("expert_weights_scale", 2.5), ("expert_weights_norm", True),
                        ("expert_gating_func", 2), ("rope.scaling.type", "yarn"),
                        ("rope.scaling.factor", 4.0),
                        ("rope.scaling.original_context_length", 512),
                        ("rope.scaling.yarn_log_multiplier", 0.0707))),
    TinyModel("tiny-deepseek2-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=1, n_ff=128,
              seed=18, arch="deepseek2", n_expert=8, n_expert_used=2, n_ff_exp=32,
              n_expert_shared=1, dense_lead=1, n_rot=16, mla=(32, 32, 32, 32),
              metadata=(("expert_weights_norm", True),)),
    # the lite variant (DeepSeek-V2-Lite's shape): q_lora_rank 0, so a plain attn_q; 2 shared
    # experts, weights neither normalised nor scaled, softmax gating, no selection bias
    TinyModel("tiny-deepseek2-lite-f16", "f16", n_embd=64, n_head=4, n_head_kv=1, n_ff=128,
              seed=19, arch="deepseek2", n_expert=8, n_expert_used=2, n_ff_exp=32,
              n_expert_shared=2, dense_lead=1, n_rot=16, mla=(0, 32, 32, 32),
              metadata=(("expert_gating_func", 1),)),
    # qwen3vl (Qwen3-VL's text model): qwen3's layers with IMROPE over the whole head of 32
    # (sections 6,5,5,0 as Qwen3-VL's 24,20,20,0 of 128: the only split of 16 pairs whose
    # interleaving gives every pair t, h or w, none the fourth stream) and deepstack inputs:
    # the f16 file has 3 deepstack layers of its 4 (inp_embd 4 n_embd wide, as Qwen3-VL-8B's
    # 3 of 36), the q8_0 one 1 and a tied output (as the 2B / 4B)
    TinyModel("tiny-qwen3vl-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=20,
              arch="qwen3vl", head_dim=32, qk_norm=True, sections=(6, 5, 5, 0),
              metadata=(("n_deepstack_layers", 3),)),
    TinyModel("tiny-qwen3vl-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=21,
              arch="qwen3vl", head_dim=32, qk_norm=True, sections=(6, 5, 5, 0), tied=True,
              metadata=(("n_deepstack_layers", 1),)),
    # qwen3vlmoe (Qwen3-VL-30B-A3B in miniature): qwen3moe's 8 experts of 32 (2 used) with
    # qwen3vl's IMROPE and 3 (f16) / 2 (q8_0) deepstack layers
    TinyModel("tiny-qwen3vlmoe-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=64, seed=22,
              arch="qwen3vlmoe", head_dim=32, qk_norm=True, n_expert=8, n_expert_used=2,
              n_ff_exp=32, sections=(6, 5, 5, 0), metadata=(("n_deepstack_layers", 3),)),
    TinyModel("tiny-qwen3vlmoe-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=64,
              seed=23, arch="qwen3vlmoe", head_dim=32, qk_norm=True, n_expert=8,
              n_expert_used=2, n_ff_exp=32, sections=(6, 5, 5, 0),
              metadata=(("n_deepstack_layers", 2),)),
    # lfm2 (LFM2-1.2B in miniature: short-conv layers with attention every few): 0 KV heads
    # make a short-conv layer (kernel 3: 2 columns of state per channel), heads of 16; the
    # f16 file has layers conv, conv, attention, conv (the last layer a conv: its output rows
    # after the conv), the q8_0 one conv, attention, conv, attention with 1 KV head and a
    # tied output (the real files tie it)
    TinyModel("tiny-lfm2-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=24,
              arch="lfm2", qk_norm=True, l_cache=3, kv_layers=(0, 0, 2, 0)),
    TinyModel("tiny-lfm2-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=1, n_ff=192, seed=25,
              arch="lfm2", qk_norm=True, l_cache=3, kv_layers=(0, 1, 0, 1), tied=True),
    # lfm2moe (LFM2-8B-A1B in miniature): lfm2's layers, layer 0 dense (leading_dense_block_count
    # 1), then 8 experts of 32 (2 used) with sigmoid gates and a selection bias; the q8_0 file
    # softmax gates, 2 dense layers, tied output
    TinyModel("tiny-lfm2moe-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, seed=26,
              arch="lfm2moe", qk_norm=True, l_cache=3, kv_layers=(0, 2, 0, 2), n_expert=8,
              n_expert_used=2, n_ff_exp=32, dense_lead=1, probs_b=True,
              metadata=(("expert_gating_func", 2),)),
    TinyModel("tiny-lfm2moe-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, seed=27,
              arch="lfm2moe", qk_norm=True, l_cache=3, kv_layers=(0, 0, 2, 0), n_expert=8,
              n_expert_used=2, n_ff_exp=32, dense_lead=2, probs_b=True, tied=True,
              metadata=(("expert_gating_func", 1),)),
]

# gpt-oss (gpt-oss-20b in miniature): Q/K/V/O biases, attention sinks, every other layer
# sliding (pattern 2, a window of 64 cells), YaRN (factor 4 over an original 512, rope base
# 150000 on both kinds of layer), 8 experts of 64 with 2 used, biased router and experts
# (add_id), swiglu_oai; its own output.weight. The mxfp4 file is ggml-org's mix in small: MXFP4
# experts, q8_0 matrices, f32 norms, biases, sinks and router.
GPT_OSS_KEYS = (("attention.sliding_window", 64), ("rope.freq_base", 150000.0),
                ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0),
                ("rope.scaling.original_context_length", 512))
MODELS += [
    TinyModel(f"tiny-gpt-oss-{kind}", weight, n_embd=64, n_head=4, n_head_kv=2, n_ff=64,
              seed=seed, arch="gpt-oss", head_dim=32, qkv_bias=True, n_expert=8,
              n_expert_used=2, n_ff_exp=64, metadata=GPT_OSS_KEYS, expert_type=experts)
    for kind, weight, experts, seed in (("f16", "f16", "", 17), ("q8_0", "q8_0", "", 18),
                                        ("mxfp4", "q8_0", "mxfp4", 19))]

# --- the Mamba-2 hybrids (nemotron_h, nemotron_h_moe, granitehybrid) ------------------------
# nemotron_h (Nemotron-H in miniature): each layer a Mamba-2 block (no KV heads, no FFN), an
# attention block (KV heads, no FFN, no rope) or a squared-ReLU MLP (an FFN width), per layer;
# SSM: conv kernel 4, state 16, 2 groups, 4 heads of 16 (d_inner 64). The f16 file's layers
# are M, MLP, A, MLP, M, MLP (the last an MLP); the q8_0 one M, A, MLP, M, tied output.
NEMOTRON_H_EPS = (("attention.layer_norm_epsilon", 1e-5),)
MODELS += [
    TinyModel("tiny-nemotronh-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, seed=40,
              arch="nemotron_h", n_layer=6, ssm=(4, 16, 2, 4, 64), kv_layers=(0, 0, 2, 0, 0, 0),
              metadata=NEMOTRON_H_EPS + (("feed_forward_length", (0, 128, 0, 128, 0, 128)),)),
    TinyModel("tiny-nemotronh-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=1, n_ff=128, seed=41,
              arch="nemotron_h", ssm=(4, 16, 2, 4, 64), kv_layers=(0, 1, 0, 0), tied=True,
              metadata=NEMOTRON_H_EPS + (("feed_forward_length", (0, 0, 128, 0)),)),
]

# nemotron_h_moe (Nemotron-3-Nano in miniature): the MLP layers are 8 experts of 32 (2 used,
# no gate, sigmoid router with a selection bias) beside a shared expert of 64; the f16 file's
# weights normalised and scaled by 2.5 (M, E, A, E, M, E), the q8_0 one's through a latent of
# 32 (moe_latent_size), neither normalised nor scaled (M, E, A, M, E), tied output, and as the
# converter writes them only attention.layer_norm_epsilon (1e-6: the RMS norms' epsilon)
NEMOTRON_H_MOE = dict(n_embd=64, n_head=4, n_ff=32, arch="nemotron_h_moe", ssm=(4, 16, 2, 4, 64),
                      n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64, probs_b=True)
MODELS += [
    TinyModel("tiny-nemotronhmoe-f16", "f16", n_head_kv=2, seed=42, n_layer=6,
              kv_layers=(0, 0, 2, 0, 0, 0), **NEMOTRON_H_MOE,
              metadata=NEMOTRON_H_EPS + (("feed_forward_length", (0, 32, 0, 32, 0, 32)),
                                         ("expert_weights_norm", True),
                                         ("expert_weights_scale", 2.5),
                                         ("expert_shared_count", 1))),
    TinyModel("tiny-nemotronhmoe-q8_0", "q8_0", n_head_kv=1, seed=43, n_layer=5,
              kv_layers=(0, 0, 1, 0, 0), tied=True, **NEMOTRON_H_MOE, rms_eps=False,
              metadata=(("attention.layer_norm_epsilon", 1e-6),
                        ("feed_forward_length", (0, 32, 0, 0, 32)),
                                         ("moe_latent_size", 32), ("expert_shared_count", 1))),
]

# granitehybrid (Granite 4.0-H in miniature): Mamba-2 layers (d_inner 2 n_embd: 8 heads of 16,
# 2 groups, state 16) where head_count_kv is 0, attention elsewhere, every layer an FFN; Granite's
# multipliers (embeddings x12, residuals x0.22, logits /8, KQ scale 0.125). The f16 file: dense
# SwiGLU, rope (M, M, A, M); the q8_0 one: 8 experts of 32 (2 used) and a shared expert of 64,
# no rope (rope.scaling.finetuned false, as the real files), tied output (M, A, M, M)
GRANITE_KEYS = (("embedding_scale", 12.0), ("residual_scale", 0.22), ("logit_scale", 8.0),
                ("attention.scale", 0.125))
MODELS += [
    TinyModel("tiny-granitehybrid-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128,
              seed=44, arch="granitehybrid", ssm=(4, 16, 2, 8, 128), kv_layers=(0, 0, 2, 0),
              metadata=GRANITE_KEYS),
    TinyModel("tiny-granitehybrid-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=1, n_ff=32,
              seed=45, arch="granitehybrid", ssm=(4, 16, 2, 8, 128), kv_layers=(0, 1, 0, 0),
              n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64, tied=True,
              metadata=GRANITE_KEYS + (("rope.scaling.finetuned", False),)),
]


def granite_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """llama_model_granite_hybrid::load_arch_tensors' order: nemotron_h's Mamba-2 and attention
    tensors, then ffn_norm and the dense FFN or the experts (gate, down, up of n_ff) and the
    shared expert."""
    d_conv, d_state, n_group, dt_rank, d_inner = m.ssm
    n, hd, ff = m.n_embd, m.n_embd_head, m.n_ff
    shapes = {"token_embd.weight": (N_VOCAB, n), "output_norm.weight": (n,)}
    if not m.tied:
        shapes["output.weight"] = (N_VOCAB, n)
    for i, kv in enumerate(m.kv_layers):
        b = f"blk.{i}."
        shapes[b + "attn_norm.weight"] = (n,)
        if kv == 0:
            shapes.update({b + "ssm_in.weight": (2 * d_inner + 2 * n_group * d_state + dt_rank, n),
                           b + "ssm_conv1d.weight": (d_inner + 2 * n_group * d_state, d_conv),
                           b + "ssm_conv1d.bias": (d_inner + 2 * n_group * d_state,),
                           b + "ssm_dt.bias": (dt_rank,), b + "ssm_a": (dt_rank, 1),
                           b + "ssm_d": (dt_rank, 1),
                           b + "ssm_norm.weight": (n_group, d_inner // n_group),
                           b + "ssm_out.weight": (n, d_inner)})
        else:
            shapes.update({b + "attn_q.weight": (n, n), b + "attn_k.weight": (kv * hd, n),
                           b + "attn_v.weight": (kv * hd, n), b + "attn_output.weight": (n, n)})
        shapes[b + "ffn_norm.weight"] = (n,)
        if m.n_expert:
            ne = m.n_expert
            shapes.update({b + "ffn_gate_inp.weight": (ne, n),
                           b + "ffn_gate_exps.weight": (ne, ff, n),
                           b + "ffn_down_exps.weight": (ne, n, ff),
                           b + "ffn_up_exps.weight": (ne, ff, n),
                           b + "ffn_gate_shexp.weight": (m.n_ff_shexp, n),
                           b + "ffn_up_shexp.weight": (m.n_ff_shexp, n),
                           b + "ffn_down_shexp.weight": (n, m.n_ff_shexp)})
        else:
            shapes.update({b + "ffn_gate.weight": (ff, n), b + "ffn_down.weight": (n, ff),
                           b + "ffn_up.weight": (ff, n)})
    return shapes


def nemotron_h_experts(m: TinyModel, b: str, shapes: dict) -> None:
    """An MoE layer: router, selection bias, the optional latent projections, up/down experts
    (no gate), the shared expert."""
    n, ne = m.n_embd, m.n_expert
    lat = dict(m.metadata).get("moe_latent_size", 0)
    w = lat or n
    shapes.update({b + "ffn_gate_inp.weight": (ne, n), b + "exp_probs_b.bias": (ne,)})
    if lat:
        shapes.update({b + "ffn_latent_down.weight": (lat, n),
                       b + "ffn_latent_up.weight": (n, lat)})
    shapes.update({b + "ffn_down_exps.weight": (ne, w, m.n_ff_exp),
                   b + "ffn_up_exps.weight": (ne, m.n_ff_exp, w),
                   b + "ffn_down_shexp.weight": (n, m.n_ff_shexp),
                   b + "ffn_up_shexp.weight": (m.n_ff_shexp, n)})


def nemotron_h_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """llama_model_nemotron_h::load_arch_tensors' order; ssm_a / ssm_d are [H, 1], ssm_norm
    [G, d_inner / G] (kept f32 by add_weight, as the converter stores them)."""
    d_conv, d_state, n_group, dt_rank, d_inner = m.ssm
    n, hd = m.n_embd, m.n_embd_head
    ff = dict(m.metadata)["feed_forward_length"]
    conv_dim = d_inner + 2 * n_group * d_state
    shapes = {"token_embd.weight": (N_VOCAB, n), "output_norm.weight": (n,)}
    if not m.tied:
        shapes["output.weight"] = (N_VOCAB, n)
    for i, (kv, f) in enumerate(zip(m.kv_layers, ff)):
        b = f"blk.{i}."
        shapes[b + "attn_norm.weight"] = (n,)
        if kv == 0 and f == 0:
            shapes.update({b + "ssm_in.weight": (2 * d_inner + 2 * n_group * d_state + dt_rank, n),
                           b + "ssm_conv1d.weight": (conv_dim, d_conv),
                           b + "ssm_conv1d.bias": (conv_dim,), b + "ssm_dt.bias": (dt_rank,),
                           b + "ssm_a": (dt_rank, 1), b + "ssm_d": (dt_rank, 1),
                           b + "ssm_norm.weight": (n_group, d_inner // n_group),
                           b + "ssm_out.weight": (n, d_inner)})
        elif f == 0:
            shapes.update({b + "attn_q.weight": (n, n), b + "attn_k.weight": (kv * hd, n),
                           b + "attn_v.weight": (kv * hd, n), b + "attn_output.weight": (n, n)})
        elif m.n_expert:
            nemotron_h_experts(m, b, shapes)
        else:
            shapes.update({b + "ffn_down.weight": (n, f), b + "ffn_up.weight": (f, n)})
    return shapes



# --- wave 2b (issue 32): minimax-m2, llama4, ... -------------------------------------------
# minimax-m2 (MiniMax-M2 in miniature): heads of 32 with a NeoX rope over 16 of them (M2's 64
# of 128), Q/K norms over the whole Q / K width, 8 experts of 32 (feed_forward_length: llama.cpp
# shapes the experts by it), 2 used, a selection bias; sigmoid gates in the f16 file (M2's),
# softmax in the q8_0 one
MODELS += [
    TinyModel(f"tiny-minimaxm2-{weight}", weight, n_embd=64, n_head=4, n_head_kv=2, n_ff=32,
              seed=seed, arch="minimax-m2", head_dim=32, n_rot=16, n_expert=8, n_expert_used=2,
              n_ff_exp=32, probs_b=True, metadata=(("expert_gating_func", func),))
    for weight, seed, func in (("f16", 40, 2), ("q8_0", 41, 1))]


def minimax_m2_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    e, n_q, n_k = m.n_expert, m.n_head * m.n_embd_head, m.n_head_kv * m.n_embd_head
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_VOCAB, m.n_embd),
                                          "output_norm.weight": (m.n_embd,),
                                          "output.weight": (N_VOCAB, m.n_embd)}
    for i in range(m.n_layer):
        b = f"blk.{i}."
        shapes.update({
            b + "attn_q.weight": (n_q, m.n_embd), b + "attn_k.weight": (n_k, m.n_embd),
            b + "attn_v.weight": (n_k, m.n_embd), b + "attn_output.weight": (m.n_embd, n_q),
            b + "attn_norm.weight": (m.n_embd,), b + "attn_q_norm.weight": (n_q,),
            b + "attn_k_norm.weight": (n_k,), b + "ffn_norm.weight": (m.n_embd,),
            b + "ffn_gate_inp.weight": (e, m.n_embd),
            b + "ffn_gate_exps.weight": (e, m.n_ff, m.n_embd),
            b + "ffn_down_exps.weight": (e, m.n_embd, m.n_ff),
            b + "ffn_up_exps.weight": (e, m.n_ff, m.n_embd), b + "exp_probs_b.bias": (e,)})
    return shapes


# llama4 (Llama 4 in miniature): heads of 32 all rotated, layers 0-2 chunked and layer 3 NoPE
# (llama.cpp's pattern of 4), 8 experts of 32 (2 used) beside a shared expert of 32; the f16
# file interleaves dense and MoE layers (step 2, as Maverick) and states a window (which
# llama.cpp overrides with its chunk of 8192), the q8_0 one is all MoE (step 1, as Scout) and
# ties the output
MODELS += [
    TinyModel("tiny-llama4-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, seed=42,
              arch="llama4", head_dim=32, n_expert=8, n_expert_used=2, n_ff_exp=32,
              metadata=(("interleave_moe_layer_step", 2), ("attention.sliding_window", 8192))),
    TinyModel("tiny-llama4-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=128, seed=43,
              arch="llama4", head_dim=32, n_expert=8, n_expert_used=2, n_ff_exp=32, tied=True,
              metadata=(("interleave_moe_layer_step", 1),))]


def llama4_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    n_q, n_k, e = m.n_head * m.n_embd_head, m.n_head_kv * m.n_embd_head, m.n_expert
    step = dict(m.metadata)["interleave_moe_layer_step"]
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_VOCAB, m.n_embd),
                                          "output_norm.weight": (m.n_embd,)}
    if not m.tied:
        shapes["output.weight"] = (N_VOCAB, m.n_embd)
    for i in range(m.n_layer):
        b = f"blk.{i}."
        shapes.update({b + "attn_norm.weight": (m.n_embd,), b + "attn_q.weight": (n_q, m.n_embd),
                       b + "attn_k.weight": (n_k, m.n_embd), b + "attn_v.weight": (n_k, m.n_embd),
                       b + "attn_output.weight": (m.n_embd, n_q), b + "ffn_norm.weight": (m.n_embd,)})
        if (i + 1) % step == 0:
            shapes.update({b + "ffn_gate_inp.weight": (e, m.n_embd),
                           b + "ffn_gate_exps.weight": (e, m.n_ff_exp, m.n_embd),
                           b + "ffn_down_exps.weight": (e, m.n_embd, m.n_ff_exp),
                           b + "ffn_up_exps.weight": (e, m.n_ff_exp, m.n_embd),
                           b + "ffn_gate_shexp.weight": (m.n_ff_exp, m.n_embd),
                           b + "ffn_down_shexp.weight": (m.n_embd, m.n_ff_exp),
                           b + "ffn_up_shexp.weight": (m.n_ff_exp, m.n_embd)})
        else:
            shapes.update({b + "ffn_gate.weight": (m.n_ff, m.n_embd),
                           b + "ffn_down.weight": (m.n_embd, m.n_ff),
                           b + "ffn_up.weight": (m.n_ff, m.n_embd)})
    return shapes


# dense ones: seed_oss (Seed-OSS-36B: heads of 32 over an n_embd of 64, Q/K/V biases, the FFN's
# norm named post_attention_norm; the q8_0 file tied), olmo2 (OLMo 2: no pre-attention norm,
# Q/K norms over the whole width, norms after attention and FFN; MHA in the f16 file, one KV
# head in the q8_0 one), smollm3 (SmolLM3: every fourth layer without rope; the q8_0 file
# tied, heads of 32)
MODELS += [
    TinyModel("tiny-seedoss-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=44,
              arch="seed_oss", head_dim=32, qkv_bias=True),
    TinyModel("tiny-seedoss-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=45,
              arch="seed_oss", head_dim=32, qkv_bias=True, tied=True),
    TinyModel("tiny-olmo2-f16", "f16", n_embd=64, n_head=2, n_head_kv=2, n_ff=192, seed=46,
              arch="olmo2"),
    TinyModel("tiny-olmo2-q8_0", "q8_0", n_embd=64, n_head=2, n_head_kv=1, n_ff=192, seed=47,
              arch="olmo2"),
    TinyModel("tiny-smollm3-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=192, seed=48,
              arch="smollm3"),
    TinyModel("tiny-smollm3-q8_0", "q8_0", n_embd=64, n_head=2, n_head_kv=1, n_ff=192, seed=49,
              arch="smollm3", tied=True),
    # OLMo 3 (olmo2's graph with sliding layers): a window of 64 on layers 0-2 (the default
    # pattern of 4), YaRN (factor 4 over 512) on the full layer only
    TinyModel("tiny-olmo3-f16", "f16", n_embd=64, n_head=2, n_head_kv=2, n_ff=192, seed=50,
              arch="olmo2", title="tiny-olmo3-f16",
              metadata=(("attention.sliding_window", 64), ("rope.scaling.type", "yarn"),
                        ("rope.scaling.factor", 4.0),
                        ("rope.scaling.original_context_length", 512)))]
# qwen3next (Qwen3-Next-80B-A3B in miniature): qwen35moe's layers (2 key heads repeated to 4
# value heads, 8 experts of 32 with 2 used, a gated shared expert of 64) with NEOX rope over 16
# of 32 dims and ssm_beta_alpha; the f16 file has every second layer full attention and no
# feed_forward_length, the q8_0 one the default interval 4 and an MTP block (block 4 of 5)
MODELS += [
    TinyModel("tiny-qwen3next-f16", "f16", n_embd=64, n_head=4, n_head_kv=2, n_ff=0, seed=60,
              arch="qwen3next", head_dim=32, n_rot=16, ssm=(4, 16, 2, 4, 64), interval=2,
              n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64),
    TinyModel("tiny-qwen3next-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=2, n_ff=96, seed=61,
              arch="qwen3next", head_dim=32, n_rot=16, ssm=(4, 16, 2, 4, 64), n_layer=5,
              nextn=1, n_expert=8, n_expert_used=2, n_ff_exp=32)]

# mistral4 (Mistral Small 4 in miniature): deepseek2's MLA and experts under their own
# architecture name. The f16 file has YaRN with a log multiplier of 0.0707 (mscale_all_dim
# 0.707), where llama.cpp's mscale stays 1 for mistral4 (deepseek2's takes mscale_all_dims),
# softmax gating and every layer MoE; the q8_0 one Mistral's own shape: YaRN with multiplier
# 0.1 (mscale_all_dim 1), sigmoid gating with a selection bias, a dense first layer
MODELS += [
    TinyModel("tiny-mistral4-f16", "f16", n_embd=64, n_head=4, n_head_kv=1, n_ff=128, seed=62,
              arch="mistral4", n_expert=8, n_expert_used=2, n_ff_exp=32, n_expert_shared=1,
              dense_lead=0, n_rot=16, mla=(32, 32, 32, 32),
              metadata=(("expert_weights_norm", True), ("expert_gating_func", 1),
                        ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0),
                        ("rope.scaling.original_context_length", 512),
                        ("rope.scaling.yarn_log_multiplier", 0.0707))),
    TinyModel("tiny-mistral4-q8_0", "q8_0", n_embd=64, n_head=4, n_head_kv=1, n_ff=128,
              seed=63, arch="mistral4", n_expert=8, n_expert_used=2, n_ff_exp=32,
              n_expert_shared=1, dense_lead=1, n_rot=16, mla=(32, 32, 32, 32), probs_b=True,
              metadata=(("expert_weights_norm", True), ("expert_gating_func", 2),
                        ("rope.scaling.type", "yarn"), ("rope.scaling.factor", 4.0),
                        ("rope.scaling.original_context_length", 512),
                        ("rope.scaling.yarn_log_multiplier", 0.1)))]


def dense_shapes(m: TinyModel, order: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """A dense model's tensors with each layer's in `order` (llama.cpp's load order)."""
    n_q, n_k = m.n_head * m.n_embd_head, m.n_head_kv * m.n_embd_head
    each = {"attn_norm.weight": (m.n_embd,), "attn_q.weight": (n_q, m.n_embd),
            "attn_k.weight": (n_k, m.n_embd), "attn_v.weight": (n_k, m.n_embd),
            "attn_q.bias": (n_q,), "attn_k.bias": (n_k,), "attn_v.bias": (n_k,),
            "attn_output.weight": (m.n_embd, n_q), "attn_q_norm.weight": (n_q,),
            "attn_k_norm.weight": (n_k,), "post_attention_norm.weight": (m.n_embd,),
            "ffn_norm.weight": (m.n_embd,), "ffn_gate.weight": (m.n_ff, m.n_embd),
            "ffn_up.weight": (m.n_ff, m.n_embd), "ffn_down.weight": (m.n_embd, m.n_ff),
            "post_ffw_norm.weight": (m.n_embd,)}
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_VOCAB, m.n_embd),
                                          "output_norm.weight": (m.n_embd,)}
    if not m.tied:
        shapes["output.weight"] = (N_VOCAB, m.n_embd)
    for i in range(m.n_layer):
        shapes.update((f"blk.{i}.{t}", each[t]) for t in order
                      if m.qkv_bias or not t.endswith(".bias"))
    return shapes


QKV = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q.bias", "attn_k.bias",
       "attn_v.bias")
WAVE2B_SHAPES = {
    "minimax-m2": minimax_m2_shapes, "llama4": llama4_shapes,
    "seed_oss": lambda m: dense_shapes(m, QKV + (
        "attn_output.weight", "attn_norm.weight", "post_attention_norm.weight",
        "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")),
    "olmo2": lambda m: dense_shapes(m, QKV + (
        "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight",
        "post_attention_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
        "post_ffw_norm.weight")),
    "smollm3": lambda m: dense_shapes(m, ("attn_norm.weight",) + QKV + (
        "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_down.weight",
        "ffn_up.weight"))}
# --- end of wave 2b ---------------------------------------------------------------------------

FILE_TYPES = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16,
              "mxfp4": LlamaFileType.MOSTLY_MXFP4_MOE,
              "q8_0": LlamaFileType.MOSTLY_Q8_0,
              # record_devices.py's repack model (not bundled)
              "q4_0": LlamaFileType.MOSTLY_Q4_0}


def vocabulary(n_vocab: int = N_VOCAB) -> tuple[list[bytes], list[float], list[int]]:
    """An SPM vocabulary llama.cpp accepts: specials, the 256 byte fallbacks, then fillers
    (record_real_dims.py asks for Llama 3's 128,256)."""
    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>".encode() for b in range(256)]
    types += [TokenType.BYTE] * 256
    fillers = n_vocab - len(tokens)
    tokens += [f"\u2581w{i}".encode() for i in range(fillers)]
    types += [TokenType.NORMAL] * fillers
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i + 1) for i in range(fillers)]
    return tokens, scores, [int(t) for t in types]


def qwen35_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """qwen35's tensors (llama_model_qwen35::load_arch_tensors), NumPy order; qwen35moe's and
    qwen3next's with their experts."""
    d_conv, d_state, n_group, dt_rank, d_inner = m.ssm
    hd, n = m.n_embd_head, m.n_embd
    conv_dim = 2 * d_state * n_group + d_inner
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_VOCAB, n)}
    for i in range(m.n_layer):
        mtp = i >= m.n_layer - m.nextn      # an MTP block: full attention, then nextn.*
        shapes[f"blk.{i}.attn_norm.weight"] = (n,)
        shapes[f"blk.{i}.post_attention_norm.weight"] = (n,)
        if mtp or (i + 1) % (m.interval or 4) == 0:
            shapes[f"blk.{i}.attn_q.weight"] = (2 * m.n_head * hd, n)
            shapes[f"blk.{i}.attn_k.weight"] = (m.n_head_kv * hd, n)
            shapes[f"blk.{i}.attn_v.weight"] = (m.n_head_kv * hd, n)
            shapes[f"blk.{i}.attn_output.weight"] = (n, m.n_head * hd)
            shapes[f"blk.{i}.attn_q_norm.weight"] = (hd,)
            shapes[f"blk.{i}.attn_k_norm.weight"] = (hd,)
        else:
            shapes[f"blk.{i}.attn_qkv.weight"] = (conv_dim, n)
            shapes[f"blk.{i}.attn_gate.weight"] = (d_inner, n)
            shapes[f"blk.{i}.ssm_conv1d.weight"] = (conv_dim, d_conv)
            shapes[f"blk.{i}.ssm_dt.bias"] = (dt_rank,)
            shapes[f"blk.{i}.ssm_a"] = (dt_rank,)
            if m.arch == "qwen3next":       # one projection: [b, a] per key head
                shapes[f"blk.{i}.ssm_ba.weight"] = (2 * dt_rank, n)
            else:
                shapes[f"blk.{i}.ssm_beta.weight"] = (dt_rank, n)
                shapes[f"blk.{i}.ssm_alpha.weight"] = (dt_rank, n)
            shapes[f"blk.{i}.ssm_norm.weight"] = (d_inner // dt_rank,)
            shapes[f"blk.{i}.ssm_out.weight"] = (n, d_inner)
        if m.n_expert:
            qwen35moe_ffn(m, i, shapes)
        else:
            shapes[f"blk.{i}.ffn_gate.weight"] = (m.n_ff, n)
            shapes[f"blk.{i}.ffn_up.weight"] = (m.n_ff, n)
            shapes[f"blk.{i}.ffn_down.weight"] = (n, m.n_ff)
        if mtp:
            shapes[f"blk.{i}.nextn.eh_proj.weight"] = (n, 2 * n)
            shapes[f"blk.{i}.nextn.enorm.weight"] = (n,)
            shapes[f"blk.{i}.nextn.hnorm.weight"] = (n,)
            shapes[f"blk.{i}.nextn.shared_head_norm.weight"] = (n,)
    shapes["output_norm.weight"] = (n,)
    if not m.tied:
        shapes["output.weight"] = (N_VOCAB, n)
    return shapes


def qwen35moe_ffn(m: TinyModel, i: int, shapes: dict) -> None:
    """qwen35moe's FFN (llama_model_qwen35moe::load_arch_tensors' order): the router, the
    routed experts (down, gate, up), the shared expert's gate row, its gate, up and down (of
    expert_shared_feed_forward_length, else feed_forward_length)."""
    n, n_sh = m.n_embd, m.n_ff_shexp or m.n_ff
    shapes[f"blk.{i}.ffn_gate_inp.weight"] = (m.n_expert, n)
    shapes[f"blk.{i}.ffn_down_exps.weight"] = (m.n_expert, n, m.n_ff_exp)
    shapes[f"blk.{i}.ffn_gate_exps.weight"] = (m.n_expert, m.n_ff_exp, n)
    shapes[f"blk.{i}.ffn_up_exps.weight"] = (m.n_expert, m.n_ff_exp, n)
    shapes[f"blk.{i}.ffn_gate_inp_shexp.weight"] = (n,)
    shapes[f"blk.{i}.ffn_gate_shexp.weight"] = (n_sh, n)
    shapes[f"blk.{i}.ffn_up_shexp.weight"] = (n_sh, n)
    shapes[f"blk.{i}.ffn_down_shexp.weight"] = (n, n_sh)


def gemma4_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """gemma4's tensors (llama_model_gemma4::load_arch_tensors order), per-layer widths."""
    meta = dict(m.metadata)
    swa, kv_heads = meta["attention.sliding_window_pattern"], meta["attention.head_count_kv"]
    n_ff = meta.get("feed_forward_length", (m.n_ff,) * m.n_layer)
    ple = meta["embedding_length_per_layer_input"]
    n_kv_layers = m.n_layer - meta.get("attention.shared_kv_layers", 0)
    shapes = {"token_embd.weight": (N_VOCAB, m.n_embd)}
    if ple:
        shapes.update({"per_layer_token_embd.weight": (N_VOCAB, ple * m.n_layer),
                       "per_layer_model_proj.weight": (ple * m.n_layer, m.n_embd),
                       "per_layer_proj_norm.weight": (ple,)})
    shapes["output_norm.weight"] = (m.n_embd,)
    rope_freqs = False
    for i in range(m.n_layer):
        hd = meta["attention.key_length_swa"] if swa[i] else m.head_dim
        has_kv = i < n_kv_layers
        shapes[f"blk.{i}.attn_norm.weight"] = (m.n_embd,)
        shapes[f"blk.{i}.attn_q.weight"] = (m.n_head * hd, m.n_embd)
        if has_kv:
            shapes[f"blk.{i}.attn_k.weight"] = (kv_heads[i] * hd, m.n_embd)
            if swa[i]:                       # full layers: V = K
                shapes[f"blk.{i}.attn_v.weight"] = (kv_heads[i] * hd, m.n_embd)
        shapes[f"blk.{i}.attn_output.weight"] = (m.n_embd, m.n_head * hd)
        shapes[f"blk.{i}.attn_q_norm.weight"] = (hd,)
        if has_kv:
            shapes[f"blk.{i}.attn_k_norm.weight"] = (hd,)
        shapes[f"blk.{i}.post_attention_norm.weight"] = (m.n_embd,)
        shapes[f"blk.{i}.layer_output_scale.weight"] = (1,)
        if not swa[i] and not rope_freqs:
            shapes["rope_freqs.weight"] = (hd // 2,)
            rope_freqs = True
        shapes[f"blk.{i}.ffn_norm.weight"] = (m.n_embd,)
        shapes[f"blk.{i}.ffn_gate.weight"] = (n_ff[i], m.n_embd)
        shapes[f"blk.{i}.ffn_up.weight"] = (n_ff[i], m.n_embd)
        shapes[f"blk.{i}.ffn_down.weight"] = (m.n_embd, n_ff[i])
        shapes[f"blk.{i}.post_ffw_norm.weight"] = (m.n_embd,)
        if m.n_expert and i >= m.dense_lead:
            gemma4_experts(m, i, shapes)
        if ple:
            shapes[f"blk.{i}.inp_gate.weight"] = (ple, m.n_embd)
            shapes[f"blk.{i}.proj.weight"] = (m.n_embd, ple)
            shapes[f"blk.{i}.post_norm.weight"] = (m.n_embd,)
    for i in range(m.dense_lead, m.n_layer) if m.expert_scale else ():
        shapes[f"blk.{i}.ffn_down_exps.scale"] = (m.n_expert,)     # the per-expert scale
    return shapes


def gemma4_experts(m: TinyModel, i: int, shapes: dict) -> None:
    """A gemma4 MoE layer's router (with its input scale), the branch norms and the experts,
    gate and up fused (load_arch_tensors' order)."""
    shapes[f"blk.{i}.ffn_gate_inp.weight"] = (m.n_expert, m.n_embd)
    shapes[f"blk.{i}.ffn_gate_inp.scale"] = (m.n_embd,)
    shapes[f"blk.{i}.pre_ffw_norm_2.weight"] = (m.n_embd,)
    shapes[f"blk.{i}.post_ffw_norm_1.weight"] = (m.n_embd,)
    shapes[f"blk.{i}.post_ffw_norm_2.weight"] = (m.n_embd,)
    shapes[f"blk.{i}.ffn_gate_up_exps.weight"] = (m.n_expert, 2 * m.n_ff_exp, m.n_embd)
    shapes[f"blk.{i}.ffn_down_exps.weight"] = (m.n_expert, m.n_embd, m.n_ff_exp)


def deepseek2_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """deepseek2's tensors (llama_model_deepseek2::load_arch_tensors order), NumPy order."""
    q_lora, kv_lora, nope, v_head = m.mla
    n, h = m.n_embd, m.n_head
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_VOCAB, n)}
    for i in range(m.n_layer):
        shapes[f"blk.{i}.attn_norm.weight"] = (n,)
        if q_lora:
            shapes[f"blk.{i}.attn_q_a_norm.weight"] = (q_lora,)
        shapes[f"blk.{i}.attn_kv_a_norm.weight"] = (kv_lora,)
        if q_lora:
            shapes[f"blk.{i}.attn_q_a.weight"] = (q_lora, n)
            shapes[f"blk.{i}.attn_q_b.weight"] = (h * (nope + m.n_rot), q_lora)
        else:
            shapes[f"blk.{i}.attn_q.weight"] = (h * (nope + m.n_rot), n)
        shapes[f"blk.{i}.attn_kv_a_mqa.weight"] = (kv_lora + m.n_rot, n)
        shapes[f"blk.{i}.attn_k_b.weight"] = (h, kv_lora, nope)
        shapes[f"blk.{i}.attn_v_b.weight"] = (h, v_head, kv_lora)
        shapes[f"blk.{i}.attn_output.weight"] = (n, h * v_head)
        shapes[f"blk.{i}.ffn_norm.weight"] = (n,)
        if i < m.dense_lead:
            shapes[f"blk.{i}.ffn_gate.weight"] = (m.n_ff, n)
            shapes[f"blk.{i}.ffn_down.weight"] = (n, m.n_ff)
            shapes[f"blk.{i}.ffn_up.weight"] = (m.n_ff, n)
            continue
        shapes[f"blk.{i}.ffn_gate_inp.weight"] = (m.n_expert, n)
        if m.probs_b:
            shapes[f"blk.{i}.exp_probs_b.bias"] = (m.n_expert,)
        shapes[f"blk.{i}.ffn_down_exps.weight"] = (m.n_expert, n, m.n_ff_exp)
        shapes[f"blk.{i}.ffn_gate_exps.weight"] = (m.n_expert, m.n_ff_exp, n)
        shapes[f"blk.{i}.ffn_up_exps.weight"] = (m.n_expert, m.n_ff_exp, n)
        n_sh = m.n_ff_exp * m.n_expert_shared
        shapes[f"blk.{i}.ffn_gate_shexp.weight"] = (n_sh, n)
        shapes[f"blk.{i}.ffn_down_shexp.weight"] = (n, n_sh)
        shapes[f"blk.{i}.ffn_up_shexp.weight"] = (n_sh, n)
    shapes["output_norm.weight"] = (n,)
    if not m.tied:
        shapes["output.weight"] = (N_VOCAB, n)
    return shapes


def lfm2_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """lfm2's tensors (llama_model_lfm2::load_arch_tensors order); the conv kernel is 2-D
    (the converter squeezes it) and stays f32 (add_weight)."""
    n, hd = m.n_embd, m.n_embd_head
    shapes = {"token_embd.weight": (N_VOCAB, n), "token_embd_norm.weight": (n,)}
    for i, kv in enumerate(m.kv_layers):
        b = f"blk.{i}."
        shapes[b + "ffn_norm.weight"] = (n,)
        if m.n_expert and i >= m.dense_lead:      # lfm2moe
            e = m.n_expert
            shapes.update({b + "ffn_gate_inp.weight": (e, n),
                           b + "ffn_gate_exps.weight": (e, m.n_ff_exp, n),
                           b + "ffn_down_exps.weight": (e, n, m.n_ff_exp),
                           b + "ffn_up_exps.weight": (e, m.n_ff_exp, n),
                           b + "exp_probs_b.bias": (e,)})
        else:
            shapes.update({b + "ffn_gate.weight": (m.n_ff, n), b + "ffn_down.weight": (n, m.n_ff),
                           b + "ffn_up.weight": (m.n_ff, n)})
        shapes[b + "attn_norm.weight"] = (n,)
        if kv == 0:
            shapes.update({b + "shortconv.conv.weight": (n, m.l_cache),
                           b + "shortconv.in_proj.weight": (3 * n, n),
                           b + "shortconv.out_proj.weight": (n, n)})
        else:
            shapes.update({b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,),
                           b + "attn_q.weight": (n, n), b + "attn_k.weight": (kv * hd, n),
                           b + "attn_v.weight": (kv * hd, n), b + "attn_output.weight": (n, n)})
    if not m.tied:
        shapes["output.weight"] = (N_VOCAB, n)
    return shapes


def tensor_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """NumPy shapes in llama.cpp's load order (ggml's ne reversed)."""
    if m.arch.startswith("nemotron_h"):
        return nemotron_h_shapes(m)
    if m.arch == "granitehybrid":
        return granite_shapes(m)
    if m.arch in WAVE2B_SHAPES:
        return WAVE2B_SHAPES[m.arch](m)
    if m.arch in ("lfm2", "lfm2moe"):
        return lfm2_shapes(m)
    if m.arch in ("deepseek2", "mistral4"):
        return deepseek2_shapes(m)
    if m.arch in ("qwen35", "qwen35moe", "qwen3next"):
        return qwen35_shapes(m)
    if m.arch == "gemma4":
        return gemma4_shapes(m)
    if m.arch == "gpt-oss":
        return gpt_oss_shapes(m)
    head_dim = m.n_embd_head
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_VOCAB, m.n_embd)}
    for i in range(m.n_layer):
        shapes[f"blk.{i}.attn_norm.weight"] = (m.n_embd,)
        if m.fused:
            shapes[f"blk.{i}.attn_qkv.weight"] = ((m.n_head + 2 * m.n_head_kv) * head_dim, m.n_embd)
            shapes[f"blk.{i}.attn_output.weight"] = (m.n_embd, m.n_head * head_dim)
            shapes[f"blk.{i}.ffn_norm.weight"] = (m.n_embd,)
            shapes[f"blk.{i}.ffn_down.weight"] = (m.n_embd, m.n_ff)
            shapes[f"blk.{i}.ffn_up.weight"] = (2 * m.n_ff, m.n_embd)
            continue
        shapes[f"blk.{i}.attn_q.weight"] = (m.n_head * head_dim, m.n_embd)
        shapes[f"blk.{i}.attn_k.weight"] = (m.n_head_kv * head_dim, m.n_embd)
        shapes[f"blk.{i}.attn_v.weight"] = (m.n_head_kv * head_dim, m.n_embd)
        if m.qkv_bias:
            shapes[f"blk.{i}.attn_q.bias"] = (m.n_head * head_dim,)
            shapes[f"blk.{i}.attn_k.bias"] = (m.n_head_kv * head_dim,)
            shapes[f"blk.{i}.attn_v.bias"] = (m.n_head_kv * head_dim,)
        if m.qk_norm:
            shapes[f"blk.{i}.attn_q_norm.weight"] = (head_dim,)
            shapes[f"blk.{i}.attn_k_norm.weight"] = (head_dim,)
        shapes[f"blk.{i}.attn_output.weight"] = (m.n_embd, m.n_head * head_dim)
        if m.post_norms:
            shapes[f"blk.{i}.post_attention_norm.weight"] = (m.n_embd,)
        if m.arch == "glm4moe":
            glm_ffn(m, i, shapes)
            continue
        shapes[f"blk.{i}.ffn_norm.weight"] = (m.n_embd,)
        if m.n_expert:
            shapes[f"blk.{i}.ffn_gate_inp.weight"] = (m.n_expert, m.n_embd)
            shapes[f"blk.{i}.ffn_gate_exps.weight"] = (m.n_expert, m.n_ff_exp, m.n_embd)
            shapes[f"blk.{i}.ffn_down_exps.weight"] = (m.n_expert, m.n_embd, m.n_ff_exp)
            shapes[f"blk.{i}.ffn_up_exps.weight"] = (m.n_expert, m.n_ff_exp, m.n_embd)
            continue
        shapes[f"blk.{i}.ffn_gate.weight"] = (m.n_ff, m.n_embd)
        shapes[f"blk.{i}.ffn_up.weight"] = (m.n_ff, m.n_embd)
        shapes[f"blk.{i}.ffn_down.weight"] = (m.n_embd, m.n_ff)
        if m.post_norms:
            shapes[f"blk.{i}.post_ffw_norm.weight"] = (m.n_embd,)
    if m.longrope:
        shapes["rope_factors_long.weight"] = (head_dim // 2,)
        shapes["rope_factors_short.weight"] = (head_dim // 2,)
    shapes["output_norm.weight"] = (m.n_embd,)
    if not m.tied:
        shapes["output.weight"] = (N_VOCAB, m.n_embd)
    return shapes


def gpt_oss_shapes(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """llama.cpp's openai-moe load order: per layer the two norms, Q/K/V with their biases,
    the output, the sinks, router and experts, then the output's, router's and experts'
    biases."""
    hd, e = m.n_embd_head, m.n_expert
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (N_VOCAB, m.n_embd),
                                          "output_norm.weight": (m.n_embd,),
                                          "output.weight": (N_VOCAB, m.n_embd)}
    for i in range(m.n_layer):
        b = f"blk.{i}."
        shapes.update({
            b + "attn_norm.weight": (m.n_embd,), b + "post_attention_norm.weight": (m.n_embd,),
            b + "attn_q.weight": (m.n_head * hd, m.n_embd),
            b + "attn_k.weight": (m.n_head_kv * hd, m.n_embd),
            b + "attn_v.weight": (m.n_head_kv * hd, m.n_embd),
            b + "attn_q.bias": (m.n_head * hd,), b + "attn_k.bias": (m.n_head_kv * hd,),
            b + "attn_v.bias": (m.n_head_kv * hd,),
            b + "attn_output.weight": (m.n_embd, m.n_head * hd),
            b + "attn_sinks.weight": (m.n_head,),
            b + "ffn_gate_inp.weight": (e, m.n_embd),
            b + "ffn_gate_exps.weight": (e, m.n_ff_exp, m.n_embd),
            b + "ffn_down_exps.weight": (e, m.n_embd, m.n_ff_exp),
            b + "ffn_up_exps.weight": (e, m.n_ff_exp, m.n_embd),
            b + "attn_output.bias": (m.n_embd,), b + "ffn_gate_inp.bias": (e,),
            b + "ffn_gate_exps.bias": (e, m.n_ff_exp), b + "ffn_down_exps.bias": (e, m.n_embd),
            b + "ffn_up_exps.bias": (e, m.n_ff_exp)})
    return shapes


def glm_ffn(m: TinyModel, i: int, shapes: dict) -> None:
    """glm4moe after attn_output (its load order): the post-attention norm, a dense FFN in the
    leading layers, else the router, its selection bias, the experts and the shared expert; the
    NextN layers (past block_count - nextn) add their own projection and norms."""
    shapes[f"blk.{i}.post_attention_norm.weight"] = (m.n_embd,)
    if i < m.dense_lead:
        shapes[f"blk.{i}.ffn_gate.weight"] = (m.n_ff, m.n_embd)
        shapes[f"blk.{i}.ffn_down.weight"] = (m.n_embd, m.n_ff)
        shapes[f"blk.{i}.ffn_up.weight"] = (m.n_ff, m.n_embd)
    else:
        shapes[f"blk.{i}.ffn_gate_inp.weight"] = (m.n_expert, m.n_embd)
        shapes[f"blk.{i}.exp_probs_b.bias"] = (m.n_expert,)
        shapes[f"blk.{i}.ffn_gate_exps.weight"] = (m.n_expert, m.n_ff_exp, m.n_embd)
        shapes[f"blk.{i}.ffn_down_exps.weight"] = (m.n_expert, m.n_embd, m.n_ff_exp)
        shapes[f"blk.{i}.ffn_up_exps.weight"] = (m.n_expert, m.n_ff_exp, m.n_embd)
        n_sh = m.n_ff_exp * m.n_expert_shared
        shapes[f"blk.{i}.ffn_gate_shexp.weight"] = (n_sh, m.n_embd)
        shapes[f"blk.{i}.ffn_down_shexp.weight"] = (m.n_embd, n_sh)
        shapes[f"blk.{i}.ffn_up_shexp.weight"] = (n_sh, m.n_embd)
    if i >= m.n_layer - m.nextn:
        shapes[f"blk.{i}.nextn.eh_proj.weight"] = (m.n_embd, 2 * m.n_embd)
        shapes[f"blk.{i}.nextn.enorm.weight"] = (m.n_embd,)
        shapes[f"blk.{i}.nextn.hnorm.weight"] = (m.n_embd,)
        shapes[f"blk.{i}.nextn.shared_head_norm.weight"] = (m.n_embd,)


def random_weight(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Norm gains near 1, biases near 0 and matrices scaled by 1/sqrt(fan-in), so activations
    stay O(1) through the layers and the logits are spread enough to compare meaningfully."""
    if name.endswith(".bias"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith(".ffn_gate_inp_shexp.weight"):   # a gate row: a dot product, not a gain
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    if name.endswith(".ssm_a"):                      # -exp(A_log): negative decay rates
        return (-np.exp(0.5 * rng.standard_normal(shape))).astype(np.float32)
    if name.startswith("rope_factors_long"):        # LongRoPE divisors: 1 up to 8
        return np.geomspace(1.0, 8.0, shape[0]).astype(np.float32)
    if name.startswith("rope_factors_short"):
        return np.linspace(1.0, 1.5, shape[0]).astype(np.float32)
    if name.startswith("rope_freqs"):                # proportional rope: the last half not turned
        return np.concatenate([np.ones(shape[0] // 2), np.full(shape[0] - shape[0] // 2, 1e30)]
                              ).astype(np.float32)
    if name.endswith("layer_output_scale.weight"):
        return np.asarray([0.7], np.float32)
    if len(shape) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def add_weight(writer: GGUFWriter, name: str, data: np.ndarray, weight_type: str) -> None:
    """Stores 1-D tensors and an expert router (ffn_gate_inp) as f32 always, as llama.cpp's
    converters do (and its quantizer never quantizes the router)."""
    if (data.ndim == 1 or weight_type == "f32" or ".ffn_gate_inp." in name
            or ".ssm_conv1d." in name or ".shortconv.conv." in name   # ggml's f32-only conv
            or name.endswith((".ssm_a", ".ssm_d", ".ssm_norm.weight"))   # Mamba-2's [H, 1]
            or name.endswith(".bias")):                 # gpt-oss's 2-D expert biases
        writer.add_tensor(name, data)
    elif weight_type == "f16":
        writer.add_tensor(name, data.astype(np.float16))
    elif data.shape[-1] % 32:            # llama.cpp's quantizer keeps such rows in f16
        writer.add_tensor(name, data.astype(np.float16))
    else:
        qtype = GGMLQuantizationType[weight_type.upper()]
        writer.add_tensor(name, quants.quantize(data, qtype), raw_dtype=qtype)


def write_model(m: TinyModel, out_dir: Path) -> Path:
    """Writes to a temporary name first so a reader never sees half a file."""
    path = out_dir / f"{m.name}.gguf"
    tmp = path.with_suffix(".gguf.tmp")
    writer = GGUFWriter(str(tmp), m.arch)
    writer.add_name(m.title or m.name)
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(m.n_embd)
    writer.add_block_count(m.n_layer)
    arrays = {key for key, value in m.metadata if isinstance(value, tuple)}
    if "feed_forward_length" not in arrays and m.n_ff:    # qwen35moe's real files lack it
        writer.add_feed_forward_length(m.n_ff)
    writer.add_head_count(m.n_head)
    if m.kv_layers:                 # lfm2: one per layer, 0 for a short-conv layer
        writer.add_head_count_kv(list(m.kv_layers))
        if m.l_cache:
            writer.add_shortconv_l_cache(m.l_cache)
    elif "attention.head_count_kv" not in arrays:
        writer.add_head_count_kv(m.n_head_kv)
    if m.head_dim:
        writer.add_key_length(m.head_dim)
        writer.add_value_length(m.head_dim)
    if m.mla:              # the MLA cache row: kv_lora_rank + the rotated part; V within it
        q_lora, kv_lora, nope, v_head = m.mla
        writer.add_key_length(kv_lora + m.n_rot)
        writer.add_value_length(kv_lora)
        writer.add_key_length_mla(nope + m.n_rot)
        writer.add_value_length_mla(v_head)
        writer.add_q_lora_rank(q_lora)
        writer.add_kv_lora_rank(kv_lora)
    writer.add_rope_dimension_count(m.n_rot or m.n_embd_head)
    if m.ssm:
        d_conv, d_state, n_group, dt_rank, d_inner = m.ssm
        if m.arch.startswith("qwen35"):
            writer.add_rope_dimension_sections([3, 3, 2, 0])
        writer.add_ssm_conv_kernel(d_conv)
        writer.add_ssm_state_size(d_state)
        writer.add_ssm_group_count(n_group)
        writer.add_ssm_time_step_rank(dt_rank)
        writer.add_ssm_inner_size(d_inner)
        if m.interval:
            writer.add_full_attention_interval(m.interval)
    elif m.sections:
        writer.add_rope_dimension_sections(list(m.sections))
    if "rope.freq_base" not in dict(m.metadata):
        writer.add_rope_freq_base(ROPE_FREQ_BASE)
    if m.rms_eps:
        writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(N_VOCAB)
    writer.add_file_type(FILE_TYPES[m.expert_type or m.weight_type])
    if m.n_expert:
        writer.add_expert_count(m.n_expert)
        writer.add_expert_used_count(m.n_expert_used)
        writer.add_expert_feed_forward_length(m.n_ff_exp)
    if m.n_ff_shexp:
        writer.add_expert_shared_feed_forward_length(m.n_ff_shexp)
    if m.arch in ("deepseek2", "mistral4"):
        writer.add_expert_shared_count(m.n_expert_shared)
        writer.add_leading_dense_block_count(m.dense_lead)
    if m.arch == "glm4moe":
        writer.add_expert_shared_count(m.n_expert_shared)
        writer.add_leading_dense_block_count(m.dense_lead)
    if m.arch == "lfm2moe":
        writer.add_leading_dense_block_count(m.dense_lead)
    if m.nextn:
        writer.add_nextn_predict_layers(m.nextn)
    for key, value in m.metadata:
        key = f"{m.arch}.{key}"
        if isinstance(value, tuple) and isinstance(value[0], bool):
            writer.add_array(key, list(value))       # BOOL per layer
        elif isinstance(value, tuple):
            writer.add_key_value(key, list(value), GGUFValueType.ARRAY,
                                 sub_type=GGUFValueType.UINT32)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    tokens, scores, types = vocabulary()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    rng = np.random.default_rng(m.seed)
    for name, shape in tensor_shapes(m).items():
        data = random_weight(rng, name, shape)
        if m.arch == "gemma4" and name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
            data *= 0.3    # gemma4 attends unscaled (KQ scale 1): keep its logits moderate
        experts = m.expert_type and name.endswith("_exps.weight")
        add_weight(writer, name, data, m.expert_type if experts else m.weight_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("examples/models"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for m in MODELS:
        path = write_model(m, args.out)
        print(f"{path}  {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
