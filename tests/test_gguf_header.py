"""The GGUF header reader (models/gguf/header.py) against hand-made bad files: every check gguf.cpp
and llama.cpp's model loader make, each a clean exit 2 naming the file and the key or tensor;
and the tensors and types a model may hold (models/modelfile.py)."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from ggmlrun.models.gguf import reader as gguf_reader
from ggmlrun.models.gguf.header import UnreadArray, read_header
from ggmlrun.models.modelfile import WEIGHT_TYPES, read_gguf
from tests.clikit import invoke
from tests.hang import no_hang
from tests.ggufkit import (MODELS, info_bytes, kv_bytes, layout, patch, pstr, rebuild,
                           u32_kv)
from tests.test_models_gguf import write_tiny_llama

Q8 = next(m for m in MODELS if m.name == "tiny-llama-q8_0.gguf")
COMMANDS = (["validate"], ["plan"], ["measure"], ["fit"], ["run", "--tokens", "1,2,3"])


@pytest.fixture(scope="module")
def raw():
    return Q8.read_bytes()


def refused(tmp_path, data: bytes, *words, commands=(["validate"],)) -> str:
    """Every command exits 2 with one line naming the file and each of `words`."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    for command in commands:
        with no_hang(f"{command} {path}"):
            code, out, err = invoke(*command, path)
        assert code == 2, (command, err)
        assert err.startswith("ggmlrun: error: ") and err.count("\n") == 1, err
        assert str(path) in err and "internal error" not in err and "Traceback" not in err
        for word in words:
            assert word in err, (word, err)
    return err


# --- the reader agrees with gguf's on the bundled models -----------------------------------

@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_reads_what_gguf_reads(path):
    header, reader = read_header(path), gguf.GGUFReader(path)
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(header.tensors, reader.tensors):
        assert (mine.offset, list(mine.ne), mine.type_id, mine.nbytes) == \
            (theirs.data_offset, theirs.shape.tolist(), int(theirs.tensor_type), theirs.n_bytes)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = header.kv[key]
        if isinstance(value, UnreadArray):              # skipped: its length only
            assert key.startswith("tokenizer.") and len(value) == len(field.data)
        else:
            assert value == pytest.approx(field.contents()), key
    assert header.data_end == path.stat().st_size


def test_small_chunks_read_the_same(monkeypatch):
    """Reads that straddle the reader's chunks (the header read in 7-byte pieces)."""
    whole = read_header(Q8)
    monkeypatch.setattr(gguf_reader, "_CHUNK", 7)
    pieces = read_header(Q8)
    assert pieces.kv == whole.kv and pieces.tensors == whole.tensors


def test_small_arrays_are_decoded(tmp_path, raw):
    ints = struct.pack("<iQ3i", 5, 3, 1, 2, 3)
    path = tmp_path / "m.gguf"
    path.write_bytes(rebuild(raw, extra_kv=kv_bytes("llama.test_array", 9, ints)
                             + kv_bytes("llama.test_strings", 9, struct.pack("<iQ", 8, 2)
                                        + pstr("a") + pstr("bc"))
                             + kv_bytes("general.flag", 7, b"\x02"), extra_kv_count=3))
    header = read_header(path)
    assert header.kv["llama.test_array"] == [1, 2, 3]
    assert header.kv["llama.test_strings"] == ["a", "bc"]
    assert header.kv_types["llama.test_array"] == "arr[i32]" and header.kv["general.flag"] is True
    assert header.kv.types["llama.block_count"] == "u32"       # what from_metadata is given
    assert read_gguf(path).hparams.n_layer == 4


# --- counts and sizes against the bytes left ------------------------------------------------

def test_huge_array_count_is_refused_at_once(tmp_path, raw):
    """One byte of a bundled model changed: an array that declares ~10^9 items (it hung)."""
    lay = layout(raw)
    at = lay.keys["tokenizer.ggml.scores"][1] + 4 + 4 + 3       # the count's 4th byte
    bad = bytearray(raw)
    bad[at] = 0x3B
    err = refused(tmp_path, bytes(bad), "tokenizer.ggml.scores", "truncated at byte 264896 of")


def test_huge_string_array_count_is_refused(tmp_path, raw):
    at = layout(raw).keys["tokenizer.ggml.tokens"][1] + 8
    refused(tmp_path, patch(raw, at, "<Q", 10**9), "tokenizer.ggml.tokens", "truncated at byte")
    refused(tmp_path, patch(raw, at, "<Q", 2**40), "limit is 1073741824")


