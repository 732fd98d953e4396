"""One error format, the leftovers of issue 24: fit on a missing file, `fit --ngl`, shortfalls
formatted like the tables, and `dot -o x.svg` without Graphviz never replacing x.dot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clikit import invoke
from ggmlrun.core.util.fmt import human_bytes

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples/models/tiny-llama-q8_0.gguf"
CARD_70B = ROOT / "ggmlrun/models/cards/llama-3-70b-q4_k_m.yaml"


def _one_line(err: str) -> str:
    assert err.startswith("ggmlrun: error: ") and err.count("\n") == 1, err
    return err


def test_fit_on_a_missing_file_says_no_such_file():
    code, out, err = invoke("fit", ROOT / "examples/models/tiny-llama-q8.gguf")
    assert code == 2
    assert "no such file; the nearest name in " in _one_line(err)
    assert "examples/models/ is 'tiny-llama-q8_0.gguf'" in \
        _one_line(err)
    code, out, err = invoke("fit", ROOT / "graphs/mlp.yaml")
    assert code == 2 and "fit takes a model" in _one_line(err)


def test_fit_ngl_says_fit_chooses_it():
    code, out, err = invoke("fit", TINY, "--ngl", "99", "--json")
    assert code == 2
    assert "fit chooses -ngl itself" in _one_line(err) and "ggmlrun measure MODEL --ngl 99" in err
    assert "ggml" not in err.replace("ggmlrun", "")
    assert json.loads(out)["error"]["exit"] == 2


def test_negative_bytes_are_formatted():
    assert human_bytes(-4294967296) == "-4.00 GiB"
    assert human_bytes(-100) == "-100 B"
    code, out, err = invoke("fit", CARD_70B.with_name("llama-3-8b-q4_k_m.yaml"), "--gpu",
                            "512MiB", "--margin", "1GiB", "--ram", "1TiB")
    assert code == 1
    assert "its memory, 512.00 MiB, is less than the margin of 1.00 GiB" in err
    assert not re.search(r"-\d{4,} B", err)


def test_dot_without_graphviz_keeps_an_existing_dot_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    mine = tmp_path / "x.dot"
    mine.write_text("my own notes")
    code, out, err = invoke("dot", ROOT / "graphs/mlp.yaml", "-o", tmp_path / "x.svg")
    assert code == 1 and out == ""
    assert "exists and is left as it is" in _one_line(err)
    assert mine.read_text() == "my own notes" and not (tmp_path / "x.svg").exists()


@pytest.mark.parametrize("content", [b"XXXXjunkjunkjunk", b"", b"name: x\\n"])
def test_a_gguf_named_file_without_the_magic_says_so(tmp_path, content):
    """Issue 24: GGUF errors say what is wrong with the file; a `.gguf` without the magic is
    not described as a graph file that lacks `tensors:`."""
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    for command in ("validate", "measure", "run"):
        code, out, err = invoke(command, path)
        assert code == 2 and out == "", err
        assert err.startswith("ggmlrun: error: ") and "no GGUF magic" in err, err
        assert len(err.strip().splitlines()) == 1
