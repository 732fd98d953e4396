"""A fast reader for the plain YAML that `gen` writes and most people hand-write; for any other
file it answers "not mine" (None) and the full parser in yamlfile.py reads it.

Why: PyYAML, even on libyaml's C parser, resolves and constructs every scalar in Python and
builds a node (with two marks) per scalar, about 200 us a graph node; a 100k-node graph took
20-40 s to read. This reader handles a strict subset, line by line (a run of lines that each
hold one flow collection, the bulk of a big file, in one step of C loops), and hands every flow
collection to the C JSON scanner, so a node costs a few microseconds.

The subset, and why each rule keeps the meaning identical to PyYAML's:
- printable ASCII and newlines only (no tabs, CR, BOM, quotes, tags, anchors, aliases, block
  scalars, directives or document markers: their characters are simply not accepted);
- a top-level block mapping (keys at column 0); each key holds a plain scalar or a one-line
  flow collection on its own line, or a block one level deeper (one indent for all its lines)
  whose entries (`- value` or `key: value`) each hold such a value on their own line;
- plain scalars are runs of `A-Za-z0-9_.+-` (no spaces, so no multi-line or `a:b` forms); each
  is typed by PyYAML's own resolver and constructor (`resolve`, given by yamlfile.py), so
  `yes`, `0x10`, `1e-5`, `.inf` and `2001-01-01` mean what they mean there;
- comments (a `#` after a space, or a whole line) are dropped, as YAML does;
- anything PyYAML would refuse or read differently (a duplicate key, a key that is not a
  string, a timestamp, `<<`, a line over 1000 characters where libyaml's 1024-character
  simple-key limit could start to matter, a flow collection opening over MAX_FLOW_OPENS
  brackets, a scalar of indicator characters only such as `-` or `...`) makes the reader
  give up, so every error message still comes from the full parser.
A flow collection is rewritten as JSON (scalars quoted or typed) and must then be one valid
JSON value: JSON's grammar is a strict subset of YAML's flow grammar, so whatever JSON accepts
reads the same in both, and the odd YAML forms (`{a, b}`, `[a: b]`, trailing commas) fail JSON
and go to the full parser.
"""

from __future__ import annotations

import json
import math
import re
from itertools import repeat
from operator import add

from ggmlrun.core.frontend.flatlines import FlatLines

MAX_LINE = 1000
MAX_CACHED = 1 << 20      # distinct scalars whose JSON text is kept from file to file
MAX_FLOW_OPENS = 60        # brackets a flow collection may open: it nests no deeper, and the
                           # full parser's limit is 64 levels in all (the file adds 2)
_CHAR = r"A-Za-z0-9_.+\-"
_TOKEN = re.compile(f"[{_CHAR}]+")
_BLOCK_LINE = re.compile(f"( *)(- +|([{_CHAR}]+):(?: +|$))(.*)")
_SPLIT = re.compile(f"([{_CHAR}]+)")
_SEPARATOR = re.compile(r"(?:[{}\[\], ]|: )*")      # what may stand between two scalars
# A run of block lines that each hold one flow collection and nothing else (no comment, no
# trailing space, at most MAX_LINE characters), at one indent: `- {...}` items or `key: {...}`
# entries. The runs that make up nearly all of a big file are taken a run at a time.
_FLOW_LINE = r"(?=[^\n]{0,%d}\n)%%s[\[{][^\n#]*[\]}]\n" % MAX_LINE
_ITEM_RUN = re.compile(_FLOW_LINE % r"(?P<si> +)- +" + "(?:" + _FLOW_LINE % r"(?P=si)- +" + ")*")
_ENTRY_RUN = re.compile(_FLOW_LINE % f"(?P<mi> +)[{_CHAR}]+: +"
                        + "(?:" + _FLOW_LINE % f"(?P=mi)[{_CHAR}]+: +" + ")*")
_ITEM = re.compile(r"^ +- +(.*)$", re.M)
_ENTRY = re.compile(f"^ +([{_CHAR}]+): +(.*)$", re.M)


