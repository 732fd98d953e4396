"""Graph files (SPEC.md section 1): YAML -> Graph, every error with its file and line.

Reading the YAML itself is `yamlfile.py`'s; the backends list is `backends/parse.py`'s.
"""

from __future__ import annotations

import math
from pathlib import Path

import ggmlrun.core.ir.ops  # noqa: F401  (registers every op: nodes are checked)
from ggmlrun.core.frontend.backends_file import load_backends, parse_backends, parse_size  # noqa: F401
from ggmlrun.core.frontend.data import FLOAT_ONLY_INITS, INIT_KEYS, REQUIRED, check_npy
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.util.fmt import all_plain_ints, exact_key, shape_text
from ggmlrun.core.util.gcpause import gc_paused
from ggmlrun.core.ir.graph import MAX_DIMS, Graph, LeafData, Tensor
from ggmlrun.core.ir.types import PLAIN, ggml_type
from ggmlrun.core.ir.ops import OPS, make_node
from ggmlrun.core.util.numbers import INT64_MAX, INT64_MIN, checked_int
from ggmlrun.core.frontend.yamlfile import (
    check_name,
    describe_value,
    is_int,
    is_number,
    named_entry,
    read_yaml,
    shown,  # noqa: F401
    unknown_keys,
)

MAX_TENSOR_BYTES = 2**40          # 1 TiB per tensor: far past any real weight, guards typos
MAX_VALUES = 2**20                # inline values: bigger data belongs in a .npy (and YAML
                                  # aliases could otherwise make a tiny file expand to billions)
MAX_SEED = 2**64 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

TOP_KEYS = ("name", "seed", "backends", "tensors", "nodes", "outputs")
TENSOR_KEYS = ("shape", "dtype", "role", "backend", "init", "values", "file")
ALL_INIT_KEYS = tuple(dict.fromkeys(k for keys in INIT_KEYS.values() for k in keys))
NODE_KEYS = ("name", "op", "src", "params", "backend")
NODE_KEYSET = frozenset(NODE_KEYS)
TENSOR_KEYSET = frozenset(TENSOR_KEYS + ALL_INIT_KEYS)
ROLES = ("weight", "input")
OWN_DATA = ("values", "file")   # a leaf spec whose data is its own: never shared (see _twin)


# --- graph files ----------------------------------------------------------------------------
def load_graph(path) -> Graph:
    """Read and check a graph file; every node is built (shapes inferred) on the way. Without
    the cyclic GC: the many small objects of a big file form no cycles, and the full
    collections they trigger re-scan every tensor built so far (a third of the time at 100k)."""
    with gc_paused():
        return _load_graph(path)


def _load_graph(path) -> Graph:
    data, doc = read_yaml(path)
    if not isinstance(data, dict):
        raise doc.error(f"a graph file is a mapping with tensors: and nodes:, got {describe_value(data)}")
    unknown_keys(doc, data, TOP_KEYS, (), None, "top-level key")

    name = data.get("name", Path(path).stem)
    if not isinstance(name, str) or not name.strip() or "\n" in name:
        raise doc.error(f"name must be a one-line string, got {describe_value(name)}", ("name",))
    seed = data.get("seed", 0)
    if not is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise doc.error(f"seed must be an integer from 0 to 2**64-1, got {describe_value(seed)}",
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
                        f"{describe_value(tensors)}", ("tensors",))
    if not tensors:
        raise doc.error("tensors is empty; a graph needs at least one leaf", ("tensors",))
    leafs = []
    alike: dict = {}      # exact_key of a spec -> the first tensor parsed from it
    for name, spec in tensors.items():
        check_name(doc, name, ("tensors", name), None, "tensor name")
        key = exact_key(spec) if type(spec) is dict and spec.keys().isdisjoint(OWN_DATA) else None
        twin = alike.get(key) if key is not None else None
        if twin is not None:
            leafs.append(_twin(twin, name, doc.line(("tensors", name))))
            continue
        tensor = _parse_tensor(doc, name, spec, yaml_dir)
        if key is not None:
            alike[key] = tensor
        leafs.append(tensor)
    return leafs


def _twin(tensor: Tensor, name: str, line: int | None) -> Tensor:
    """A leaf whose spec is exactly another's (a big model repeats a few per layer): it passed
    the same checks, so it is that leaf under another name, with its own init keys."""
    return Tensor(name=name, shape=tensor.shape, dtype=tensor.dtype, role=tensor.role,
                  backend=tensor.backend, line=line,
                  data=LeafData(init=tensor.data.init, keys=dict(tensor.data.keys)))


