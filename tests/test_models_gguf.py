"""Reading GGUF headers; `write_tiny_llama` makes the small models the other model tests use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggmlrun.core.util.errors import InputError
from ggmlrun.models.arch import llama_tensor_shapes
from ggmlrun.models.modelfile import is_gguf, read_gguf


def write_tiny_llama(path: Path, *, n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=96,
                     n_vocab=300, n_ctx=512, dtype="f32", tied=False, seed=0,
                     arch="llama", rope_freqs=False, big_endian=False) -> Path:
    """A random llama GGUF written with gguf's own writer (weights f32, f16 or q8_0); with
    `rope_freqs`, Llama 3's per-frequency rope divisors as well."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch, endianess=gguf.GGUFEndian.BIG if big_endian
                        else gguf.GGUFEndian.LITTLE)
    w.add_name("tiny")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    from ggmlrun.models.hparams.record import HParams
    hp = HParams(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                      n_ff=n_ff, n_vocab=n_vocab, n_ctx_train=n_ctx, n_rot=n_embd // n_head)
    for name, shape in llama_tensor_shapes(hp).items():
        if tied and name == "output.weight":
            continue
        if len(shape) == 1:
            w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        data = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        if dtype == "f16":
            w.add_tensor(name, data.astype(np.float16))
        elif dtype == "q8_0":
            q = quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, data)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight",
                     np.linspace(1.0, 8.0, hp.n_rot // 2).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_llama(tmp_path / "tiny.gguf")


def test_header_read_by_magic(tmp_path, tiny):
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(tiny.read_bytes())
    assert is_gguf(renamed) and not is_gguf(tmp_path / "missing.gguf")
    m = read_gguf(renamed)
    hp = m.hparams
    assert (m.arch, hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_ff, hp.n_vocab) == \
        ("llama", 2, 64, 4, 2, 96, 300)
    assert hp.n_embd_head_k == 16 and hp.n_embd_k_gqa == 32 and hp.n_rot == 16
    assert m.tensors["blk.1.attn_k.weight"].shape == (32, 64)
    assert m.tensors["token_embd.weight"].dtype == "f32"
    assert set(m.tensors) == set(llama_tensor_shapes(hp))


def test_offsets_point_at_the_data(tiny):
    import gguf

    m = read_gguf(tiny)
    info = m.tensors["blk.0.attn_q.weight"]
    raw = np.fromfile(tiny, dtype=np.float32, count=64 * 64, offset=info.offset).reshape(64, 64)
    want = next(t for t in gguf.GGUFReader(tiny).tensors if t.name == info.name).data
    np.testing.assert_array_equal(raw, want)


def test_quantized_types_and_tied_output(tmp_path):
    m = read_gguf(write_tiny_llama(tmp_path / "q.gguf", dtype="q8_0", tied=True))
    assert m.tensors["blk.0.ffn_up.weight"].dtype == "q8_0"
    assert m.tensors["blk.0.ffn_up.weight"].shape == (96, 64)
    assert "output.weight" not in m.tensors


def test_other_architecture_is_named(tmp_path):
    path = write_tiny_llama(tmp_path / "g.gguf", arch="gemma")
    with pytest.raises(InputError, match="architecture 'gemma'") as err:
        read_gguf(path)
    assert str(path) in str(err.value)


def test_truncated_file_is_an_input_error(tmp_path, tiny):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny.read_bytes()[:200])
    with pytest.raises(InputError, match="bad.gguf"):
        read_gguf(bad)


def test_missing_or_misshapen_tensor_is_named(tmp_path):
    from ggmlrun.models.modelfile import check_tensors

    m = read_gguf(write_tiny_llama(tmp_path / "m.gguf"))
    tensors = dict(m.tensors)
    del tensors["blk.1.ffn_up.weight"]
    with pytest.raises(InputError, match="lacks tensor 'blk.1.ffn_up.weight'"):
        check_tensors(m.hparams, tensors, "m.gguf")
    info = m.tensors["blk.0.attn_k.weight"]
    tensors = dict(m.tensors, **{info.name: type(info)(info.name, (64, 64), "f32", 0)})
    with pytest.raises(InputError, match=r"'blk.0.attn_k.weight' has shape \[64, 64\]"):
        check_tensors(m.hparams, tensors, "m.gguf")


def test_corrupt_headers_are_input_errors(tmp_path, tiny):
    """Bytes flipped anywhere in the header or the file cut short: an input error, never a crash."""
    raw = tiny.read_bytes()
    rng = np.random.default_rng(1)
    bad = tmp_path / "bad.gguf"
    for _ in range(150):
        data = bytearray(raw[:int(rng.integers(8, len(raw)))] if rng.random() < 0.3 else raw)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(4, 3000))] = int(rng.integers(0, 256))
        bad.write_bytes(bytes(data))
        try:
            read_gguf(bad)
        except InputError:
            pass
