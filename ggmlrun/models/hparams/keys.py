"""The hyperparameter keys llama.cpp reads, each with its GGUF type and the range ggmlrun
accepts: one table (`RULES`, keyed by the GGUF key without the architecture prefix) that the
checks in hparam_rules apply alike to a GGUF file's metadata and to a card. A new key an
architecture reads is one line here.

As llama.cpp reads them (src/llama-model.cpp load_hparams, src/llama-model-loader.cpp
get_key / get_key_or_arr / get_arr):

- an integer key is a GGUF UINT32 (get_key checks the stored type exactly: an INT32, a
  FLOAT32 or a STRING `embedding_length` is "wrong type"); a float key is a FLOAT32, a string
  key a STRING;
- `feed_forward_length`, `attention.head_count` and `attention.head_count_kv` may instead be
  arrays of one UINT32/INT32/BOOL per layer (get_key_or_arr; length = block_count);
- `block_count` is 1..LLAMA_MAX_LAYERS (512), a GGML_ASSERT in load_hparams; the scaling type
  is one of llama.cpp's names (an assert too).

ggmlrun adds the ranges a kernel needs so that nothing unchecked reaches one: floats finite
and positive (a freq_base of 0 or NaN makes rope's angles NaN, and so the logits), eps small,
dimensions at most MAX_DIM (2**24, past every real model: with at most 512 layers every
tensor's and the whole model's byte count is then a 64-bit number, and a small card cannot ask
for millions of layers' bookkeeping); and, where a value is inverted or squared on the way to
the logits (rope's base and scaling factor, the softcap, the attention factor), a range whose
results stay finite in float32 (the fuzzer's denormal 1e-45 and 1e30 gave NaN logits with
exit 0).
"""

from __future__ import annotations

from dataclasses import dataclass

LLAMA_MAX_LAYERS = 512            # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024          # src/llama-hparams.h
MAX_DIM = 2**24                   # embedding, feed-forward, vocabulary, heads, head sizes
U32_MAX = 2**32 - 1               # llama.cpp's uint32_t fields (context length, -c, -ub)
F32_MAX = 3.4028234663852886e38
MAX_EPS = 1.0                     # an rms_norm eps past this is no longer "small"
# a factor whose inverse a kernel takes (rope's 1/scaling factor, the softcap's 1/cap): at
# least this, so the inverse and rope's angles at any uint32 position stay finite in float32
# (1e-45 made freq_scale infinite and the logits NaN)
MIN_INVERTED = 2.0**-20          # about 9.5e-7, exact in float32
# rope's attention factor multiplies cos and sin, so Q.K by its square: 1e30 overflowed
# float32 (NaN logits); YaRN's own, 0.1 ln(s) + 1, is under 10 for any float32 scale s
MAX_ATTN_FACTOR = 100.0
# deepseek2's YaRN log multiplier m scales Q.K by (1 + m ln s)^2 (3.4e38 and 1e30 gave NaN
# logits); real files have m under 1
MAX_YARN_LOG_MUL = 100.0
# the routed experts' weights are multiplied by this before their outputs are summed: 3.4e38
# overflowed float32 (NaN logits); real files use 1 to 3
MAX_EXPERT_WEIGHTS_SCALE = 1000.0
_BASE_WHY = ("a base under 1 makes rope's angles grow along the head, past float32 for a "
             "small one")
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")    # LLAMA_ROPE_SCALING_TYPES


@dataclass(frozen=True)
class Rule:
    kind: str                     # "u32", "f32", "str" or "bool": the GGUF type llama.cpp reads
    lo: float = 1                 # inclusive lower bound (u32), or exclusive when lo_open
    hi: float = MAX_DIM           # inclusive upper bound
    lo_open: bool = False         # floats: value > lo rather than >= lo
    per_layer: bool = False       # get_key_or_arr: a value, or one per layer
    keep_array: bool = False      # get_arr: an array kept as one flag per layer (a pattern)
    choices: tuple = ()           # strings: the accepted values
    why: str = ""                 # what the range is for, in a message
    or_zero: bool = False         # floats: 0 ("none") is accepted besides the range
    # per-layer arrays read by an architecture that takes them per layer: 0 is accepted for a
    # layer that has none of it (lfm2's head_count_kv: 0 for a short-conv layer)
    zero_layers: bool = False

    def range_text(self) -> str:
        if self.or_zero:
            return f"0 or a finite number >= {self.lo:g} and <= {self.hi:g}"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind == "bool":
            return "true or false"
        if self.kind == "u32":
            return f"an integer from {self.lo} to {self.hi}"
        low = f"> {self.lo:g}" if self.lo_open else f">= {self.lo:g}"
        return f"a finite number {low} and <= {self.hi:g}"


