"""Every file read is an input: `--out`, `--trace` and `-o` never replace a file the run has
read (the model or card, the backends file, the graph and its data), nor a read-only file (as
root too). That every signal that ends a process by default leaves no temporary file behind
is tests/test_trust.py's, over ggmlrun.cli.main.CLEANUP_SIGNALS."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clikit import invoke

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "models" / "tiny-llama-q8_0.gguf"
CARD = ROOT / "ggmlrun" / "models" / "cards" / "llama-3-70b-q4_k_m.yaml"
MLP = ROOT / "graphs" / "mlp.yaml"
BACKENDS = "backends:\n  - {name: SIM0, kind: sim}\n  - {name: CPU, kind: cpu}\n"


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copy(MODEL, model)
    (tmp_path / "b.npz").write_text(BACKENDS)          # a backends file with any name
    (tmp_path / "b.yaml").write_text(BACKENDS)
    return tmp_path, model


@pytest.mark.parametrize("option", ["--out", "--trace"])
@pytest.mark.parametrize("victim", ["model", "backends"])
def test_a_model_run_never_writes_over_a_file_it_read(files, option, victim):
    tmp, model = files
    target = model if victim == "model" else tmp / "b.npz"
    before = target.read_bytes()
    code, _, err = invoke("run", model, "--tokens", "1,2", "--backends", tmp / "b.npz",
                          option, target)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "input of this run" in err or "must end in .npz" in err     # m.gguf as --out
    assert target.read_bytes() == before


def test_dot_of_a_card_never_writes_over_the_card(tmp_path):
    card = tmp_path / "c.yaml"
    shutil.copy(CARD, card)
    before = card.read_bytes()
    code, _, err = invoke("dot", card, "-o", card)
    assert code == 2 and "input" in err and card.read_bytes() == before


@pytest.mark.parametrize("command", [("run", MLP, "--out"), ("run", MLP, "--trace"),
                                     ("dot", MLP, "-o")])
def test_a_read_only_output_is_refused_even_as_root(tmp_path, command):
    *args, option = command
    target = tmp_path / ("o.npz" if option == "--out" else "o.txt")
    target.write_bytes(b"keep")
    target.chmod(0o444)
    code, _, err = invoke(*args, option, target)
    assert code == 2 and "read-only" in err and target.read_bytes() == b"keep"


def test_a_writable_output_is_still_replaced(tmp_path):
    target = tmp_path / "o.npz"
    target.write_bytes(b"old")
    assert invoke("run", MLP, "--out", target)[0] == 0
    assert target.read_bytes()[:2] == b"PK"


def test_reads_are_forgotten_between_commands_of_one_process(tmp_path):
    graph = tmp_path / "g.yaml"
    shutil.copy(MLP, graph)
    assert invoke("validate", graph)[0] == 0
    graph.unlink()                                   # its inode may be reused by the output
    assert invoke("run", MLP, "--out", tmp_path / "o.npz")[0] == 0