def _parse_tensor(doc, name: str, spec, yaml_dir: Path) -> Tensor:
    path = ("tensors", name)
    culprit = f"tensor '{name}'"

    def fail(message, *key):
        return doc.error(message, path + key, culprit)

    if not isinstance(spec, dict):
        raise fail(f"expected a mapping like {{shape: [4, 8]}}, got {describe_value(spec)}")
    if not spec.keys() <= TENSOR_KEYSET:
        unknown_keys(doc, spec, TENSOR_KEYS + ALL_INIT_KEYS, path, culprit)

    dtype = spec.get("dtype", "f32")
    if not isinstance(dtype, str) or dtype not in PLAIN:
        raise fail(f"unknown dtype {shown(dtype)}; known: {', '.join(PLAIN)}", "dtype")
    shape = _parse_shape(doc, spec, dtype, path, culprit)
    role = spec.get("role", "weight")
    if not isinstance(role, str) or role not in ROLES:
        raise fail(f"unknown role {shown(role)}; known: {', '.join(ROLES)}", "role")
    backend = spec.get("backend")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise fail(f"backend must be a backend's name, got {describe_value(backend)}", "backend")

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
            raise fail(f"file must be a path to a .npy file, got {describe_value(file)}", "file")
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
                        f"got {describe_value(shape)}", where, culprit)
    if not 1 <= len(shape) <= MAX_DIMS:
        raise doc.error(f"shape has {len(shape)} dimensions; ggml tensors have 1 to "
                        f"{MAX_DIMS}", where, culprit)
    plain = all_plain_ints(shape) and min(shape) >= 1
    for i, dim in enumerate(() if plain else shape):
        if not is_int(dim):
            raise doc.error(f"shape[{i}] must be an integer, got {describe_value(dim)}",
                            where + (i,), culprit)
        if dim < 1:
            raise doc.error(f"shape[{i}] is {dim}; every dimension must be >= 1",
                            where + (i,), culprit)
    nbytes = ggml_type(dtype).contiguous_bytes(shape)
    if nbytes > MAX_TENSOR_BYTES:
        raise doc.error(f"shape {shape_text(shape)} {dtype} is {nbytes} bytes, over the "
                        f"limit of {MAX_TENSOR_BYTES} (1 TiB) per tensor", where, culprit)
    return tuple(shape)


def _check_param_numbers(doc, key, value, path, culprit) -> None:
    """Integers in params must fit int64 (ggml's int64_t fields): 2**70 is a typo, and would
    otherwise surface as an OverflowError inside NumPy. `path` is the node's; the param's own
    is built only for an error."""
    if type(value) is list and all_plain_ints(value) and (
            not value or INT64_MIN <= min(value) and max(value) <= INT64_MAX):
        return                       # a flat list of ints in range (shapes, axes), checked in C
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is int and INT64_MIN <= item <= INT64_MAX:
            continue                 # the common case, decided without a call
        if isinstance(item, list):
            stack.extend(item)
        elif is_int(item):
            try:
                checked_int(item, f"param '{key}'")
            except ValueError as err:
                raise doc.error(str(err), path + ("params", key), culprit) from None