class NotMine(Exception):
    """The file is outside the subset: the full parser must read it."""


def _json_scalar(value) -> str:
    """A typed scalar as JSON text that decodes to the same Python value."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    if type(value) is float:
        if math.isnan(value):
            return "NaN"
        return repr(value) if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")
    if type(value) is str:
        return f'"{value}"'
    raise NotMine          # a timestamp, or anything JSON cannot carry


class FlowReader:
    """Turns one text into (data, FlatLines), or raises NotMine. `resolve(text)` gives a plain
    scalar's value exactly as PyYAML would; `typed_first`, when given, holds every character a
    scalar that is not a string can start with (the keys of PyYAML's implicit resolvers), so
    that a name starting with any other is known to be a string without asking `resolve`."""

    def __init__(self, resolve, typed_first: frozenset | None = None):
        self._resolve = resolve
        self._typed_first = typed_first
        self._json: dict[str, str] = {}     # plain scalar -> its JSON text, kept across files
        self._decoder = json.JSONDecoder(object_pairs_hook=_unique_pairs)

    def scalar(self, token: str):
        if not token.strip("-+."):
            raise NotMine        # a lone indicator character: leave it to the full parser
        if self._typed_first is not None and token[0] not in self._typed_first:
            return token         # a string: no resolver claims its first character
        return self._resolve(token)

    def read(self, text: str):
        if not (text.isascii() and text.replace("\n", "").isprintable()):
            raise NotMine        # only printable ASCII and newlines
        state = _ReadState()
        pos, end, number = 0, len(text), 1
        while pos < end:
            if state.block is not None:            # a run of flow lines, taken in one step
                run = _ITEM_RUN.match(text, pos)
                if run is not None or (run := _ENTRY_RUN.match(text, pos)) is not None:
                    self._run(state, run, number)
                    number += run.group().count("\n")
                    pos = run.end()
                    continue
            cut = text.find("\n", pos)
            if cut < 0:
                cut = end
            self._line(state, text[pos:cut], number)
            pos, number = cut + 1, number + 1
        if state.root_line is None:
            raise NotMine
        self._decode(state.flows)
        return state.top, FlatLines(state.top, state.shallow, state.root_line)

    def _line(self, state: "_ReadState", line: str, number: int) -> None:
        cut = line.find(" #")
        if cut >= 0:
            line = line[:cut]
        elif line.lstrip().startswith("#"):
            return
        line = line.rstrip(" ")
        if not line:
            return
        if len(line) > MAX_LINE:
            raise NotMine
        match = _BLOCK_LINE.fullmatch(line)
        if match is None:
            raise NotMine
        indent, marker, key, rest = match.groups()
        if not indent:                               # a top-level key
            if key is None:
                raise NotMine
            key = self._key(key)
            if key in state.top:
                raise NotMine
            if state.root_line is None:
                state.root_line = number
            state.shallow[(key,)] = number
            state.block = None
            if rest:
                self._value(state.top, key, rest, state.flows)
            else:
                state.top[key] = None
                state.block = [None, None, state.top, key]
            return
        container, parent = state.enter(len(indent), key is None)
        if not rest:
            raise NotMine
        if key is None:
            state.shallow[(parent, len(container))] = number
            container.append(None)
            self._value(container, len(container) - 1, rest, state.flows)
        else:
            key = self._key(key)
            if key in container:
                raise NotMine
            state.shallow[(parent, key)] = number
            self._value(container, key, rest, state.flows)

    def _run(self, state: "_ReadState", run, number: int) -> None:
        """Lines `number`, `number + 1`, ... each hold one flow: the same as `_line` on each,
        with the per-line work done by C loops (regex, zip, dict.update)."""
        items = run.re is _ITEM_RUN
        container, parent = state.enter(len(run.group("si" if items else "mi")), items)
        if items:
            values = _ITEM.findall(run.group())
            first = len(container)
            keys = range(first, first + len(values))
            container.extend(repeat(None, len(values)))
        else:
            pairs = _ENTRY.findall(run.group())
            keys = [key for key, _ in pairs]
            values = [value for _, value in pairs]
            for key in keys:
                self._key(key)                       # each must read as a string
            if len(set(keys)) != len(keys) or not container.keys().isdisjoint(keys):
                raise NotMine                        # a duplicate key
            container.update(zip(keys, repeat(None)))
        _check_flows(values)
        state.shallow.update(zip(zip(repeat(parent), keys), range(number, number + len(values))))
        state.flows.extend(zip(repeat(container), keys, values))

    def _learn(self, tokens: set) -> None:
        """The JSON text of scalars met for the first time: a string for each that starts with
        a character no resolver claims (written by C loops: most are a big graph's names), the
        resolver's value for the others."""
        typed = self._typed_first
        asked = list(tokens) if typed is None else [t for t in tokens if t[0] in typed]
        if typed is not None:
            strings = tokens.difference(asked)
            self._json.update(zip(strings, map('"{}"'.format, strings)))
        for token in asked:
            self._json[token] = _json_scalar(self.scalar(token))

    def _key(self, token: str) -> str:
        key = self.scalar(token)
        if type(key) is not str:
            raise NotMine
        return key

    def _value(self, container, key, rest: str, flows: list) -> None:
        if rest[0] in "[{":
            _check_flows([rest])
            container[key] = None
            flows.append((container, key, rest))
        elif _TOKEN.fullmatch(rest):
            container[key] = self.scalar(rest)
        else:
            raise NotMine

    def _decode(self, flows: list) -> None:
        """Every flow collection in one JSON text, `[[flow 1], [flow 2], ...]`: scalars typed
        through the cache (a dict lookup each, in C), then one C decode. Each flow's brackets
        balance, so the text decodes to one list per flow, each of one value, exactly when every
        flow is one whole JSON value; anything else is not ours."""
        if not flows:
            return
        parts = _SPLIT.split("],[".join(flow for _, _, flow in flows))
        separators = parts[0::2]
        if not all(map(_SEPARATOR.fullmatch, set(separators))):
            raise NotMine
        tokens = parts[1::2]
        if len(self._json) > MAX_CACHED:
            self._json.clear()
        self._learn(set(tokens).difference(self._json))
        parts[1::2] = map(self._json.__getitem__, tokens)
        try:
            values = self._decoder.decode("[[" + "".join(parts) + "]]")
        except (ValueError, RecursionError):
            raise NotMine from None
        if len(values) != len(flows) or set(map(len, values)) != {1}:
            raise NotMine
        for (container, key, _), (value,) in zip(flows, values):
            container[key] = value


def _check_flows(flows: list[str]) -> None:
    """Each flow collection's brackets must balance on its line (so that joined with the others
    it cannot swallow its neighbour) and open at most MAX_FLOW_OPENS (counted in C loops)."""
    opens = list(map(add, map(str.count, flows, repeat("[")), map(str.count, flows, repeat("{"))))
    closes = list(map(add, map(str.count, flows, repeat("]")), map(str.count, flows, repeat("}"))))
    if opens != closes or max(opens, default=0) > MAX_FLOW_OPENS:
        raise NotMine


class _ReadState:
    """What `read` builds as it goes: the data, the lines of block-level keys and items, the
    flows still to decode, and the open second-level block."""

    def __init__(self):
        self.top: dict = {}
        self.shallow: dict = {}
        self.root_line: int | None = None
        self.flows: list = []        # (container, key, flow text)
        self.block: list | None = None   # [indent, is a list, container, key]

    def enter(self, width: int, items: bool):
        """The open block's container for a line at `width` holding an item (or an entry),
        made on its first line; lines of one block share one indent and one kind."""
        block = self.block
        if block is None:
            raise NotMine            # deeper than one block level, or a continuation
        if block[0] is None:
            block[0], block[1] = width, items
            block[2][block[3]] = [] if items else {}
            block[2] = block[2][block[3]]
        elif block[0] != width or block[1] != items:
            raise NotMine
        return block[2], block[3]


def _unique_pairs(pairs: list) -> dict:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        raise NotMine            # a duplicate key: the full parser names it and its line
    return mapping
