"""A model's hyperparameters, read from GGUF metadata as llama.cpp's loader reads them.

Keys are `{arch}.{name}` (llama.cpp's LLM_KV names). Defaults are llama.cpp's where a key is
optional; a missing required key is an input error naming it. `HParams` is one flat record, as
llama-hparams.h is: what llama_model_base::load_hparams reads for every architecture, and every
architecture's own fields beside them with the values that mean "this model has none" (no
experts, no recurrent layers, no per-layer arrays). Each architecture's `read_hparams`
(models/arch/<arch>.py, its load_arch_hparams) fills the fields it reads; the stages below ask
the record the per-layer questions llama_hparams answers (is_swa, is_recurrent, has_kv, the
per-layer head counts and widths), never which architecture it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ggmlrun.core.util.errors import InputError


ROPE_SCALING = ("none", "linear", "yarn", "longrope")     # llama.cpp's LLAMA_ROPE_SCALING_TYPES


@dataclass(frozen=True)
class HParams:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    n_rot: int
    arch: str = "llama"             # general.architecture: named in messages
    ff_optional: bool = False       # feed_forward_length may be 0 (experts' widths have keys)
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    norm_rms_eps: float = 1e-5
    n_embd_head_k: int = 0          # 0: n_embd / n_head
    n_embd_head_v: int = 0
    # rope scaling, as llama_model_base::load_hparams reads it for every architecture
    rope_scaling: str = "linear"    # rope.scaling.type: none | linear | yarn | longrope
    n_ctx_orig_yarn: int = 0        # rope.scaling.original_context_length; 0: n_ctx_train
    rope_attn_factor: float = 1.0   # rope.scaling.attn_factor
    yarn_beta_fast: float = 32.0    # read by the architectures that read it (mistral3)
    yarn_beta_slow: float = 1.0
    rope_yarn_log_mul: float = 0.0
    yarn_mscale_all_dims: bool = False   # deepseek2's YaRN mscale (hparams/rope.py)
    rope_sections: tuple = ()       # M-RoPE / IMROPE sections (the qwen35 family, qwen3vl)
    # qwen3vl(moe): layers 0..n-1 each add one more n_embd slice of the input embeddings (the
    # vision encoder's deepstack features), so an embeddings input is n_embd_inp wide
    n_deepstack_layers: int = 0
    # NextN (multi-token prediction) layers at the end of block_count (glm4moe): counted by
    # -ngl and in the layer split, never loaded nor run; n_layer is the trunk (llama.cpp's
    # n_layer(), n_layer_all being block_count)
    n_layer_nextn: int = 0
    # sliding-window attention (llama_hparams n_swa, is_swa): read by the architectures that
    # have it (gemma3); a model with any SWA layer gets llama_kv_cache_iswa's two caches
    n_swa: int = 0
    swa_layers: tuple = ()          # per layer: True for a sliding-window layer
    # llama_swa_type: "standard" (a window of n_swa positions back) or "chunked" (llama4: the
    # positions of the token's own chunk of n_swa, is_masked_swa's LLAMA_SWA_TYPE_CHUNKED)
    swa_type: str = "standard"
    rope_freq_base_swa: float = 10000.0    # rope_freq_base_train_swa (SWA layers' rope)
    rope_freq_scale_swa: float = 1.0
    n_embd_head_k_swa: int = 0      # the sliding layers' head size (0: n_embd_head_k)
    n_rot_swa: int = 0              # their rotated dimensions (0: n_rot)
    # per-layer arrays (n_head_arr, n_head_kv_arr, n_ff_arr: empty when every layer has the
    # scalar's value)
    n_head_arr: tuple = ()
    n_head_kv_arr: tuple = ()
    n_ff_arr: tuple = ()
    n_layer_kv_from_start: int = 0  # layers from this one on read another's cache (0: none)
    rope_freqs_layers: tuple | None = None   # the layers that read rope_freqs (None: all)
    n_embd_per_layer: int = 0       # per-layer embeddings' width (gemma4)
    f_final_logit_softcapping: float = 0.0
    f_attention_scale: float = 0.0
    # granite's multipliers (0: none): logits divided by f_logit_scale, each block's output
    # (attention/SSM and FFN) times f_residual_scale, the token embeddings times
    # f_embedding_scale (llama.cpp's build_inp_embd)
    f_logit_scale: float = 0.0
    f_residual_scale: float = 0.0
    f_embedding_scale: float = 0.0
    rope_finetuned: bool = True     # granitehybrid: rope.scaling.finetuned false = no rope
    attn_temp_scale: float = 0.0          # attention.temperature_scale (mistral3)
    n_attn_temp_floor_scale: int = 0      # n_ctx_orig_yarn when the scale is set
    attn_temp_offset: float = 0.0         # added to the position first (llama4: 1)
    # llama4: every n-th layer a mixture of experts (interleave_moe_layer_step), every n-th
    # without rope (NoPE, n_no_rope_layer_step), RMS norms over Q/K heads on the roped layers
    n_moe_layer_step: int = 0
    n_no_rope_layer_step: int = 4
    use_kq_norm: bool = False
    # mixture of experts (0 experts: a dense model)
    n_expert: int = 0               # expert_count
    n_expert_used: int = 0          # expert_used_count
    n_ff_exp: int = 0               # expert_feed_forward_length
    n_ff_shexp: int = 0             # expert_shared_feed_forward_length
    n_moe_latent: int = 0           # moe_latent_size: the experts' width (0: n_embd)
    n_expert_shared: int = 0        # expert_shared_count
    n_layer_dense_lead: int = 0     # leading_dense_block_count
    expert_weights_scale: float = 0.0
    expert_weights_norm: bool = False
    gating: str = "softmax"         # expert_gating_func: softmax | sigmoid
    # multi-head latent attention (deepseek2; kv_lora_rank 0: not MLA)
    n_lora_q: int = 0               # attention.q_lora_rank; 0: attn_q (the lite variant)
    n_lora_kv: int = 0              # attention.kv_lora_rank
    n_embd_head_k_mla: int = 0      # attention.key_length_mla: nope + rope per head
    n_embd_head_v_mla: int = 0      # attention.value_length_mla
    # recurrent layers (the gated delta-net of the qwen35 family; ssm_d_inner 0: none)
    ssm_d_conv: int = 4             # ssm.conv_kernel
    ssm_d_inner: int = 0            # ssm.inner_size
    ssm_d_state: int = 0            # ssm.state_size (the head size of K and V)
    ssm_dt_rank: int = 0            # ssm.time_step_rank (value heads)
    ssm_n_group: int = 0            # ssm.group_count (key heads)
    full_attention_interval: int = 4
    recurrent_layers: tuple = ()    # attention.recurrent_layers, when the file has it
    # lfm2's short-conv layers (0: none): the conv kernel's length, shortconv.l_cache
    n_shortconv_l_cache: int = 0
    # the output norm's GGUF name (lfm2's is "token_embd_norm", llama.cpp's
    # LLM_TENSOR_OUTPUT_NORM_LFM2: of the output layer, wherever its name)
    output_norm: str = "output_norm.weight"

    def __post_init__(self):
        for key in ("n_layer", "n_embd", "n_ff", "n_vocab", "n_ctx_train", "n_rot"):
            if key == "n_ff" and self.n_ff == 0 and self.ff_optional:
                continue
            if getattr(self, key) <= 0:
                raise InputError(f"hyperparameter {key} must be positive, got {getattr(self, key)}")
        if self.n_head <= 0 or self.n_head_kv <= 0 or self.n_head % self.n_head_kv:
            raise InputError(f"attention heads {self.n_head} must be a positive multiple of "
                             f"the KV heads {self.n_head_kv}")
        if not self.n_embd_head_k:
            object.__setattr__(self, "n_embd_head_k", self.n_embd // self.n_head)
        if not self.n_embd_head_v:
            object.__setattr__(self, "n_embd_head_v", self.n_embd // self.n_head)
        if self.rope_scaling not in ROPE_SCALING:
            raise InputError(f"rope.scaling.type '{self.rope_scaling}' is not one llama.cpp "
                             f"knows ({', '.join(ROPE_SCALING)})")
        if not self.n_ctx_orig_yarn:
            object.__setattr__(self, "n_ctx_orig_yarn", self.n_ctx_train)

    # --- llama_hparams' per-layer questions (models/memory/caches.py sizes the caches by them)
    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    @property
    def has_swa(self) -> bool:
        return any(self.swa_layers)

    def is_recurrent(self, il: int) -> bool:
        """attention.recurrent_layers where given (newer converters write it from the model's
        layer_types), else in a hybrid model every full_attention_interval-th layer is
        attention; an MTP block never (llama.cpp flags them attention)."""
        if self.recurrent_layers:
            return self.recurrent_layers[il]
        return (self.ssm_d_inner > 0 and il < self.n_layer
                and (il + 1) % self.full_attention_interval != 0)

    def has_kv(self, il: int) -> bool:
        """Whether layer il stores K and V: every layer but those reading another's cache and
        those without KV heads (nemotron_h's MLP layers: the hybrid's attention filter)."""
        if self.n_head_kv_arr and not self.n_head_kv_arr[il]:
            return False
        return not self.n_layer_kv_from_start or il < self.n_layer_kv_from_start

    def kv_source(self, il: int) -> int:
        """The layer whose cache layer il reads (itself, or for a KV-shared layer the last
        sliding / full layer with a cache: llama.cpp's reuse callback)."""
        if self.has_kv(il):
            return il
        return self.n_layer_kv_from_start - (2 if self.is_swa(il) else 1)

    def head(self, il: int) -> int:
        """n_embd_head_k of layer il (the sliding layers' own where the model has one)."""
        return self.n_embd_head_k_swa if self.n_embd_head_k_swa and self.is_swa(il) \
            else self.n_embd_head_k

    def head_v(self, il: int) -> int:
        return self.n_embd_head_k_swa if self.n_embd_head_k_swa and self.is_swa(il) \
            else self.n_embd_head_v

    def rot(self, il: int) -> int:
        return self.n_rot_swa if self.n_rot_swa and self.is_swa(il) else self.n_rot

    def heads(self, il: int) -> int:
        return self.n_head_arr[il] if self.n_head_arr else self.n_head

    def heads_kv(self, il: int) -> int:
        return self.n_head_kv_arr[il] if self.n_head_kv_arr else self.n_head_kv

    def ff(self, il: int) -> int:
        return self.n_ff_arr[il] if self.n_ff_arr else self.n_ff

    def n_embd_k_gqa_l(self, il: int) -> int:
        return self.head(il) * self.heads_kv(il)

    def n_embd_v_gqa_l(self, il: int) -> int:
        return self.head_v(il) * self.heads_kv(il)

    @property
    def is_mla(self) -> bool:
        """llama_hparams::is_mla: one K-only cache row per token (V is a view of it)."""
        return self.n_lora_kv > 0

    @property
    def n_embd_head_qk_nope(self) -> int:
        return self.n_embd_head_k_mla - self.n_rot

    @property
    def n_embd_r(self) -> int:
        """The conv state per sequence (llama_hparams::n_embd_r): a short conv's n_embd
        (l_cache - 1), else (d_conv - 1) * (d_inner + 2 n_group d_state)."""
        if self.n_shortconv_l_cache:
            return self.n_embd * (self.n_shortconv_l_cache - 1)
        return (self.ssm_d_conv - 1) * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    @property
    def n_embd_s(self) -> int:
        """The delta state per sequence: d_state * d_inner."""
        return self.ssm_d_state * self.ssm_d_inner

    @property
    def n_embd_inp(self) -> int:
        """llama_hparams::n_embd_inp: the input embeddings' width (the token rows and, for a
        deepstack model, one more n_embd per deepstack layer)."""
        return self.n_embd * (1 + self.n_deepstack_layers)

    @property
    def n_layer_all(self) -> int:
        return self.n_layer + self.n_layer_nextn

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @cached_property
    def n_embd_v_gqa(self) -> int:
        """The V cache's rows: the widest layer's (n_embd_v_gqa_max; [TAG_V_CACHE_VARIABLE])."""
        if not (self.n_head_kv_arr or self.n_embd_head_k_swa):
            return self.n_embd_head_v * self.n_head_kv
        return max(self.n_embd_v_gqa_l(il) for il in range(self.n_layer))



def read_hparams(fields: dict, spec, types: dict | None = None) -> HParams:
    """`fields`: GGUF key -> plain value (ints, floats, strings, lists); `spec`: the
    architecture's registry entry (models/arch/: its own keys and reader), handed down by the
    caller; `types`: GGUF key -> its stored GGUF type where known (`gguf_types`). Every value is checked by hparam_rules
    against hparam_keys' table (types, ranges) and the rules between keys before it is used;
    the common keys are read here, the architecture's own by its module (models/arch/)."""
    from ggmlrun.models.hparams import rules
    from ggmlrun.models.hparams.keys import VOCAB_LIST

    arch = spec.name
    prefix = f"{arch}."
    values = rules.check(fields, prefix=prefix, types=types, per_layer=spec.per_layer)
    # per-layer values (an architecture that has them: gemma4, lfm2): the first layer's that
    # is not 0 stands for the common scalar (lfm2's layer 0 may have no KV heads: a short-conv
    # layer), the whole tuple is the architecture's to read (get.arrays)
    arrays = {key: value for key, value in values.items() if isinstance(value, tuple)
              and key in spec.per_layer}
    values.update((key, next((v for v in value if v), value[0]))
                  for key, value in arrays.items())

    def get(key: str, default=None, required: bool = True):
        if key in values:
            return values[key]
        if required and default is None:
            raise InputError(f"GGUF metadata lacks '{prefix}{key}', which a {arch} model needs")
        return default

    n_layer = get("block_count")
    n_embd = get("embedding_length")
    n_head = get("attention.head_count")
    n_vocab = get("vocab_size", required=False)
    if n_vocab is None:
        tokens = fields.get(VOCAB_LIST)
        if tokens is None:
            raise InputError(f"GGUF metadata has neither '{arch}.vocab_size' nor "
                             f"'{VOCAB_LIST}'; the vocabulary size is unknown")
        n_vocab = rules.check_vocab_list(len(tokens))
    n_head_kv = get("attention.head_count_kv", n_head)
    head_k = get("attention.key_length", 0) or n_embd // n_head
    head_v = get("attention.value_length", 0) or n_embd // n_head
    n_rot = get("rope.dimension_count", head_k)
    rules.check_heads(arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_k=head_k,
                      head_v=head_v, n_rot=n_rot, prefix=prefix)
    scaling = get("rope.scaling.type", "linear")
    if scaling == "longrope" and not spec.longrope:
        # llama.cpp then rotates with the rope_factors_long/short tensors, which this
        # architecture's builder does not make: refused rather than computed differently
        raise InputError(f"{prefix}rope.scaling.type 'longrope' is not built by ggmlrun's "
                         f"{arch} graph (phi3's is); supported: none, linear, yarn")
    # rope_freq_scale_train = 1 / rope.scaling.factor (or the older rope.scale_linear), whatever
    # the scaling type; the context turns it back to 1 for type none (decoder.rope_params)
    factor = get("rope.scaling.factor", 0.0) or get("rope.scale_linear", 0.0)
    rms_eps = get("attention.layer_norm_rms_epsilon", required=not spec.rms_eps_fallback)
    if rms_eps is None:            # nemotron_h: the layer norm's epsilon stands for it
        rms_eps = get("attention.layer_norm_epsilon")
    common = dict(
        arch=arch, ff_optional=spec.n_ff_optional,
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        # llama.cpp reads it optionally; an architecture whose FFN widths have keys of their own
        # (qwen35moe's experts) may lack it (0)
        n_ff=get("feed_forward_length", 0 if spec.n_ff_optional else None), n_vocab=n_vocab,
        n_ctx_train=get("context_length"), n_rot=n_rot,
        rope_freq_base=get("rope.freq_base", 10000.0),
        rope_freq_scale=1.0 / factor if factor else 1.0,
        # required: every registered architecture's load_arch_hparams reads it without a default
        # (but nemotron_h's, which falls back to attention.layer_norm_epsilon)
        norm_rms_eps=rms_eps,
        n_embd_head_k=head_k, n_embd_head_v=head_v,
        rope_scaling=scaling,
        n_ctx_orig_yarn=get("rope.scaling.original_context_length", 0),
        rope_attn_factor=get("rope.scaling.attn_factor", 1.0))
    if spec.read_hparams is None:
        return HParams(**common)
    get.arrays = arrays
    return spec.read_hparams(get, common)


_GGUF_TYPE_NAMES = {"u8": "UINT8", "i8": "INT8", "u16": "UINT16", "i16": "INT16",
                    "u32": "UINT32", "i32": "INT32", "u64": "UINT64", "i64": "INT64",
                    "f32": "FLOAT32", "f64": "FLOAT64", "bool": "BOOL", "str": "STRING"}


def gguf_types(kv_types: dict[str, str], prefix: str) -> dict[str, str]:
    """Each `prefix` key's stored GGUF type by gguf.GGUFValueType's name ("UINT32",
    "ARRAY[INT32]"), from the header reader's short names ("u32", "arr[i32]"): what hparam_rules
    checks a value's type against."""
    types = {}
    for key, short in kv_types.items():
        if not key.startswith(prefix):
            continue
        if short.startswith("arr[") and short.endswith("]"):
            types[key] = f"ARRAY[{_GGUF_TYPE_NAMES.get(short[4:-1], short[4:-1].upper())}]"
        else:
            types[key] = _GGUF_TYPE_NAMES.get(short, short.upper())
    return types