RULES: dict[str, Rule] = {
    "block_count": Rule("u32", 1, LLAMA_MAX_LAYERS, why="llama.cpp's LLAMA_MAX_LAYERS"),
    "context_length": Rule("u32", 1, U32_MAX),
    "embedding_length": Rule("u32"),
    "feed_forward_length": Rule("u32", per_layer=True, zero_layers=True),
    "attention.head_count": Rule("u32", per_layer=True),
    "attention.head_count_kv": Rule("u32", per_layer=True, zero_layers=True),
    "attention.key_length": Rule("u32"),
    "attention.value_length": Rule("u32"),
    "rope.dimension_count": Rule("u32"),
    "vocab_size": Rule("u32"),
    "rope.freq_base": Rule("f32", 1.0, F32_MAX, why=_BASE_WHY),
    "attention.layer_norm_rms_epsilon": Rule("f32", 0.0, MAX_EPS, lo_open=True),
    # nemotron_h(_moe): required by llama.cpp (its MTP head's final norm)
    "attention.layer_norm_epsilon": Rule("f32", 0.0, MAX_EPS, lo_open=True),
    # granitehybrid's multipliers (0 or absent: none) and attention scale (0: 1/sqrt(head))
    "logit_scale": Rule("f32", 0.0, F32_MAX),
    "residual_scale": Rule("f32", 0.0, F32_MAX),
    "embedding_scale": Rule("f32", 0.0, F32_MAX),
    "attention.scale": Rule("f32", 0.0, F32_MAX),
    "rope.scaling.factor": Rule("f32", MIN_INVERTED, F32_MAX, or_zero=True,
                                why="0: no scaling; rope takes its inverse"),
    "rope.scaling.type": Rule("str", choices=ROPE_SCALING_TYPES),
    # read by llama.cpp though not used by ggmlrun's llama graph: a file llama.cpp refuses
    # (a wrong type, an expert count past LLAMA_MAX_EXPERTS) is refused here too
    "rope.scaling.finetuned": Rule("bool"),
    "rope.scaling.original_context_length": Rule("u32", 1, U32_MAX),
    "expert_count": Rule("u32", 0, LLAMA_MAX_EXPERTS, why="llama.cpp's LLAMA_MAX_EXPERTS"),
    # mixtures of experts (qwen3moe ...): experts used per token, an expert's FFN width
    "expert_used_count": Rule("u32", 0, LLAMA_MAX_EXPERTS, per_layer=True,
                              why="llama.cpp's LLAMA_MAX_EXPERTS"),
    "expert_feed_forward_length": Rule("u32", 0, per_layer=True),
    # qwen35moe: the shared expert's FFN width (0 or absent: feed_forward_length)
    "expert_shared_feed_forward_length": Rule("u32", 0),
    # glm4moe: shared experts, leading dense layers, routing weights, gating, NextN layers
    "expert_shared_count": Rule("u32", 0, LLAMA_MAX_EXPERTS),
    "leading_dense_block_count": Rule("u32", 0, LLAMA_MAX_LAYERS),
    "expert_weights_scale": Rule("f32", 0.0, MAX_EXPERT_WEIGHTS_SCALE,
                                 why="it multiplies every routed expert's output"),
    "expert_weights_norm": Rule("bool"),
    # nemotron_h_moe: the experts' latent width (0: n_embd); expert groups (1 or absent: none)
    "moe_latent_size": Rule("u32", 0),
    "expert_group_count": Rule("u32", 0, LLAMA_MAX_EXPERTS),
    "expert_gating_func": Rule("u32", 0, 3, why="none, softmax, sigmoid, softmax_weight"),
    # rope scaling as llama_context derives it (every architecture), and keys some
    # architectures' load_arch_hparams read (mistral3: YaRN's betas and log multiplier,
    # Llama 4's attention temperature)
    "rope.scale_linear": Rule("f32", MIN_INVERTED, F32_MAX, or_zero=True,
                              why="the older key of rope.scaling.factor"),
    "rope.scaling.attn_factor": Rule("f32", 0.0, MAX_ATTN_FACTOR, lo_open=True,
                                     why="it scales Q.K by its square"),
    "rope.scaling.yarn_beta_fast": Rule("f32", 0.0, F32_MAX),
    "rope.scaling.yarn_beta_slow": Rule("f32", 0.0, F32_MAX),
    "rope.scaling.yarn_log_multiplier": Rule("f32", 0.0, MAX_YARN_LOG_MUL,
                                             why="Q.K is scaled by (1 + it·ln factor)²"),
    "attention.temperature_scale": Rule("f32", 0.0, F32_MAX, why="0: no temperature"),
    # sliding-window attention (gemma3): the window, which layers use it (a period n: layer il
    # slides unless il % n == n - 1; or one BOOL per layer), its own rope base; and the final
    # logits' softcap
    "attention.sliding_window": Rule("u32", 0, U32_MAX, why="0: no sliding window"),
    "attention.sliding_window_pattern": Rule("u32", 0, U32_MAX, per_layer=True, keep_array=True),
    "rope.freq_base_swa": Rule("f32", 1.0, F32_MAX, why=_BASE_WHY),
    "final_logit_softcapping": Rule("f32", MIN_INVERTED, F32_MAX, or_zero=True,
                                    why="0: none; the logits are divided by it"),
    # gemma4: the sliding layers' own head sizes and rotary dimensions, the layers that read
    # an earlier layer's cache, the per-layer embeddings' width
    "attention.key_length_swa": Rule("u32"),
    "attention.value_length_swa": Rule("u32"),
    "rope.dimension_count_swa": Rule("u32"),
    "attention.shared_kv_layers": Rule("u32", 0, LLAMA_MAX_LAYERS),
    "embedding_length_per_layer_input": Rule("u32", 0, MAX_DIM, why="0: none"),
    # recurrent (gated delta-net) layers of the hybrid qwen35 / qwen35moe
    "ssm.conv_kernel": Rule("u32", 2, 64),
    "ssm.inner_size": Rule("u32"),
    "ssm.state_size": Rule("u32"),
    "ssm.time_step_rank": Rule("u32"),
    "ssm.group_count": Rule("u32"),
    "full_attention_interval": Rule("u32", 1, LLAMA_MAX_LAYERS),
    # lfm2's short-conv layers: the kernel length (the state keeps l_cache - 1 columns)
    "shortconv.l_cache": Rule("u32", 2, 64, why="the state keeps l_cache - 1 columns"),
    "rope.dimension_sections": Rule("u32arr", 0, MAX_DIM, why="up to 4 section sizes"),
    "attention.recurrent_layers": Rule("boolarr", why="one per layer: recurrent or not"),
    # qwen3vl(moe): the vision encoder's deepstack features, added after the first layers
    "n_deepstack_layers": Rule("u32", 0, LLAMA_MAX_LAYERS, why="0: none"),
    "nextn_predict_layers": Rule("u32", 0, LLAMA_MAX_LAYERS, why="MTP / NextN blocks"),
    # llama4: every n-th layer a mixture of experts (0: none)
    "interleave_moe_layer_step": Rule("u32", 0, LLAMA_MAX_LAYERS, why="0: no MoE layer"),
    # deepseek2's multi-head latent attention: the low-rank Q (0: none, the lite variant) and
    # KV compressions, and the per-head sizes Q/K and V decompress to
    "attention.q_lora_rank": Rule("u32", 0, MAX_DIM, why="0: no Q compression"),
    "attention.kv_lora_rank": Rule("u32"),
    "attention.key_length_mla": Rule("u32"),
    "attention.value_length_mla": Rule("u32"),
}
VOCAB_LIST = "tokenizer.ggml.tokens"     # its length is the vocabulary when vocab_size is absent
