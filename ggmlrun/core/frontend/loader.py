"""Graph files (SPEC.md section 1): YAML -> Graph, every error with its file and line.

Reading the YAML itself is `yamlfile.py`'s; the backends list is `backends_file.py`'s; the
leaves (`tensors:`) are `leaves.py`'s. Here: the top level, the nodes and the outputs.
"""

from __future__ import annotations

from pathlib import Path

import ggmlrun.core.ir.ops  # noqa: F401  (registers every op: nodes are checked)
from ggmlrun.core.frontend.backends_file import parse_backends
from ggmlrun.core.frontend.leaves import parse_tensors
from ggmlrun.core.frontend.yamlfile import (describe_value, is_int, named_entry, read_yaml,
                                            unknown_keys)
from ggmlrun.core.ir.graph import Graph, Tensor
from ggmlrun.core.ir.ops import OPS, make_node
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.util.fmt import all_plain_ints, shape_text
from ggmlrun.core.util.gcpause import gc_paused
from ggmlrun.core.util.numbers import INT64_MAX, INT64_MIN, checked_int

MAX_SEED = 2**64 - 1

TOP_KEYS = ("name", "seed", "backends", "tensors", "nodes", "outputs")
NODE_KEYS = ("name", "op", "src", "params", "backend")
NODE_KEYSET = frozenset(NODE_KEYS)


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

    leafs = parse_tensors(doc, data, Path(path).parent)
    nodes = _parse_nodes(doc, data, {t.name: t for t in leafs})
    _check_index_ranges(doc, nodes)
    outputs = _parse_outputs(doc, data, leafs, nodes)
    for out in outputs:
        out.is_output = True
    return Graph(name=name, leafs=leafs, nodes=nodes, outputs=outputs, seed=seed,
                 backends=backends, path=Path(path),
                 backends_line=doc.lines.get(("backends",)) if backends is not None else None)

# ops that index with a source's values: (op) -> (index source, what it indexes, its count)
_INDEXED = {
    "get_rows": (1, "a's rows", lambda n: n.src[0].shape[-2]),
    "set_rows": (2, "a's rows", lambda n: n.src[0].shape[-2]),
    "add_id": (2, "b's rows", lambda n: n.src[1].shape[0]),
    "mul_mat_id": (2, "a's experts", lambda n: n.src[0].shape[0]),
}


def _known_range(t: Tensor) -> tuple[int, int] | None:
    """The least and greatest value a leaf's own data gives it, when the file says them
    (values or an integer init); None for a .npy file or a float init."""
    data = t.data
    if data is None or not t.is_leaf:
        return None
    if data.values is not None:
        flat, stack = [], [data.values]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
            else:
                flat.append(item)
        return (min(flat), max(flat)) if flat else None
    keys, n = data.keys, t.n_elements
    if data.init in ("zeros", "ones"):
        return (int(data.init == "ones"),) * 2
    if data.init == "full":
        return keys["value"], keys["value"]
    if data.init == "arange":
        last = keys["start"] + keys["step"] * (n - 1)
        return min(keys["start"], last), max(keys["start"], last)
    if data.init == "randint":
        return keys["low"], keys["high"] - 1
    return None


def _check_index_ranges(doc, nodes: list[Tensor]) -> None:
    """Indices the file itself gives (values, arange, full, randint) must be in range: ggml's
    release build reads or writes outside the tensor instead of stopping. Indices set at run
    time (--input) are checked when the node runs."""
    for node in nodes:
        spec = _INDEXED.get(node.op)
        if spec is None:
            continue
        pos, what, count = spec
        idx = node.src[pos]
        known = _known_range(idx)
        if known is None:
            continue
        lo, hi = known
        n = count(node)
        if lo < 0 or hi >= n:
            bad = lo if lo < 0 else hi
            raise InputError(
                f"{node.op}: '{idx.name}' holds index {bad}, outside [0, {n}) of {what}: "
                f"ggml's release build would read past them",
                file=doc.file, line=node.line, culprit=f"node '{node.name}'")


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
