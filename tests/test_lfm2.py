"""lfm2 (LiquidAI's LFM2): what the recorded figures (tests/test_llamacpp_figures.py) cannot
name: 0 KV heads make a layer a short conv, the state a short conv keeps, where the output
norm lives, and the files ggmlrun refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import from_metadata
from ggmlrun.models.arch.build import build_graph
from ggmlrun.models.memory.caches import create_memory
from ggmlrun.models.modelfile import read_gguf

MODELS = Path(__file__).resolve().parents[1] / "examples" / "models"


def fields(**extra) -> dict:
    base = {"block_count": 4, "embedding_length": 64, "feed_forward_length": 96,
            "vocab_size": 320, "context_length": 512, "attention.head_count": 4,
            "attention.head_count_kv": [0, 2, 0, 2], "attention.layer_norm_rms_epsilon": 1e-5,
            "shortconv.l_cache": 3}
    base.update(extra)
    return {f"lfm2.{k}": v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("kv,l_cache", [((0, 2, 0, 2), 3), ((2, 0, 0, 0), 4), ((0, 0, 0, 1), 2)])
def test_layers_without_kv_heads_are_short_convs_with_a_state_of_l_cache_minus_one_columns(
        kv, l_cache):
    hp = from_metadata(fields(**{"attention.head_count_kv": list(kv),
                                 "shortconv.l_cache": l_cache}), "lfm2")
    memory = create_memory(hp, kv_type="f16", cells=256, flash_attn=False, n_seq_max=2)
    conv = [il for il, h in enumerate(kv) if h == 0]
    assert [il for il in range(4) if hp.is_recurrent(il)] == conv
    assert memory.recurrent.rows == 2
    assert memory.recurrent.widths == {il: (64 * (l_cache - 1), 0) for il in conv}
    assert sorted(memory.kv.widths) == [il for il, h in enumerate(kv) if h]
    assert all(memory.kv.widths[il] == (16 * kv[il], 16 * max(kv)) for il in memory.kv.widths)


@pytest.mark.parametrize("name", ["tiny-lfm2-f16", "tiny-lfm2-q8_0"])
def test_each_short_conv_runs_ssm_conv_over_its_state_and_writes_the_last_columns_back(name):
    model = read_gguf(MODELS / f"{name}.gguf")
    hp = model.hparams
    nodes = build_graph(model, 32, 32, 256, 256, False, "f16").graph.nodes
    convs = [t for t in nodes if t.op == "ssm_conv"]
    layers = [il for il in range(hp.n_layer) if hp.is_recurrent(il)]
    assert [t.name for t in convs] == [f"model.layers.{{}}.conv.conv-{il}" for il in layers]
    for t, il in zip(convs, layers):
        bx, kernel = t.src
        assert bx.op == "concat" and bx.shape == (1, 64, 2 + 32)
        assert kernel.name == f"blk.{il}.shortconv.conv.weight" and kernel.dtype == "f32"
    # the last l_cache - 1 columns of each concat go back into the layer's state
    stores = [t for t in nodes if t.op == "cpy" and t.src[0].view_src is not None
              and t.src[0].view_src.op == "concat"]
    assert [t.view_src.name for t in stores] == [f"cache_r_l{il}" for il in layers]
    assert all(t.src[0].shape == (1, 64, 2) and t.src[0].view_offset == 32 * 4 for t in stores)


def test_the_output_norm_is_token_embd_norm_on_the_output_layer():
    model = read_gguf(MODELS / "tiny-lfm2-f16.gguf")
    from ggmlrun.models.memory.placement import place
    from ggmlrun.models.options.params import ModelOptions
    from ggmlrun.core.backends.spec import BackendSpec

    backends = [BackendSpec(name="GPU0", kind="sim", memory=1 << 30, alignment=32),
                BackendSpec(name="CPU", kind="cpu", memory=1 << 30, alignment=32)]
    placed = place(model.hparams, model.tensors, backends, ModelOptions(ngl=1))
    assert model.hparams.output_norm == "token_embd_norm.weight"
    assert placed.weights["token_embd_norm.weight"] == 0      # with the output, offloaded
    assert placed.weights["token_embd.weight"] == 1           # the input layer stays


@pytest.mark.parametrize("extra,message", [
    ({"attention.sliding_window": 64}, "sliding-window"),
    ({"shortconv.l_cache": None}, "shortconv.l_cache"),
    ({"shortconv.l_cache": 1}, "shortconv.l_cache"),
    ({"attention.head_count_kv": [0, 3, 0, 3]}, "multiple"),
    ({"attention.head_count_kv": [0, 0, 0, 0]}, "head_count_kv"),
    ({"attention.head_count_kv": [0, 2, 0]}, "per-layer values"),
])
def test_files_not_built_or_broken_are_input_errors(extra, message):
    with pytest.raises(InputError, match=message):
        from_metadata(fields(**extra), "lfm2")


def test_zero_kv_heads_stay_refused_where_every_layer_has_attention():
    base = {k.replace("lfm2.", "qwen3."): v for k, v in fields().items() if "shortconv" not in k}
    with pytest.raises(InputError):
        from_metadata(base, "qwen3")


# --- lfm2moe: lfm2's loop with experts after the leading dense layers ------------------------

def moe_fields(**extra) -> dict:
    base = {k.replace("lfm2.", "lfm2moe."): v for k, v in fields().items()}
    base.update({f"lfm2moe.{k}": v for k, v in dict(
        expert_count=8, expert_used_count=2, expert_feed_forward_length=32,
        expert_gating_func=2, leading_dense_block_count=1).items()})
    base.update({f"lfm2moe.{k}": v for k, v in extra.items()})
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("lead", [0, 1, 4])
def test_lfm2moe_layers_past_the_leading_dense_ones_route_to_experts(lead):
    hp = from_metadata(moe_fields(leading_dense_block_count=lead), "lfm2moe")
    from ggmlrun.models.arch import get_arch

    table = get_arch("lfm2moe").tensors(hp)
    routed = [il for il in range(4) if f"blk.{il}.ffn_gate_inp.weight" in table]
    dense = [il for il in range(4) if f"blk.{il}.ffn_gate.weight" in table]
    assert (routed, dense) == (list(range(lead, 4)), list(range(lead)))
    assert all(table[f"blk.{il}.exp_probs_b.bias"].required is True for il in routed)
    assert hp.gating == "sigmoid" and hp.n_ff_exp == 32


@pytest.mark.parametrize("extra,message", [
    ({"expert_gating_func": None}, "expert_gating_func"),
    ({"expert_gating_func": 0}, "not built"),
    ({"expert_gating_func": 3}, "not built"),
    ({"expert_feed_forward_length": None}, "expert_feed_forward_length"),
    ({"expert_used_count": 9}, "more than"),
])
def test_lfm2moe_files_without_what_its_loader_requires_are_input_errors(extra, message):
    with pytest.raises(InputError, match=message):
        from_metadata(moe_fields(**extra), "lfm2moe")
