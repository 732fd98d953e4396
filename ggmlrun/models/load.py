"""What a GRAPH argument names: a GGUF model, a model card, or a YAML graph.

A remote name (an http(s):// URL, an hf:// name: a str, never a Path, whose `//` a Path
would collapse) is always a GGUF model, read by its header alone (gguf/source.py).

A GGUF file is known by its magic, never by its name; a YAML file is a model card when its
top level, once parsed, has `architecture` (flow style, after any comment, anywhere in the
mapping), and a graph file otherwise. The file is parsed once: a card here, so its errors keep
their lines; a graph file's parse is handed to the graph loader (yamlfile.keep_parsed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ggmlrun.models.modelfile import ModelFile, is_gguf, read_gguf

if TYPE_CHECKING:
    from ggmlrun.core.ir.graph import Graph


def load_input(path: Path) -> Graph | ModelFile:
    model = load_model(path)
    if model is not None:
        return model
    from ggmlrun.core.frontend.loader import load_graph   # graph files only: a model needs none of it

    return load_graph(path)


def load_model(path, *, refresh: bool = False, stats=None) -> ModelFile | None:
    """The model a GGUF file (or split set, or remote name) or a card holds; None for anything
    else (a graph file). `refresh`: remote headers are fetched again, not taken from the
    cache; `stats` counts what was fetched (gguf/remote.py's Stats)."""
    from ggmlrun.models.gguf.source import is_remote

    if is_remote(path):
        return read_gguf(str(path), refresh=refresh, stats=stats)
    path = Path(path)
    if path.is_file() and is_gguf(path):
        return read_gguf(path)
    _refuse_gguf_without_magic(path)
    if path.is_file():
        # the YAML parser only for a YAML file, the card reader only for a card: a GGUF file
        # needs neither
        from ggmlrun.core.frontend.yamlfile import keep_parsed, read_yaml

        data, doc = read_yaml(path)
        if isinstance(data, dict) and "architecture" in data:      # cards.reader.is_card
            from ggmlrun.models.cards.reader import card_model

            return card_model(data, doc, path)
        keep_parsed(path, data, doc)
    return None


def _refuse_gguf_without_magic(path: Path) -> None:
    """The name never makes a file a GGUF, but a `.gguf` file without the magic is a broken
    model far more often than a graph file: say what its first bytes are, not what a graph
    file lacks."""
    from ggmlrun.core.util.errors import InputError

    if path.suffix.lower() != ".gguf" or not path.is_file():
        return
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return
    raise InputError(f"no GGUF magic: the file starts with {head!r}, not b'GGUF' (a model file "
                     f"cut short or not a GGUF; a graph file would be YAML)", file=str(path))
