"""Graph and backends files (SPEC.md sections 1 and 3): the only module that reads YAML.

A file is parsed once into both its plain data and PyYAML's node tree; the node tree gives a
1-based line for every mapping key and list item, so each error points at its line:
``FILE:LINE: tensor 'w1': what is wrong; the fix or the alternatives``.

Nothing in a file is evaluated. The parser is a `SafeLoader` with one change: `1e-5` and
`50e12` read as floats (YAML 1.2 and every user expect that; PyYAML's YAML 1.1 rules read them
as strings, which would turn `eps: 1e-5` into a confusing type error). Duplicate mapping keys
are an error, where PyYAML would silently keep the last: two tensors called `w1` are a mistake.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml

import ggmlrun.core.ops  # noqa: F401  (registers every op: nodes and op lists are checked)
from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.data import FLOAT_ONLY_INITS, INIT_KEYS, REQUIRED, check_npy
from ggmlrun.core.errors import InputError, did_you_mean
from ggmlrun.core.graph import NP_DTYPES, MAX_DIMS, Graph, LeafData, Tensor
from ggmlrun.core.ops import OPS, make_node

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
MAX_TENSOR_BYTES = 2**40          # 1 TiB per tensor: far past any real weight, guards typos
MAX_VALUES = 2**20                # inline values: bigger data belongs in a .npy (and YAML
                                  # aliases could otherwise make a tiny file expand to billions)
MAX_SEED = 2**64 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1
INT64_MAX = 2**63 - 1

TOP_KEYS = ("name", "seed", "backends", "tensors", "nodes", "outputs")
TENSOR_KEYS = ("shape", "dtype", "role", "backend", "init", "values", "file")
ALL_INIT_KEYS = tuple(dict.fromkeys(k for keys in INIT_KEYS.values() for k in keys))
NODE_KEYS = ("name", "op", "src", "params", "backend")
ROLES = ("weight", "input")

BACKEND_KEYS = ("name", "kind", "memory", "alignment", "threads", "supports", "unsupported",
                "offload_min_batch", "flops", "mem_bw", "link_bw", "link_latency")
CPU_ONLY_KEYS = ("threads",)
SIM_ONLY_KEYS = ("supports", "unsupported", "offload_min_batch", "link_bw", "link_latency")
KINDS = ("cpu", "sim")
SIZE_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)\s*\Z")
MAX_ALIGNMENT = 2**30


# --- parsing --------------------------------------------------------------------------------
class _SafeLoader(yaml.SafeLoader):
    """SafeLoader, plus YAML 1.2 floats without a dot or an exponent sign (1e-5, 50e12)."""


class _FastSafeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The same on libyaml's C parser (several times faster on big graphs). Its composer
    recurses in C and crashes on absurdly deep nesting, so it is used only where `_shallow`
    bounds the depth; everything else goes through the Python parser, which fails cleanly."""


for _loader in (_SafeLoader, _FastSafeLoader):
    _loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"))

_QUOTED_OR_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\n]|\'\')*\'|(?:^|(?<=\s))#[^\n]*',
                                re.MULTILINE)
MAX_C_PARSER_DEPTH = 500


def _shallow(text: str) -> bool:
    """An upper bound on YAML nesting: deepest flow brackets plus deepest indentation."""
    indent = max((len(line) - len(line.lstrip(" ")) for line in text.splitlines()), default=0)
    if indent > MAX_C_PARSER_DEPTH:
        return False
    brackets = _NOT_BRACKET.sub("", _QUOTED_OR_COMMENT.sub("", text))
    depth = peak = 0
    for ch in brackets:
        depth += 1 if ch in "[{" else -1
        peak = max(peak, depth)
    return indent + peak <= MAX_C_PARSER_DEPTH


_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class _Doc:
    """One parsed file: where each key and item sits, and how to blame a part of it."""

    def __init__(self, file: str, lines: dict | None):
        self.file = file
        self.lines = lines or {}

    def line(self, path: tuple) -> int | None:
        """The line of `path`, or of its nearest ancestor the file has a line for."""
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def error(self, message: str, path: tuple = (), culprit: str | None = None) -> InputError:
        return InputError(" ".join(message.split()), file=self.file, line=self.line(path),
                          culprit=culprit)