def test_huge_string_length(tmp_path, raw):
    start = layout(raw).keys["general.name"][1]
    refused(tmp_path, patch(raw, start + 4, "<Q", 2**63), "general.name", "limit")
    refused(tmp_path, patch(raw, start + 4, "<Q", 10**6), "general.name", "truncated at byte")


def test_huge_counts_in_the_header(tmp_path, raw):
    refused(tmp_path, patch(raw, 8, "<q", 10**15), "truncated at byte")
    refused(tmp_path, patch(raw, 16, "<q", 2**62), "truncated at byte")
    refused(tmp_path, patch(raw, 16, "<q", -1), "declares -1 keys")


def test_nested_arrays_are_refused(tmp_path, raw):
    """Arrays nested 1,000 deep were an internal RecursionError."""
    nested = struct.pack("<iQ", 9, 1) * 1000 + struct.pack("<iQ", 4, 0)
    refused(tmp_path, rebuild(raw, extra_kv=kv_bytes("x.nested", 9, nested)), "x.nested",
            "nested arrays")


@pytest.mark.parametrize("cut", [6, 20, 100, 9000, 10170, 200_000, 264_895])
def test_truncated_file_names_the_byte(tmp_path, raw, cut):
    err = refused(tmp_path, raw[:cut], f"truncated at byte {cut} of",
                  commands=COMMANDS if cut == 200_000 else (["validate"],))
    if cut == 200_000:         # the data section cut: the tensor and where the file ends
        assert "truncated at byte 200000 of" in err and "tensor '" in err
        assert "reshape" not in err


# --- keys -----------------------------------------------------------------------------------

def test_duplicate_key(tmp_path, raw):
    at = layout(raw).keys["tokenizer.ggml.eos_token_id"][0] + 8 + len("tokenizer.ggml.")
    refused(tmp_path, patch(raw, at, "3s", b"bos"), "duplicate key 'tokenizer.ggml.bos_token_id'")


def test_empty_key_and_bad_value_type(tmp_path, raw):
    refused(tmp_path, rebuild(raw, extra_kv=kv_bytes("", 4, b"\0" * 4)), "key 20 is empty")
    refused(tmp_path, rebuild(raw, extra_kv=kv_bytes("x.t", 13, b"\0" * 4)), "x.t",
            "invalid GGUF value type 13")
    refused(tmp_path, rebuild(raw, extra_kv=kv_bytes("x.t", 9, struct.pack("<iQ", 77, 1))),
            "array of invalid GGUF type 77")


def test_alignment_key(tmp_path, raw):
    refused(tmp_path, rebuild(raw, extra_kv=u32_kv("general.alignment", 48)),
            "general.alignment", "not a power of 2")
    refused(tmp_path, rebuild(raw, extra_kv=u32_kv("general.alignment", 0)), "not a power of 2")
    refused(tmp_path, rebuild(raw, extra_kv=kv_bytes("general.alignment", 5, b"\x20\0\0\0")),
            "must be of type u32 but is i32")


