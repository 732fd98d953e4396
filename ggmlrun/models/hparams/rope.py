"""llama.cpp's rope facts that come from the hyperparameters alone: the ggml_rope_ext
parameters llama_context derives, and which layers read rope_freqs. No graph code: placement
asks the second before any graph is built, and tests check the first on bare hparams.
"""

from __future__ import annotations

from ggmlrun.core.util.float32 import f32
from ggmlrun.core.util.lazynumpy import np     # only YaRN needs it (NumPy's float32 log)


def rope_params(hp) -> dict:
    """ggml_rope_ext's parameters as llama_context's constructor derives them from the
    hyperparameters (llama.cpp's defaults for every context option): type none never scales;
    YaRN gets ext_factor 1 and an attention factor of get_mscale(factor), cancelled by
    1/(1 + 0.1 ln factor) as ggml-cpu applies it again; rope.scaling.attn_factor on top."""
    freq_scale = 1.0 if hp.rope_scaling == "none" else hp.rope_freq_scale
    ext_factor = 1.0 if hp.rope_scaling == "yarn" else 0.0
    attn_factor = 1.0
    if ext_factor:
        # llama.cpp computes in float; NumPy's float32 log and float32-weak scalars (NEP 50)
        # give its roundings here, so YaRN (and only YaRN) imports NumPy
        factor = f32(1.0 / f32(freq_scale))

        def mscale(scale: float, m: float) -> float:
            return 1.0 if scale <= 1.0 else float(np.float32(0.1 * m * np.log(np.float32(scale))
                                                             + 1.0))

        if hp.rope_yarn_log_mul:
            # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: deepseek2's mscale is mscale_all_dims too
            m = hp.rope_yarn_log_mul if hp.yarn_mscale_all_dims else 1.0
            attn_factor = f32(mscale(factor, m) / mscale(factor, hp.rope_yarn_log_mul))
        else:
            attn_factor = mscale(factor, 1.0)
        attn_factor = f32(attn_factor * float(np.float32(1.0 / (1.0 + 0.1 * np.log(
            np.float32(factor))))))
    attn_factor = f32(attn_factor * hp.rope_attn_factor)
    return dict(n_ctx_orig=hp.n_ctx_orig_yarn, freq_base=hp.rope_freq_base,
                freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor,
                beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow)


def rope_freqs_layers(hp) -> tuple[int, ...]:
    """The layers that read rope_freqs: the first creates it, the others hold a duplicate
    (every layer, or gemma4's full-attention ones: hp.rope_freqs_layers)."""
    layers = hp.rope_freqs_layers
    return tuple(layers) if layers is not None else tuple(range(hp.n_layer))