def _read_yaml(path) -> tuple[object, _Doc]:
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("no such file", file=file) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a YAML file", file=file) from None
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text", file=file) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror or err}", file=file) from None
    loader = None
    try:
        parser = _FastSafeLoader if _shallow(text) else _SafeLoader
        loader = parser(text)           # the reader rejects control characters right here
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
    return data, _Doc(file, lines)


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
def _what(value) -> str:
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


def _shown(value) -> str:
    """A value named in 'unknown X' messages: strings as written, anything else described."""
    return f"'{value}'" if isinstance(value, str) else _what(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _unknown_keys(doc, mapping, allowed, path, culprit, what="key"):
    for key in mapping:
        if key not in allowed:
            raise doc.error(f"unknown {what} '{key}'; {did_you_mean(str(key), allowed)}",
                            path + (key,), culprit)


def _check_name(doc, name, path, culprit, what="name"):
    if not isinstance(name, str):
        hint = ("; YAML reads yes/no/on/off/true/false as booleans: quote the name"
                if isinstance(name, bool) else "")
        raise doc.error(f"{what} must be a string, got {_what(name)}{hint}", path, culprit)
    if "#" in name:
        raise doc.error(f"{what} '{name}' contains '#', which is reserved for the scheduler's "
                        "copies; rename it", path, culprit)
    if not NAME_RE.match(name):
        raise doc.error(f"{what} '{name}' is not a valid name; use letters, digits, '_', '.' "
                        "and '-', starting with a letter or '_'", path, culprit)


def _shape_text(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


# --- graph files ----------------------------------------------------------------------------
def load_graph(path) -> Graph:
    """Read and check a graph file; every node is built (shapes inferred) on the way."""
    data, doc = _read_yaml(path)
    if not isinstance(data, dict):
        raise doc.error(f"a graph file is a mapping with tensors: and nodes:, got {_what(data)}")
    _unknown_keys(doc, data, TOP_KEYS, (), None, "top-level key")

    name = data.get("name", Path(path).stem)
    if not isinstance(name, str) or not name.strip() or "\n" in name:
        raise doc.error(f"name must be a one-line string, got {_what(name)}", ("name",))
    seed = data.get("seed", 0)
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise doc.error(f"seed must be an integer from 0 to 2**64-1, got {_what(seed)}",
                        ("seed",))

    backends = None
    if "backends" in data:
        backends = parse_backends(data["backends"], doc.file, doc.lines, ("backends",))

    leafs = _parse_tensors(doc, data, Path(path).parent)
    nodes = _parse_nodes(doc, data, {t.name: t for t in leafs})
    outputs = _parse_outputs(doc, data, leafs, nodes)
    for out in outputs:
        out.is_output = True
    return Graph(name=name, leafs=leafs, nodes=nodes, outputs=outputs, seed=seed,
                 backends=backends, path=Path(path),
                 backends_line=doc.lines.get(("backends",)) if backends is not None else None)


def _parse_tensors(doc, data, yaml_dir: Path) -> list[Tensor]:
    if "tensors" not in data:
        raise doc.error("missing 'tensors': a graph needs its leafs, e.g. "
                        "tensors: {x: {shape: [4, 8], role: input}}")
    tensors = data["tensors"]
    if not isinstance(tensors, dict):
        raise doc.error(f"tensors must be a mapping of name -> {{shape: ...}}, got "
                        f"{_what(tensors)}", ("tensors",))
    if not tensors:
        raise doc.error("tensors is empty; a graph needs at least one leaf", ("tensors",))
    leafs = []
    for name, spec in tensors.items():
        _check_name(doc, name, ("tensors", name), None, "tensor name")
        leafs.append(_parse_tensor(doc, name, spec, yaml_dir))
    return leafs


def _parse_tensor(doc, name: str, spec, yaml_dir: Path) -> Tensor:
    path = ("tensors", name)
    culprit = f"tensor '{name}'"

    def fail(message, *key):
        return doc.error(message, path + key, culprit)

    if not isinstance(spec, dict):
        raise fail(f"expected a mapping like {{shape: [4, 8]}}, got {_what(spec)}")
    _unknown_keys(doc, spec, TENSOR_KEYS + ALL_INIT_KEYS, path, culprit)

    dtype = spec.get("dtype", "f32")
    if not isinstance(dtype, str) or dtype not in NP_DTYPES:
        raise fail(f"unknown dtype {_shown(dtype)}; known: {', '.join(NP_DTYPES)}", "dtype")
    shape = _parse_shape(doc, spec, dtype, path, culprit)
    role = spec.get("role", "weight")
    if not isinstance(role, str) or role not in ROLES:
        raise fail(f"unknown role {_shown(role)}; known: {', '.join(ROLES)}", "role")
    backend = spec.get("backend")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise fail(f"backend must be a backend's name, got {_what(backend)}", "backend")

    given = [k for k in ("init", "values", "file") if k in spec]
    if len(given) > 1:
        raise fail(f"give exactly one of init, values, file; got {' and '.join(given)}",
                   given[1])
    stray = [k for k in spec if k in ALL_INIT_KEYS]
    if given and given[0] != "init" and stray:
        raise fail(f"'{stray[0]}' is an init key, but the data comes from {given[0]}; "
                   "drop it", stray[0])

    if "values" in spec:
        data = LeafData(values=_parse_values(doc, spec["values"], shape, dtype, path, culprit))
    elif "file" in spec:
        file = spec["file"]
        if not isinstance(file, str) or not file:
            raise fail(f"file must be a path to a .npy file, got {_what(file)}", "file")
        full = yaml_dir / file
        try:
            check_npy(full, shape, dtype)
        except InputError as err:
            raise err.located(file=doc.file, line=doc.line(path + ("file",)), culprit=culprit)
        data = LeafData(file=full)
    else:
        init = spec.get("init", "zeros" if dtype == "i32" else "randn")
        data = LeafData(init=init, keys=_parse_init(doc, spec, init, shape, dtype, path,
                                                    culprit))
    return Tensor(name=name, shape=shape, dtype=dtype, role=role, backend=backend, data=data,
                  line=doc.line(path))


def _parse_shape(doc, spec, dtype, path, culprit) -> tuple[int, ...]:
    if "shape" not in spec:
        raise doc.error("missing 'shape', e.g. shape: [32, 512] (NumPy order)", path, culprit)
    shape = spec["shape"]
    where = path + ("shape",)
    if not isinstance(shape, list):
        raise doc.error(f"shape must be a list of 1 to {MAX_DIMS} integers like [32, 512], "
                        f"got {_what(shape)}", where, culprit)
    if not 1 <= len(shape) <= MAX_DIMS:
        raise doc.error(f"shape has {len(shape)} dimensions; ggml tensors have 1 to "
                        f"{MAX_DIMS}", where, culprit)
    for i, dim in enumerate(shape):
        if not _is_int(dim):
            raise doc.error(f"shape[{i}] must be an integer, got {_what(dim)}",
                            where + (i,), culprit)
        if dim < 1:
            raise doc.error(f"shape[{i}] is {dim}; every dimension must be >= 1",
                            where + (i,), culprit)
    nbytes = math.prod(shape) * NP_DTYPES[dtype].itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise doc.error(f"shape {_shape_text(shape)} {dtype} is {nbytes} bytes, over the "
                        f"limit of {MAX_TENSOR_BYTES} (1 TiB) per tensor", where, culprit)
    return tuple(shape)


def _parse_init(doc, spec, init, shape, dtype, path, culprit) -> dict:
    """Check an init's keys and fill in their defaults (the data depends on the full set)."""
    where = path + ("init",)
    if not isinstance(init, str) or init not in INIT_KEYS:
        raise doc.error(f"unknown init {_shown(init)}; {did_you_mean(str(init), INIT_KEYS)}",
                        where, culprit)
    if dtype == "i32" and init in FLOAT_ONLY_INITS:
        raise doc.error(f"init '{init}' makes fractions but the tensor is i32; use zeros, "
                        "ones, full, arange or randint", where, culprit)
    allowed = INIT_KEYS[init]
    for key in spec:
        if key in ALL_INIT_KEYS and key not in allowed:
            takes = f"takes {', '.join(allowed)}" if allowed else "takes no keys"
            hint = "" if "init" in spec else f" (init defaults to {init}; set init:)"
            raise doc.error(f"init '{init}' {takes}; not '{key}'{hint}", path + (key,),
                            culprit)
    keys = {}
    for key, default in allowed.items():
        if key not in spec:
            if default is REQUIRED:
                raise doc.error(f"init '{init}' needs '{key}'"
                                + (": values are drawn from [low, high)" if init == "randint"
                                   else ""), where, culprit)
            keys[key] = default
            continue
        value = spec[key]
        at = path + (key,)
        want_int = init == "randint" or (dtype == "i32" and init in ("full", "arange"))
        if want_int and not _is_int(value):
            raise doc.error(f"'{key}' must be an integer here, got {_what(value)}", at, culprit)
        if not _is_number(value):
            raise doc.error(f"'{key}' must be a number, got {_what(value)}", at, culprit)
        if not math.isfinite(value) and not (init == "full" and dtype != "i32"):
            raise doc.error(f"'{key}' must be finite, got {value}", at, culprit)
        keys[key] = value
    return _normalize_init(doc, init, keys, shape, dtype, path, culprit)


def _normalize_init(doc, init, keys, shape, dtype, path, culprit) -> dict:
    """Range checks, and one spelling per value (1 and 1.0 give the same float data)."""
    if init == "randint":
        low, high = keys["low"], keys["high"]
        lo_lim, hi_lim = (I32_MIN, I32_MAX + 1) if dtype == "i32" else (-INT64_MAX, INT64_MAX)
        if not high > low:
            raise doc.error(f"randint needs high > low, got low={low} high={high}",
                            path + ("high",), culprit)
        if low < lo_lim or high > hi_lim:
            raise doc.error(f"randint range [{low}, {high}) does not fit {dtype}",
                            path + ("high",), culprit)
        return keys
    if init == "uniform" and not keys["high"] > keys["low"]:
        raise doc.error(f"uniform needs high > low, got low={keys['low']} high={keys['high']}",
                        path + ("high",), culprit)
    if dtype == "i32":
        if init == "full" and not I32_MIN <= keys["value"] <= I32_MAX:
            raise doc.error(f"value {keys['value']} does not fit i32", path + ("value",),
                            culprit)
        if init == "arange":
            last = keys["start"] + keys["step"] * (math.prod(shape) - 1)
            if not (I32_MIN <= keys["start"] <= I32_MAX and I32_MIN <= last <= I32_MAX):
                raise doc.error(f"arange reaches {last}, which does not fit i32",
                                path + ("step",), culprit)
        return keys
    return {k: float(v) for k, v in keys.items()}


def _parse_values(doc, values, shape, dtype, path, culprit) -> list:
    """A nested list exactly matching the shape; i32 values must be integers in range."""
    where = path + ("values",)
    if math.prod(shape) > MAX_VALUES:
        raise doc.error(f"values for {math.prod(shape)} elements; inline values are for up to "
                        f"{MAX_VALUES}: save bigger data with np.save and use file:", where,
                        culprit)

    def walk(item, depth, index):
        label = "values" + "".join(f"[{i}]" for i in index)
        at = where + tuple(index)
        if depth == len(shape):
            if dtype == "i32":
                if not _is_int(item):
                    raise doc.error(f"{label} must be an integer (the tensor is i32), got "
                                    f"{_what(item)}", at, culprit)
                if not I32_MIN <= item <= I32_MAX:
                    raise doc.error(f"{label} = {item} does not fit i32", at, culprit)
            elif not _is_number(item):
                raise doc.error(f"{label} must be a number, got {_what(item)}", at, culprit)
            return
        if not isinstance(item, list):
            raise doc.error(f"values do not match shape {_shape_text(shape)}: {label} should "
                            f"be a list of {shape[depth]}, got {_what(item)}", at, culprit)
        if len(item) != shape[depth]:
            raise doc.error(f"values do not match shape {_shape_text(shape)}: {label} has "
                            f"{len(item)} items, expected {shape[depth]}", at, culprit)
        for i, sub in enumerate(item):
            walk(sub, depth + 1, index + [i])

    walk(values, 0, [])
    return values


def _parse_nodes(doc, data, leafs: dict[str, Tensor]) -> list[Tensor]:
    nodes_data = data.get("nodes")
    if nodes_data is None or nodes_data == []:
        raise doc.error("the graph has no nodes; add nodes: [{name: y, op: add, src: [a, b]}]",
                        ("nodes",))
    if not isinstance(nodes_data, list):
        raise doc.error(f"nodes must be a list of {{name, op, src}}, in execution order; got "
                        f"{_what(nodes_data)}", ("nodes",))
    # where each node name is defined, to tell "defined later" from "undefined"
    later = {}
    for i, item in enumerate(nodes_data):
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            later.setdefault(item["name"], doc.line(("nodes", i)))

    defined: dict[str, Tensor] = dict(leafs)
    nodes = []
    for i, item in enumerate(nodes_data):
        node = _parse_node(doc, item, i, defined, later)
        defined[node.name] = node
        nodes.append(node)
    return nodes


def _named_entry(doc, item, path: tuple, what: str, form: str, allowed) -> tuple[str, str]:
    """A list item that must be a mapping with a valid `name` and known keys: (name, culprit)."""
    where = f"{path[0]}[{path[-1]}]"
    if not isinstance(item, dict):
        raise doc.error(f"a {what} is a mapping {form}, got {_what(item)}", path, where)
    if "name" not in item:
        raise doc.error("missing 'name'", path, where)
    name = item["name"]
    _check_name(doc, name, path + ("name",), where, f"{what} name")
    culprit = f"{what} '{name}'"
    _unknown_keys(doc, item, allowed, path, culprit)
    return name, culprit


def _parse_node(doc, item, i, defined, later) -> Tensor:
    path = ("nodes", i)
    name, culprit = _named_entry(doc, item, path, "node", "{name, op, src}", NODE_KEYS)
    if name in defined:
        other = defined[name]
        kind = "tensor" if other.is_leaf else "node"
        raise doc.error(f"name '{name}' is already used by a {kind} (line {other.line}); "
                        "names are unique across tensors and nodes", path + ("name",), culprit)

    op = item.get("op")
    if op is None:
        raise doc.error(f"missing 'op'; {did_you_mean('', OPS)}", path, culprit)
    if not isinstance(op, str):
        raise doc.error(f"op must be an op's name, got {_what(op)}", path + ("op",), culprit)

    src_names = item.get("src", [])
    if not isinstance(src_names, list):
        hint = f"; write src: [{src_names}]" if isinstance(src_names, str) else ""
        raise doc.error(f"src must be a list of names, got {_what(src_names)}{hint}",
                        path + ("src",), culprit)
    srcs = []
    for j, src in enumerate(src_names):
        at = path + ("src", j)
        if not isinstance(src, str):
            raise doc.error(f"src[{j}] must be a name, got {_what(src)}", at, culprit)
        if src in defined:
            srcs.append(defined[src])
        elif src == name:
            raise doc.error("a node cannot use itself as a source", at, culprit)
        elif src in later:
            raise doc.error(f"src '{src}' is defined later (line {later[src]}); a source must "
                            "be defined above the node that uses it", at, culprit)
        else:
            raise doc.error(f"src '{src}' is not defined; {did_you_mean(src, defined)}", at,
                            culprit)

    params = item.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise doc.error(f"params must be a mapping like {{eps: 1e-5}}, got {_what(params)}",
                        path + ("params",), culprit)
    for key in params:
        if not isinstance(key, str):
            raise doc.error(f"param names are strings, got {_what(key)}", path + ("params",),
                            culprit)

    backend = item.get("backend")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise doc.error(f"backend must be a backend's name, got {_what(backend)}",
                        path + ("backend",), culprit)

    line = doc.line(path)
    try:
        return make_node(name, op, srcs, params, backend=backend, line=line)
    except InputError as err:
        raise err.located(file=doc.file, line=line, culprit=culprit)
    except (TypeError, ValueError, ArithmeticError) as err:   # an op's rule met a bad value
        raise doc.error(f"{op}: bad params or sources: {err}", path, culprit) from err


def _parse_outputs(doc, data, leafs, nodes) -> list[Tensor]:
    if "outputs" not in data:
        return [nodes[-1]]
    names = data["outputs"]
    where = ("outputs",)
    if isinstance(names, str):
        raise doc.error(f"outputs must be a list of names; write outputs: [{names}]", where)
    if not isinstance(names, list) or not names:
        raise doc.error(f"outputs must be a non-empty list of names, got {_what(names)}; "
                        "leave it out to output the last node", where)
    by_name = {t.name: t for t in leafs + nodes}
    outputs = []
    for i, name in enumerate(names):
        at = where + (i,)
        if not isinstance(name, str):
            raise doc.error(f"outputs[{i}] must be a name, got {_what(name)}", at)
        if name not in by_name:
            raise doc.error(f"output '{name}' is not a tensor or node; "
                            f"{did_you_mean(name, by_name)}", at)
        if by_name[name] in outputs:
            raise doc.error(f"output '{name}' is listed twice", at)
        outputs.append(by_name[name])
    return outputs


# --- backends -------------------------------------------------------------------------------
def load_backends(path) -> list[BackendSpec]:
    """Read a `--backends` file: a mapping whose one key, `backends`, holds the list."""
    data, doc = _read_yaml(path)
    if isinstance(data, list):
        raise doc.error("a backends file is a mapping; put the list under 'backends:'")
    if not isinstance(data, dict):
        raise doc.error(f"a backends file holds 'backends:' and a list, got {_what(data)}")
    _unknown_keys(doc, data, ("backends",), (), None, "top-level key")
    if "backends" not in data:
        raise doc.error("missing 'backends:'")
    return parse_backends(data["backends"], doc.file, doc.lines, ("backends",))


def parse_backends(data, file: str, lines: dict | None = None,
                   path: tuple = ("backends",)) -> list[BackendSpec]:
    """Check a backends list; `lines` maps key paths (as tuples from the file's root) to lines.

    One `cpu` backend, and it is last: the scheduler's fallback for every op (ggml's rule
    that the last backend is the CPU).
    """
    doc = _Doc(file, lines)
    if not isinstance(data, list):
        raise doc.error(f"backends must be a list of {{name, kind}}, got {_what(data)}", path)
    if not data:
        raise doc.error("backends is empty; the list must end with a cpu backend, e.g. "
                        "[{name: CPU, kind: cpu}]", path)
    specs: list[BackendSpec] = []
    for i, item in enumerate(data):
        spec = _parse_backend(doc, item, path + (i,), i)
        if any(s.name == spec.name for s in specs):
            raise doc.error(f"backend name '{spec.name}' is used twice", path + (i, "name"),
                            f"backend '{spec.name}'")
        specs.append(spec)
    last = specs[-1]
    if last.kind != "cpu":
        raise doc.error(f"the last backend must be of kind cpu (the fallback that runs every "
                        f"op), got {last.kind}; end the list with {{name: CPU, kind: cpu}}",
                        path + (len(specs) - 1,), f"backend '{last.name}'")
    for i, spec in enumerate(specs[:-1]):
        if spec.kind == "cpu":
            raise doc.error("only the last backend may be of kind cpu; remove this one or "
                            "move it last", path + (i,), f"backend '{spec.name}'")
    return specs


def _parse_backend(doc, item, path, i) -> BackendSpec:
    name, culprit = _named_entry(doc, item, path, "backend", "{name, kind}", BACKEND_KEYS)
    kind = item.get("kind")
    if kind is None:
        raise doc.error(f"missing 'kind'; known: {', '.join(KINDS)}", path, culprit)
    if not isinstance(kind, str) or kind not in KINDS:
        raise doc.error(f"unknown kind {_shown(kind)}; known: {', '.join(KINDS)}",
                        path + ("kind",), culprit)
    wrong = SIM_ONLY_KEYS if kind == "cpu" else CPU_ONLY_KEYS
    for key in item:
        if key in wrong:
            other = "sim" if kind == "cpu" else "cpu"
            raise doc.error(f"'{key}' applies to {other} backends only", path + (key,),
                            culprit)

    def at(key):
        return path + (key,)

    spec = BackendSpec.of_kind(name, kind, line=doc.line(path))
    if "memory" in item:
        try:
            spec.memory = parse_size(item["memory"])
        except ValueError as err:
            raise doc.error(f"memory: {err}", at("memory"), culprit) from None
    if "alignment" in item:
        value = item["alignment"]
        if not _is_int(value) or value < 1 or value & (value - 1) or value > MAX_ALIGNMENT:
            raise doc.error(f"alignment must be a power of two from 1 to 2**30, got "
                            f"{_what(value)}", at("alignment"), culprit)
        spec.alignment = value
    for key in ("threads", "offload_min_batch"):
        if key in item:
            value = item[key]
            if not _is_int(value) or value < 1:
                raise doc.error(f"{key} must be an integer >= 1, got {_what(value)}", at(key),
                                culprit)
            setattr(spec, key, value)
    if "supports" in item and "unsupported" in item:
        raise doc.error("give supports or unsupported, not both", at("unsupported"), culprit)
    for key in ("supports", "unsupported"):
        if key in item:
            setattr(spec, key, frozenset(_parse_op_list(doc, item[key], at(key), culprit, key)))
    for key in ("flops", "mem_bw", "link_bw", "link_latency"):
        if key in item:
            value = _number(item[key])
            ok = value is not None and math.isfinite(value) and (
                value >= 0 if key == "link_latency" else value > 0)
            bound = ">= 0" if key == "link_latency" else "> 0"
            if not ok:
                raise doc.error(f"{key} must be a number {bound} (like 50e12), got "
                                f"{_what(item[key])}", at(key), culprit)
            setattr(spec, key, float(value))
    return spec


def _parse_op_list(doc, ops, where, culprit, key) -> list[str]:
    if not isinstance(ops, list):
        raise doc.error(f"{key} must be a list of op names like [argmax, get_rows], got "
                        f"{_what(ops)}", where, culprit)
    for j, op in enumerate(ops):
        if not isinstance(op, str) or op not in OPS:
            raise doc.error(f"{key}: unknown op {_shown(op)}; {did_you_mean(str(op), OPS)}",
                            where + (j,), culprit)
    return ops


def _number(value) -> float | None:
    """A positive-number field: a YAML number, or a string a float() reads ('50e12')."""
    if _is_number(value):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace("_", ""))
        except ValueError:
            return None
    return None


def parse_size(value) -> int:
    """Bytes from a number or a string: '8GiB', '512 MiB', '64KiB', '100B', '1.5GiB', '4096'.

    Binary units only (B, KiB, MiB, GiB, TiB; case-insensitive); 'GB' and friends are refused
    rather than guessed at, since users mean GiB as often as 10**9. Fractions round down.
    """
    if _is_number(value) and math.isfinite(value):
        if value < 1:
            raise ValueError(f"must be at least 1 byte, got {value}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected bytes as an integer or a string like '8GiB', got "
                         f"{_what(value)}")
    match = SIZE_RE.match(value)
    unit = match.group(2).lower() if match else ""
    if unit in ("k", "kb", "m", "mb", "g", "gb", "t", "tb"):
        raise ValueError(f"'{value}': use binary units KiB, MiB, GiB or TiB")
    if match is None or (unit and unit not in SIZE_UNITS):
        raise ValueError(f"cannot read '{value}' as a size; write bytes or e.g. '8GiB', "
                         "'512MiB', '64KiB'")
    size = int(float(match.group(1)) * SIZE_UNITS.get(unit, 1))
    if size < 1:
        raise ValueError(f"'{value}' is less than 1 byte")
    return size
