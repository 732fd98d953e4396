"""Reading YAML files: the only module that imports yaml. Data plus a line for every part.

A file is parsed once into both its plain data and PyYAML's node tree; the node tree gives a
1-based line for every mapping key and list item, so each error points at its line:
``FILE:LINE: tensor 'w1': what is wrong; the fix or the alternatives``.

Nothing in a file is evaluated. The parser is a `SafeLoader` with one change: `1e-5` and
`50e12` read as floats (YAML 1.2 and every user expect that; PyYAML's YAML 1.1 rules read them
as strings, which would turn `eps: 1e-5` into a confusing type error). Duplicate mapping keys
are an error, where PyYAML would silently keep the last: two tensors called `w1` are a mistake.
The small checks every section of a file shares live here too.
"""

from __future__ import annotations

import re

import yaml

from ggmlrun.core.frontend.yamlfast import FlowReader, NotMine
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.util.fmt import is_int, is_number  # noqa: F401  (the loaders import them from here)
from ggmlrun.core.util.inputs import read_text

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


class _SafeLoader(yaml.SafeLoader):
    """SafeLoader, plus YAML 1.2 floats without a dot or an exponent sign (1e-5, 50e12)."""


class _FastSafeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The same on libyaml's C parser (several times faster on big graphs). Its composer
    recurses in C and crashes on deep nesting, so `_check_events` bounds the depth first."""


for _loader in (_SafeLoader, _FastSafeLoader):
    _loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"))



def _checked(tag: str, construct):
    """PyYAML's scalar constructors raise a bare ValueError/KeyError on an explicit tag they
    cannot read (`!!int 3#no`, `!!bool maybe`, `!!timestamp 2020-13-45`): made a marked YAML
    error here, so it is one line with the line number (exit 2), never an internal error."""
    def checked(loader, node):
        try:
            return construct(loader, node)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            value = node.value if isinstance(node.value, str) else "?"
            shown_value = value if len(value) <= 40 else value[:37] + "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read '{shown_value}' as !!{tag}", node.start_mark) from None
    return checked


for _loader in (_SafeLoader, _FastSafeLoader):
    for _tag in ("int", "float", "bool", "timestamp", "null"):
        _full = f"tag:yaml.org,2002:{_tag}"
        _loader.add_constructor(_full, _checked(_tag, _loader.yaml_constructors[_full]))

PARSER = _FastSafeLoader          # the tests swap in the pure-Python one to compare
FAST = True                       # the tests turn the fast reader off to compare
_PLAIN_TAGS = {f"tag:yaml.org,2002:{kind}" for kind in ("str", "int", "float", "bool", "null")}
MAX_DEPTH = 64                  # graph files nest about 6 deep; 4-d `values:` lists add 4
MAX_ALIAS_NODES = 1_000_000     # nodes aliases (and `<<` merges) may add by expansion


def _check_events(text: str, file: str) -> None:
    """Walk the parser's event stream (libyaml's parser keeps its stack on the heap, so this
    cannot crash) and refuse, before anything is built, nesting deeper than MAX_DEPTH or
    aliases that would expand to more than MAX_ALIAS_NODES nodes ("billion laughs", merge-key
    bombs): each anchor's expanded size is counted as it closes, each alias adds it."""
    sizes: dict[str, int] = {}
    stack: list[list] = []          # per open collection: [nodes inside so far, anchor]
    added = 0
    loader = PARSER(text)
    try:
        while True:
            event = loader.get_event()
            if event is None or isinstance(event, yaml.StreamEndEvent):
                return
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise InputError(f"YAML nested more than {MAX_DEPTH} levels deep", file=file,
                                     line=event.start_mark.line + 1)
                stack.append([1, event.anchor])
                continue
            if isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                size, anchor = stack.pop()
            elif isinstance(event, yaml.AliasEvent):
                size, anchor = sizes.get(event.anchor, 1), None
                added += size
                if added > MAX_ALIAS_NODES:
                    raise InputError(f"YAML aliases expand to more than {MAX_ALIAS_NODES:,} "
                                     "nodes; write the data out instead of aliasing it",
                                     file=file, line=event.start_mark.line + 1)
            elif isinstance(event, yaml.ScalarEvent):
                size, anchor = 1, event.anchor
            else:
                continue
            if anchor is not None:
                sizes[anchor] = size
            if stack:
                stack[-1][0] += size
    finally:
        loader.dispose()


