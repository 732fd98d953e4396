"""A GGUF's header describes the whole file: the bytes between the header and the data, and
after the data, are gguf's zero padding. A tensor count one short (every tensor then read
early, the last one missing) or other bytes appended after the data are refused at load;
zeros appended (a tool padding the file) are padding."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from clikit import invoke

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted((ROOT / "examples" / "models").glob("*.gguf"))


@pytest.mark.parametrize("model", MODELS[::4], ids=lambda p: p.stem)
def test_a_tensor_count_one_short_is_refused(tmp_path, model):
    path = tmp_path / "m.gguf"
    shutil.copy(model, path)
    with open(path, "r+b") as handle:
        handle.seek(8)                                  # GGUF v3: magic, version, n_tensors
        count = struct.unpack("<Q", handle.read(8))[0]
        handle.seek(8)
        handle.write(struct.pack("<Q", count - 1))
    code, _, err = invoke("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "zero padding" in err


def test_bytes_after_the_data_are_refused_unless_zeros_and_the_files_as_written_load(tmp_path):
    for model in MODELS:
        assert invoke("validate", model)[0] == 0, model
    path = tmp_path / "m.gguf"
    for tail, code_wanted in ((b"\0" * 64, 0), (b"\0" * 63 + b"x", 2), (b"\1" * 4096, 2)):
        shutil.copy(MODELS[0], path)
        with open(path, "ab") as handle:
            handle.write(tail)
        code, _, err = invoke("validate", path)
        assert code == code_wanted, (tail[-4:], err)
        if code:
            assert f"{len(tail)} bytes after the data" in err
