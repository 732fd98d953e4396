"""Issue 32's second-wave architectures beyond their recordings: llama4's and OLMo 3's layer
kinds as llama.cpp derives them (three of four chunked, or sliding with a window), and the
files whose graph ggmlrun refuses rather than builds differently (exit 2)."""

import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import from_metadata
from ggmlrun.models.memory.caches import create_memory


def fields(arch: str, **extra) -> dict:
    base = {"block_count": 8, "embedding_length": 64, "feed_forward_length": 96,
            "vocab_size": 320, "context_length": 512, "attention.head_count": 4,
            "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-5,
            "expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32}
    base.update(extra)
    return {f"{arch}.{k}": v for k, v in base.items()}


@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("window", [None, 4096])
def test_llama4_chunks_three_of_four_layers_of_8192_whatever_the_window(step, window):
    extra = {"interleave_moe_layer_step": step}
    if window:
        extra["attention.sliding_window"] = window
    hp = from_metadata(fields("llama4", **extra), "llama4")
    assert (hp.swa_type, hp.n_swa) == ("chunked", 8192)
    assert [il for il in range(8) if hp.is_swa(il)] == [0, 1, 2, 4, 5, 6]
    memory = create_memory(hp, cells=256, flash_attn=True)
    assert sorted(memory.kv.widths) == [3, 7] and memory.swa.swa_type == "chunked"


@pytest.mark.parametrize("window", [0, 64, 4096])
def test_olmo2_slides_three_of_four_layers_only_with_a_window(window):
    hp = from_metadata(fields("olmo2", **{"attention.sliding_window": window}), "olmo2")
    slides = [il for il in range(8) if hp.is_swa(il)]
    assert slides == ([0, 1, 2, 4, 5, 6] if window else [])
    assert (hp.n_swa, hp.swa_type) == (window, "standard") or not window


@pytest.mark.parametrize("arch,extra,message", [
    ("llama4", {"interleave_moe_layer_step": 1, "attention.sliding_window": 0},
     "sliding_window is 0"),
    ("llama4", {"interleave_moe_layer_step": 1, "expert_count": 0}, "zero experts"),
    ("llama4", {}, "interleave_moe_layer_step"),
    ("minimax-m2", {}, "expert_gating_func 0"),
    ("minimax-m2", {"expert_gating_func": 2, "expert_used_count": 9}, "more than"),
    ("olmo2", {"attention.key_length": 32, "attention.value_length": 32}, "heads must be"),
])
def test_files_not_built_are_input_errors(arch, extra, message):
    with pytest.raises(InputError, match=message):
        from_metadata(fields(arch, **extra), arch)