class Doc:
    """One parsed file: where each key and item sits, and how to blame a part of it."""

    def __init__(self, file: str, lines: dict | None):
        self.file = file
        self.lines = lines or {}

    def line(self, path: tuple) -> int | None:
        """The line of `path`, or of its nearest ancestor the file has a line for."""
        lines = self.lines
        while True:
            line = lines.get(path)
            if line is not None:
                return line
            if not path:
                return None
            path = path[:-1]

    def all_lines(self) -> dict:
        """Every recorded path and its line, as one dict (the fast reader keeps them compact)."""
        lines = self.lines
        return lines.as_dict() if hasattr(lines, "as_dict") else dict(lines)

    def error(self, message: str, path: tuple = (), culprit: str | None = None) -> InputError:
        return InputError(" ".join(message.split()), file=self.file, line=self.line(path),
                          culprit=culprit)


def _flow_reader() -> FlowReader:
    """yamlfast.py's reader, typing plain scalars with this module's resolver and constructor
    (it cannot import yaml itself). Made once: it caches each distinct scalar's type."""
    global _FLOW_READER
    if _FLOW_READER is None:
        constructor = _SafeLoader("")

        def resolve(text: str):
            tag = _SafeLoader.resolve(constructor, yaml.ScalarNode, text, (True, False))
            if tag not in _PLAIN_TAGS:
                raise NotMine       # timestamps, `<<`, `=`: the full parser's business
            return constructor.yaml_constructors[tag](constructor, yaml.ScalarNode(tag, text))

        resolvers = _SafeLoader.yaml_implicit_resolvers
        plain_only = None not in resolvers and not _SafeLoader.yaml_path_resolvers
        _FLOW_READER = FlowReader(resolve, frozenset(filter(None, resolvers)) if plain_only
                                  else None)
    return _FLOW_READER


_FLOW_READER = None


MAX_KEY = 1024            # PyYAML's limit on a simple key (its scanner stops looking past it)
_LONG_KEY = re.compile(r"[^\s{}\[\],:#'\"][^\s{}\[\],:]{%d,}\s*:" % MAX_KEY)


_KEPT: dict = {}       # one file's parse, kept for the next read_yaml of that same file


def _identity(path):
    import os

    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def keep_parsed(path, data, doc) -> None:
    """Hand a parse to the next read_yaml of the same, unchanged file (a GRAPH argument is
    parsed to tell a card from a graph file, then loaded as a graph: once, not twice)."""
    _KEPT.clear()
    key = _identity(path)
    if key is not None:
        _KEPT[key] = (data, doc)


