"""A model card is decided after parsing: a flow-style card, one whose `architecture:` comes
after 64 KiB of comments, or one with a byte order mark is a card; a graph file is parsed once
(the parse that told it from a card is the one the graph loader uses)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from clikit import invoke
import ggmlrun.core.frontend.yamlfile as yamlfile

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "ggmlrun" / "models" / "cards" / "llama-3-8b-q4_k_m.yaml"


def _variants(tmp_path):
    text = CARD.read_text()
    data = yaml.safe_load(text)
    flow = tmp_path / "flow.yaml"
    flow.write_text(yaml.safe_dump(data, default_flow_style=True, width=10**9))
    late = tmp_path / "late.yaml"
    late.write_text("# " + "x" * 70000 + "\n" + text)
    bom = tmp_path / "bom.yaml"
    bom.write_text(text, encoding="utf-8-sig")
    last = tmp_path / "last.yaml"
    keys = list(data)
    last.write_text(yaml.safe_dump({k: data[k] for k in keys[1:] + keys[:1]}, sort_keys=False))
    return [flow, late, bom, last]


def test_every_spelling_of_a_card_is_a_card(tmp_path):
    want = invoke("validate", CARD)
    assert want[0] == 0
    for path in _variants(tmp_path):
        code, out, err = invoke("validate", path)
        assert code == 0, (path.name, err)
        assert out.split(": ", 1)[1] == want[1].split(": ", 1)[1], path.name


def test_a_graph_file_is_read_once(monkeypatch):
    reads = []
    real = yamlfile.read_text
    monkeypatch.setattr(yamlfile, "read_text", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    assert invoke("validate", ROOT / "graphs" / "mlp.yaml")[0] == 0
    assert len(reads) == 1


@pytest.mark.parametrize("command", [("plan",), ("measure",), ("run",)])
def test_graph_commands_still_load_graph_files(command):
    assert invoke(*command, ROOT / "graphs" / "mlp.yaml")[0] == 0


@pytest.mark.parametrize("override, words", [
    ("attn_norm: q8_0", "1-D"),                  # norms are never quantized by llama.cpp
    ("ffn_gate_exps: q8_0", "no such tensor"),   # a dense llama has no experts
])
def test_a_types_override_never_applied_is_refused_at_its_line(tmp_path, override, words):
    text = CARD.read_text().replace("\nweights:", f"\ntypes: {{{override}}}\nweights:", 1)
    path = tmp_path / "c.yaml"
    path.write_text(text)
    code, _, err = invoke("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err
    assert f"c.yaml:{text.splitlines().index('types: {' + override + '}') + 1}:" in err


def test_an_output_override_applies_to_a_tied_embedding(tmp_path):
    from ggmlrun.models.load import load_model

    text = CARD.read_text().replace("\nweights:", "\ntied_embeddings: true\ntypes: {output: q8_0}"
                                    "\nweights:", 1)
    path = tmp_path / "t.yaml"
    path.write_text(text)
    model = load_model(path)
    assert "output.weight" not in model.tensors
    assert model.tensors["token_embd.weight"].dtype == "q8_0"
