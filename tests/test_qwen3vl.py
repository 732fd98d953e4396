"""qwen3vl / qwen3vlmoe (Qwen3-VL's text models): what llama.cpp's recorded figures
(tests/test_llamacpp_figures.py) cannot name: where the deepstack slices come from, the IMROPE
rope, and the files llama.cpp would take but fail on."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import from_metadata
from ggmlrun.models.arch.build import build_graph
from ggmlrun.models.modelfile import read_gguf

MODELS = Path(__file__).resolve().parents[1] / "examples" / "models"


@pytest.mark.parametrize("name", ["tiny-qwen3vl-f16", "tiny-qwen3vl-q8_0", "tiny-qwen3vlmoe-q8_0"])
def test_deepstack_layers_add_their_slice_of_the_padded_token_rows(name):
    """build_inp_embd pads the token rows to n_embd * (1 + n_deepstack_layers), the layers read
    an n_embd view of them, and layer il < n_deepstack_layers adds the (il + 1)-th slice to
    its output; the embeddings input is as wide."""
    model = read_gguf(MODELS / f"{name}.gguf")
    hp, n_tok = model.hparams, 32
    mg = build_graph(model, n_tok, n_tok, 256, 256, False, "f16")
    n, width = hp.n_embd, hp.n_embd * (1 + hp.n_deepstack_layers)
    assert hp.n_deepstack_layers > 0 and mg.inputs["embd"].shape == (n_tok, width)
    by_name = {t.name: t for t in mg.graph.nodes}
    embd = by_name["embd"]
    pad = embd.src[0]
    assert pad.op == "pad" and pad.shape == (n_tok, width) and pad.src[0].op == "get_rows"
    assert embd.op == "view" and embd.shape == (n_tok, n) and embd.view_offset == 0
    adds = [t for t in mg.graph.nodes if t.name.startswith("deepstack_out-")]
    assert [t.name for t in adds] == [f"deepstack_out-{il}" for il in range(hp.n_deepstack_layers)]
    for il, add in enumerate(adds):
        l_out, ds = add.src
        assert l_out.name == f"l_out-{il}"
        assert ds.view_src is pad and ds.view_offset == (il + 1) * n * 4
        assert ds.shape == (n_tok, n) and ds.strides == (width * 4, 4)
    ropes = [t for t in mg.graph.nodes if t.op == "rope"]
    assert ropes and all(r.params["mode"] == 40 and r.params["sections"] == list(hp.rope_sections)
                         and r.src[1].shape == (4 * n_tok,) for r in ropes)


def fields(arch: str, **extra) -> dict:
    base = dict(block_count=4, embedding_length=64, feed_forward_length=96, vocab_size=320,
                context_length=512, **{"attention.head_count": 4, "attention.head_count_kv": 2,
                                       "attention.key_length": 32, "attention.value_length": 32,
                                       "attention.layer_norm_rms_epsilon": 1e-6,
                                       "rope.dimension_sections": [6, 5, 5, 0]})
    if arch == "qwen3vlmoe":
        base.update(expert_count=8, expert_used_count=2)
    base.update(extra)
    return {f"{arch}.{k}": v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("arch", ["qwen3vl", "qwen3vlmoe"])
@pytest.mark.parametrize("extra,message", [
    ({"n_deepstack_layers": 4}, "must be less than block_count"),
    ({"rope.dimension_sections": None}, "rope.dimension_sections"),
    ({"rope.dimension_sections": [0, 0, 0, 4]}, "one of the first three"),
    ({"rope.dimension_sections": [8, 8, 8, 0]}, "add up past"),
    ({"rope.dimension_count": 16}, "must equal the head size"),
])
def test_files_llama_cpp_would_abort_on_are_input_errors(arch, extra, message):
    with pytest.raises(InputError, match=message):
        from_metadata(fields(arch, **extra), arch)


@pytest.mark.parametrize("arch", ["qwen3vl", "qwen3vlmoe"])
def test_without_deepstack_the_input_is_n_embd_wide(arch):
    """n_deepstack_layers is optional (0: llama.cpp's n_embd_inp is n_embd)."""
    hp = from_metadata(fields(arch), arch)
    assert (hp.n_deepstack_layers, hp.n_embd_inp) == (0, 64)
    assert from_metadata(fields(arch, n_deepstack_layers=3), arch).n_embd_inp == 256