def read_yaml(path) -> tuple[object, Doc]:
    if _KEPT:
        kept = _KEPT.pop(_identity(path), None)
        _KEPT.clear()
        if kept is not None:
            return kept
    file = str(path)
    text = read_text(path, "YAML file")
    if FAST:
        try:
            data, lines = _flow_reader().read(text)
            return data, Doc(file, lines)
        except NotMine:
            pass
    loader = None
    try:
        _check_events(text, file)
        loader = PARSER(text)
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
        lines: dict = {}
        if root is not None:
            _map_lines(loader, root, (), lines, set(), file)
    except yaml.MarkedYAMLError as err:
        syntax = isinstance(err, (yaml.scanner.ScannerError, yaml.parser.ParserError,
                                  yaml.composer.ComposerError))
        mark = err.problem_mark or err.context_mark
        what = " ".join(f"{err.problem or 'malformed YAML'}".split())
        if err.context:   # PyYAML's own order: "while parsing X (at line N), expected Y"
            start = err.context_mark
            at = f" at line {start.line + 1}" if start and start is not mark else ""
            what = f"{' '.join(err.context.split())}{at}, {what}"
        if mark and "\t" in "".join(text.splitlines()[mark.line:mark.line + 1]):
            what += " (a tab on that line: YAML indents with spaces only)"
        if syntax and mark and _LONG_KEY.search("".join(text.splitlines()[mark.line:mark.line + 1])):
            what = (f"a key longer than {MAX_KEY} characters on this line: YAML takes a "
                    f"plain key of at most {MAX_KEY} characters; shorten it")
        raise InputError(f"YAML {'syntax ' if syntax else ''}error: {what}", file=file,
                         line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as err:
        raise InputError(f"YAML error: {' '.join(str(err).split())}", file=file) from None
    except RecursionError:
        raise InputError("YAML nested too deeply", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()
    if data is None:
        raise InputError("the file is empty", file=file, line=1)
    return data, Doc(file, lines)


def _map_lines(loader, node, path, lines, seen, file):
    """Record the line of every mapping key and list item; refuse duplicate keys."""
    if id(node) in seen:         # an alias: already mapped where its anchor is
        return
    seen.add(id(node))
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = loader.construct_object(key_node)
            sub = path + (key,)
            line = key_node.start_mark.line + 1
            if sub in lines:
                raise InputError(f"duplicate key '{key}' (first at line {lines[sub]}); "
                                 "each key, and each tensor name, may appear once",
                                 file=file, line=line)
            lines[sub] = line
            _map_lines(loader, value_node, sub, lines, seen, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _map_lines(loader, item, path + (i,), lines, seen, file)


# --- small checks ---------------------------------------------------------------------------
def describe_value(value) -> str:
    """How a wrong value reads in a message."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string '{shown}'"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def shown(value) -> str:
    """A value named in 'unknown X' messages: strings as written, anything else described."""
    return f"'{value}'" if isinstance(value, str) else describe_value(value)




def unknown_keys(doc, mapping, allowed, path, culprit, what="key"):
    for key in mapping:
        if key not in allowed:
            raise doc.error(f"unknown {what} '{key}'; {did_you_mean(str(key), allowed)}",
                            path + (key,), culprit)


def check_name(doc, name, path, culprit, what="name"):
    if not isinstance(name, str):
        hint = ("; YAML reads yes/no/on/off/true/false as booleans: quote the name"
                if isinstance(name, bool) else "")
        raise doc.error(f"{what} must be a string, got {describe_value(name)}{hint}", path, culprit)
    if "#" in name:
        raise doc.error(f"{what} '{name}' contains '#', which is reserved for the scheduler's "
                        "copies; rename it", path, culprit)
    if not NAME_RE.match(name):
        raise doc.error(f"{what} '{name}' is not a valid name; use letters, digits, '_', '.' "
                        "and '-', starting with a letter or '_'", path, culprit)


def named_entry(doc, item, path: tuple, what: str, form: str, allowed) -> tuple[str, str]:
    """A list item that must be a mapping with a valid `name` and keys from the set `allowed`:
    (name, culprit)."""
    if type(item) is dict:   # the usual case first, with no message text built for it
        name = item.get("name")
        if type(name) is str and NAME_RE.match(name) and item.keys() <= allowed:
            return name, f"{what} '{name}'"
    where = f"{path[0]}[{path[-1]}]"
    if not isinstance(item, dict):
        raise doc.error(f"a {what} is a mapping {form}, got {describe_value(item)}", path, where)
    if "name" not in item:
        raise doc.error("missing 'name'", path, where)
    name = item["name"]
    check_name(doc, name, path + ("name",), where, f"{what} name")
    culprit = f"{what} '{name}'"
    unknown_keys(doc, item, allowed, path, culprit)
    return name, culprit