def test_alignment_is_honoured(tmp_path):
    """general.alignment 64: the data section and every offset follow it."""
    w = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "llama")
    w.add_custom_alignment(64)
    w.add_tensor("t", np.ones(5, np.float32))
    w.add_tensor("u", np.ones(7, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    header = read_header(tmp_path / "b.gguf")
    assert header.alignment == 64 and header.data_offset % 64 == 0
    assert [t.offset - header.data_offset for t in header.tensors] == [0, 64]


def test_version_and_byte_order(tmp_path, raw):
    refused(tmp_path, patch(raw, 4, "<I", 1), "version 1 is not supported")
    refused(tmp_path, patch(raw, 4, "<I", 4), "version 4 is not supported")
    refused(tmp_path, patch(raw, 4, "<I", 0), "version 0")
    refused(tmp_path, patch(raw, 4, ">I", 3), "big-endian")


def test_big_endian_file_from_gguf_writer(tmp_path):
    """A big-endian GGUF ran and returned NaN logits with exit 0."""
    path = write_tiny_llama(tmp_path / "be.gguf", big_endian=True)
    refused(tmp_path, path.read_bytes(), "big-endian", commands=COMMANDS)


# --- tensor infos -----------------------------------------------------------------------------

def _info(raw, name):
    return layout(raw).infos[name]


def test_tensor_offsets_exactly_as_gguf_cpp_computes_them(tmp_path, raw):
    """2**64-1 wrapped and read the header; overlapping and misaligned offsets were accepted."""
    second = list(layout(raw).infos)[1]
    _, at, _ = _info(raw, second)
    first_offset = 0
    good = struct.unpack_from("<Q", raw, at)[0]
    for offset in (2**64 - 1, first_offset, good + 1, good + 32, good - 32):
        err = refused(tmp_path, patch(raw, at, "<Q", offset), f"tensor '{second}'",
                      f"data offset {offset}, expected {good}", commands=COMMANDS
                      if offset == 2**64 - 1 else (["validate"],))
        assert "RuntimeWarning" not in err


def test_long_tensor_name(tmp_path, raw):
    """A 100 KB tensor name was accepted."""
    start, _, end = _info(raw, "output.weight")
    name = b"n" * 100_000
    info = raw[start:end]
    long_info = pstr(name) + info[8 + len(b"output.weight"):]
    bad = rebuild(raw[:start] + long_info + raw[end:])     # re-aligns the data section
    refused(tmp_path, bad, "100000 bytes long", "limit is 63")
    just = pstr(b"o" * 64) + info[8 + len(b"output.weight"):]
    refused(tmp_path, rebuild(raw[:start] + just + raw[end:]), "64 bytes long")


def test_duplicate_tensor_name(tmp_path, raw):
    start, _, _ = _info(raw, "blk.0.attn_k.weight")
    refused(tmp_path, patch(raw, start + 8, "19s", b"blk.0.attn_q.weight"),
            "tensor 'blk.0.attn_q.weight'", "duplicate tensor name")


@pytest.mark.parametrize("n_dims, ne, type_id, words", [
    (5, (64, 1, 1, 1, 1), 8, ("5 dimensions",)),
    (2, (-64, 64), 8, ("negative dimension",)),
    (4, (2**32, 2**32, 2**32, 1), 0, ("INT64_MAX",)),
    (2, (64, 64), 4, ("invalid ggml type 4",)),          # a removed type (q4_2)
    (2, (64, 64), 99, ("invalid ggml type 99",)),
    (2, (65, 64), 8, ("65 elements per row", "block size 32")),
])
def test_tensor_info_checks(tmp_path, raw, n_dims, ne, type_id, words):
    name = "blk.0.attn_q.weight"
    start, _, end = _info(raw, name)
    offset = struct.unpack_from("<Q", raw, end - 8)[0]
    bad = rebuild(raw[:start] + info_bytes(name, ne[:n_dims], type_id, offset) + raw[end:])
    refused(tmp_path, bad, f"tensor '{name}'", *words)


# --- the tensors a model may hold ------------------------------------------------------------

def with_extra_tensor(raw: bytes, name: str) -> bytes:
    """The file with one more f32 tensor of 64 elements after the others."""
    data_len = len(raw) - layout(raw).data_offset
    offset = -(-data_len // 32) * 32
    return rebuild(raw, extra_info=info_bytes(name, (64,), 0, offset),
                   extra_data=b"\0" * (offset - data_len) + b"\0" * 256)


def test_unknown_extra_tensor_is_refused(tmp_path, raw):
    """Extra tensors were accepted (llama.cpp: "wrong number of tensors"). (A Q bias is one
    llama.cpp's llama loads, TENSOR_NOT_REQUIRED, and so does ggmlrun; qwen3's head norm is not.)"""
    refused(tmp_path, with_extra_tensor(raw, "blk.0.attn_q_norm.weight"),
            "tensor 'blk.0.attn_q_norm.weight'", "wrong number of tensors", commands=COMMANDS)
    refused(tmp_path, with_extra_tensor(raw, "blk.4.attn_norm.weight"),
            "tensor 'blk.4.attn_norm.weight'", "4 layers")


def test_misnamed_layer_tensor_is_an_input_error(tmp_path, raw):
    """`blk.x.attn_q.weight` was an internal ValueError on measure/plan/run/fit."""
    refused(tmp_path, with_extra_tensor(raw, "blk.x.attn_q.weight"), "blk.x.attn_q.weight",
            commands=COMMANDS)
    start, _, _ = _info(raw, "blk.0.attn_q.weight")
    refused(tmp_path, patch(raw, start + 8 + 4, "1s", b"x"), "blk.0.attn_q.weight",
            commands=COMMANDS)


def write_with_type(path, name: str, qtype: str):
    """A tiny llama (n_embd 256) whose tensor `name` is stored as `qtype` (random bytes)."""
    from ggmlrun.models.arch import llama_tensor_shapes
    from ggmlrun.models.hparams.record import HParams

    hp = HParams(n_layer=1, n_embd=256, n_head=4, n_head_kv=4, n_ff=256, n_vocab=300,
                      n_ctx_train=256, n_rot=64)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 1), ("context_length", 256), ("embedding_length", 256),
                       ("feed_forward_length", 256), ("attention.head_count", 4),
                       ("vocab_size", 300)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)    # llama.cpp requires it
    rng = np.random.default_rng(0)
    for tname, shape in llama_tensor_shapes(hp).items():
        if tname != name:
            w.add_tensor(tname, rng.standard_normal(shape).astype(np.float32))
            continue
        gtype = gguf.GGMLQuantizationType[qtype]
        block, size = gguf.GGML_QUANT_SIZES[gtype]
        data = rng.integers(0, 255, (shape[0], shape[1] // block * size), dtype=np.uint8)
        w.add_tensor(tname, data, raw_shape=data.shape, raw_dtype=gtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("qtype", ["Q8_1", "Q8_K"])
def test_weight_type_without_a_kernel_is_refused_at_load(tmp_path, qtype):
    """q8_1/q8_K weights were accepted and failed in `run` with "cannot decode"."""
    name = "blk.0.ffn_up.weight"
    raw = write_with_type(tmp_path / "q.gguf", name, qtype).read_bytes()
    err = refused(tmp_path, raw, f"tensor '{name}'", f"type {qtype.lower()[:-1]}{qtype[-1]}",
                  "no kernel", commands=COMMANDS)
    assert "cannot decode" not in err


def test_weight_types_have_kernels(tmp_path):
    """Every type the loader admits for a weight decodes; a model in one of them loads."""
    from ggmlrun.core.ir.types import TYPES, decode_blocks

    assert "q8_1" not in WEIGHT_TYPES and "q8_K" not in WEIGHT_TYPES
    for name in WEIGHT_TYPES:
        gtype = TYPES[name]
        if gtype.is_block:
            raw = np.zeros((2, gtype.type_size), np.uint8)
            assert decode_blocks(raw, name).size == 2 * gtype.block_size, name
    path = write_with_type(tmp_path / "k.gguf", "blk.0.ffn_up.weight", "Q4_K")
    assert read_gguf(path).tensors["blk.0.ffn_up.weight"].dtype == "q4_K"


def test_architecture_key_must_be_a_string(tmp_path, raw):
    start, at_type, end = layout(raw).keys["general.architecture"]
    bad = rebuild(raw, drop_key="general.architecture",
                  extra_kv=u32_kv("general.architecture", 7))
    refused(tmp_path, bad, "general.architecture", "must be a string")


def test_split_files_are_named(tmp_path, raw):
    bad = rebuild(raw, extra_kv=kv_bytes("split.count", 2, struct.pack("<H", 3)))
    refused(tmp_path, bad, "split GGUF files", "merge")


def test_big_arrays_are_skipped_not_decoded(tmp_path, raw):
    """A 0.9 MB metadata array took 13.6 s and 656 MiB: big arrays keep their length only."""
    ints = struct.pack("<iQ", 5, 225_000) + b"\1\0\0\0" * 225_000
    strings = struct.pack("<iQ", 8, 100_000) + pstr("ab") * 100_000
    path = tmp_path / "big.gguf"
    path.write_bytes(rebuild(raw, extra_kv=kv_bytes("x.ints", 9, ints)
                             + kv_bytes("x.strings", 9, strings), extra_kv_count=2))
    header = read_header(path)
    assert header.kv["x.ints"] == UnreadArray("i32", 225_000)
    assert header.kv["x.strings"] == UnreadArray("str", 100_000)
    assert header.kv_types["x.strings"] == "arr[str]"
    assert read_gguf(path).hparams.n_vocab == 320
    # a string in the walk that runs past the end is found without reading the others
    cut = path.read_bytes()
    at = cut.index(pstr("ab") * 2) + 10 * 5
    bad = bytearray(cut)
    struct.pack_into("<Q", bad, at, 2**40)
    refused(tmp_path, bytes(bad), "key 'x.strings'", "string 5")


@pytest.mark.parametrize("chunk", [7, 1 << 20])
@pytest.mark.parametrize("which, length, words", [
    (0, 2**31, ("string 0 is 2147483648 bytes long", "limit")),
    (319, 2**31, ("string 319 is 2147483648 bytes long",)),
    (319, 10**6, ("string 319 (1000000 bytes)", "truncated at byte")),
    (100, 10**6, ("truncated at byte",)),
])
def test_string_walk_checks_every_length(tmp_path, raw, monkeypatch, chunk, which, length,
                                         words):
    """The walk over the vocabulary's strings checks each length (limit, end of file), in
    whatever chunks the file is read."""
    monkeypatch.setattr(gguf_reader, "_CHUNK", chunk)
    at = layout(raw).keys["tokenizer.ggml.tokens"][1] + 4 + 4 + 8       # string 0's length
    for _ in range(which):
        at += 8 + struct.unpack_from("<Q", raw, at)[0]
    refused(tmp_path, patch(raw, at, "<Q", length), "key 'tokenizer.ggml.tokens'", *words)
