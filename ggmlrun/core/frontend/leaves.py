"""The `tensors:` section of a graph file (SPEC.md section 1): each leaf's shape, dtype, role,
backend and data (an init, inline values or a .npy file), checked with its file and line. A
big file repeats a few leaf specs many times, so an exact repeat is the same checked leaf
under another name (`_twin`). The nodes and outputs that use the leaves are loader's.
"""

from __future__ import annotations

import math
from pathlib import Path

from ggmlrun.core.frontend.data import FLOAT_ONLY_INITS, INIT_KEYS, REQUIRED, check_npy
from ggmlrun.core.frontend.yamlfile import (check_name, describe_value, is_int, is_number,
                                            shown, unknown_keys)
from ggmlrun.core.ir.graph import MAX_DIMS, LeafData, Tensor
from ggmlrun.core.ir.types import PLAIN, ggml_type
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.util.fmt import all_plain_ints, exact_key, shape_text
from ggmlrun.core.util.numbers import INT64_MAX, checked_int

MAX_TENSOR_BYTES = 2**40          # 1 TiB per tensor: far past any real weight, guards typos
MAX_VALUES = 2**20                # inline values: bigger data belongs in a .npy (and YAML
                                  # aliases could otherwise make a tiny file expand to billions)
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

TENSOR_KEYS = ("shape", "dtype", "role", "backend", "init", "values", "file")
ALL_INIT_KEYS = tuple(dict.fromkeys(k for keys in INIT_KEYS.values() for k in keys))
TENSOR_KEYSET = frozenset(TENSOR_KEYS + ALL_INIT_KEYS)
ROLES = ("weight", "input")
OWN_DATA = ("values", "file")   # a leaf spec whose data is its own: never shared (see _twin)


def parse_tensors(doc, data, yaml_dir: Path) -> list[Tensor]:
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