def _parse_init(doc, spec, init, shape, dtype, path, culprit) -> dict:
    """Check an init's keys and fill in their defaults (the data depends on the full set)."""
    where = path + ("init",)
    if not isinstance(init, str) or init not in INIT_KEYS:
        raise doc.error(f"unknown init {shown(init)}; {did_you_mean(str(init), INIT_KEYS)}",
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
        if want_int and not is_int(value):
            raise doc.error(f"'{key}' must be an integer here, got {describe_value(value)}", at, culprit)
        if not is_number(value):
            raise doc.error(f"'{key}' must be a number, got {describe_value(value)}", at, culprit)
        if is_int(value):
            try:
                checked_int(value, f"'{key}'")
            except ValueError as err:
                raise doc.error(str(err), at, culprit) from None
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
                if not is_int(item):
                    raise doc.error(f"{label} must be an integer (the tensor is i32), got "
                                    f"{describe_value(item)}", at, culprit)
                if not I32_MIN <= item <= I32_MAX:
                    raise doc.error(f"{label} = {item} does not fit i32", at, culprit)
            elif not is_number(item):
                raise doc.error(f"{label} must be a number, got {describe_value(item)}", at, culprit)
            return
        if not isinstance(item, list):
            raise doc.error(f"values do not match shape {shape_text(shape)}: {label} should "
                            f"be a list of {shape[depth]}, got {describe_value(item)}", at, culprit)
        if len(item) != shape[depth]:
            raise doc.error(f"values do not match shape {shape_text(shape)}: {label} has "
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
                        f"{describe_value(nodes_data)}", ("nodes",))
    defined: dict[str, Tensor] = dict(leafs)
    nodes = []
    for i, item in enumerate(nodes_data):
        node = _parse_node(doc, item, i, defined, nodes_data)
        defined[node.name] = node
        nodes.append(node)
    return nodes


def _parse_node(doc, item, i, defined, nodes_data) -> Tensor:
    path = ("nodes", i)
    name, culprit = named_entry(doc, item, path, "node", "{name, op, src}", NODE_KEYSET)
    if name in defined:
        other = defined[name]
        kind = "tensor" if other.is_leaf else "node"
        raise doc.error(f"name '{name}' is already used by a {kind} (line {other.line}); "
                        "names are unique across tensors and nodes", path + ("name",), culprit)

    op = item.get("op")
    if op is None:
        raise doc.error(f"missing 'op'; {did_you_mean('', OPS)}", path, culprit)
    if not isinstance(op, str):
        raise doc.error(f"op must be an op's name, got {describe_value(op)}", path + ("op",), culprit)

    src_names = item.get("src", [])
    if not isinstance(src_names, list):
        hint = f"; write src: [{src_names}]" if isinstance(src_names, str) else ""
        raise doc.error(f"src must be a list of names, got {describe_value(src_names)}{hint}",
                        path + ("src",), culprit)
    try:                     # every source already defined (names are strings): the usual case
        srcs = [defined[src] for src in src_names]
    except (KeyError, TypeError):
        srcs = _sources(doc, src_names, name, path, culprit, defined, nodes_data)

    params = item.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise doc.error(f"params must be a mapping like {{eps: 1e-5}}, got {describe_value(params)}",
                        path + ("params",), culprit)
    for key, value in params.items():
        if not isinstance(key, str):
            raise doc.error(f"param names are strings, got {describe_value(key)}", path + ("params",),
                            culprit)
        _check_param_numbers(doc, key, value, path, culprit)

    backend = item.get("backend")
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise doc.error(f"backend must be a backend's name, got {describe_value(backend)}",
                        path + ("backend",), culprit)

    line = doc.line(path)
    try:
        return make_node(name, op, srcs, params, backend=backend, line=line)
    except InputError as err:
        raise _ne_order_hint(err, name, op, srcs, params).located(file=doc.file, line=line,
                                                                  culprit=culprit)
    except (TypeError, ValueError, ArithmeticError) as err:   # an op's rule met a bad value
        raise doc.error(f"{op}: bad params or sources: {err}", path, culprit) from err


def _sources(doc, src_names, name, path, culprit, defined, nodes_data) -> list[Tensor]:
    """A node's sources, each checked in turn: the first that is not a defined name is the
    error, and whether it is defined later (or is the node itself) changes the advice."""
    srcs = []
    for j, src in enumerate(src_names):
        at = path + ("src", j)
        if not isinstance(src, str):
            raise doc.error(f"src[{j}] must be a name, got {describe_value(src)}", at, culprit)
        if src in defined:
            srcs.append(defined[src])
            continue
        if src == name:
            raise doc.error("a node cannot use itself as a source", at, culprit)
        later = _first_defined_at(nodes_data, src)
        if later is not None:
            where = doc.line(("nodes", later))
            raise doc.error(f"src '{src}' is defined later (line {where}); a source must "
                            "be defined above the node that uses it", at, culprit)
        raise doc.error(f"src '{src}' is not defined; {did_you_mean(src, defined)}", at,
                        culprit)
    return srcs


def _first_defined_at(nodes_data: list, name: str) -> int | None:
    """The index of the first node named `name`, or None: looked for only to word an error."""
    return next((i for i, item in enumerate(nodes_data)
                 if isinstance(item, dict) and item.get("name") == name), None)


def _ne_order_hint(err: InputError, name, op, srcs, params) -> InputError:
    """The classic mistake, a leaf's shape written in ggml's ne order: when reversing one leaf's
    shape makes the node valid, say so."""
    for i, src in enumerate(srcs):
        if src.op is None and len(set(src.shape)) > 1:
            flipped = Tensor(name=src.name, shape=src.shape[::-1], dtype=src.dtype, role=src.role)
            try:
                make_node(name, op, srcs[:i] + [flipped] + srcs[i + 1:], params)
            except (InputError, TypeError, ValueError, ArithmeticError):
                continue
            err.message += (f"; shapes are NumPy order, the reverse of ggml's ne: did you mean "
                            f"shape {shape_text(flipped.shape)} for '{src.name}'?")
            break
    return err


def _parse_outputs(doc, data, leafs, nodes) -> list[Tensor]:
    if "outputs" not in data:
        return [nodes[-1]]
    names = data["outputs"]
    where = ("outputs",)
    if isinstance(names, str):
        raise doc.error(f"outputs must be a list of names; write outputs: [{names}]", where)
    if not isinstance(names, list) or not names:
        raise doc.error(f"outputs must be a non-empty list of names, got {describe_value(names)}; "
                        "leave it out to output the last node", where)
    by_name = {t.name: t for t in leafs + nodes}
    outputs = []
    for i, name in enumerate(names):
        at = where + (i,)
        if not isinstance(name, str):
            raise doc.error(f"outputs[{i}] must be a name, got {describe_value(name)}", at)
        if name not in by_name:
            raise doc.error(f"output '{name}' is not a tensor or node; "
                            f"{did_you_mean(name, by_name)}", at)
        if by_name[name] in outputs:
            raise doc.error(f"output '{name}' is listed twice", at)
        outputs.append(by_name[name])
    return outputs
