"""The backends list (SPEC.md section 3), from a graph's `backends:` or a `--backends` file."""

from __future__ import annotations

import math

import ggmlrun.core.ir.ops  # noqa: F401  (registers every op: op lists are checked)
from ggmlrun.core.backends.profiles import PROFILES, apply_profile
from ggmlrun.core.backends.spec import BackendSpec
from ggmlrun.core.util import host
from ggmlrun.core.util.errors import InputError, did_you_mean
from ggmlrun.core.util.notes import note
from ggmlrun.core.util.numbers import INT64_MAX, checked_float, checked_int
from ggmlrun.core.frontend.sizes import SIZE_RE, SIZE_UNITS, parse_size  # noqa: F401  (re-exported)
from ggmlrun.core.ir.ops import OPS
from ggmlrun.core.frontend.yamlfile import (
    Doc,
    describe_value,
    is_int,
    is_number,
    named_entry,
    read_yaml,
    shown,
    unknown_keys,
)

BACKEND_KEYS = ("name", "kind", "profile", "memory", "alignment", "threads", "repack", "supports",
                "unsupported", "offload_min_batch", "flops", "mem_bw", "link_bw", "link_latency",
                "endpoint", "device")
RPC_ONLY_KEYS = ("endpoint", "device")
# an rpc device's alignment is asked of the server, its op support is every op (ggml-rpc runs
# the server's backend), and it has no op offload
NOT_RPC_KEYS = ("threads", "repack", "alignment", "supports", "unsupported", "offload_min_batch",
                "profile")
CPU_ONLY_KEYS = ("threads", "repack")
SIM_ONLY_KEYS = ("profile", "supports", "unsupported", "offload_min_batch", "link_bw",
                 "link_latency")
KINDS = ("cpu", "sim", "rpc")
MAX_THREADS = 4096
RATE_RANGE = {key: (1.0, 1e30) for key in ("flops", "mem_bw", "link_bw")}   # per second
MAX_LATENCY = 3600.0
MAX_ALIGNMENT = 2**30


def load_backends(path) -> list[BackendSpec]:
    """Read a `--backends` file: a mapping whose one key, `backends`, holds the list."""
    data, doc = read_yaml(path)
    if isinstance(data, list):
        raise doc.error("a backends file is a mapping; put the list under 'backends:'")
    if not isinstance(data, dict):
        raise doc.error(f"a backends file holds 'backends:' and a list, got {describe_value(data)}")
    unknown_keys(doc, data, ("backends",), (), None, "top-level key")
    if "backends" not in data:
        raise doc.error("missing 'backends:'")
    return parse_backends(data["backends"], doc.file, doc.lines, ("backends",))


def parse_backends(data, file: str, lines: dict | None = None,
                   path: tuple = ("backends",)) -> list[BackendSpec]:
    """Check a backends list; `lines` maps key paths (as tuples from the file's root) to lines.

    One `cpu` backend, and it is last: the scheduler's fallback for every op (ggml's rule
    that the last backend is the CPU).
    """
    doc = Doc(file, lines)
    if not isinstance(data, list):
        raise doc.error(f"backends must be a list of {{name, kind}}, got {describe_value(data)}", path)
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
    name, culprit = named_entry(doc, item, path, "backend", "{name, kind}", frozenset(BACKEND_KEYS))
    kind = item.get("kind")
    if kind is None:
        raise doc.error(f"missing 'kind'; known: {', '.join(KINDS)}", path, culprit)
    if not isinstance(kind, str) or kind not in KINDS:
        raise doc.error(f"unknown kind {shown(kind)}; known: {', '.join(KINDS)}",
                        path + ("kind",), culprit)
    wrong = (SIM_ONLY_KEYS if kind == "cpu" else NOT_RPC_KEYS if kind == "rpc"
             else CPU_ONLY_KEYS) + (() if kind == "rpc" else RPC_ONLY_KEYS)
    for key in item:
        if key in wrong:
            if kind == "rpc":
                raise doc.error(f"'{key}' does not apply to an rpc backend: its alignment and "
                                f"memory are asked of the server, it runs every op and takes "
                                f"no offloaded ones", path + (key,), culprit)
            other = ("rpc" if key in RPC_ONLY_KEYS else "sim" if kind == "cpu" else "cpu")
            raise doc.error(f"'{key}' applies to {other} backends only", path + (key,),
                            culprit)

    def at(key):
        return path + (key,)

    spec = BackendSpec.of_kind(name, kind, line=doc.line(path))
    if "profile" in item:   # the profile's values first: the keys beside it override them
        if not isinstance(item["profile"], str) or item["profile"] not in PROFILES:
            raise doc.error(f"unknown profile {shown(item['profile'])}; known: "
                            f"{', '.join(PROFILES)}", at("profile"), culprit)
        apply_profile(spec, item["profile"])
    if kind == "rpc":
        _ask_rpc_server(doc, item, spec, at, culprit)
    if "memory" in item:
        try:
            spec.memory = parse_size(item["memory"])
        except ValueError as err:
            raise doc.error(f"memory: {err}", at("memory"), culprit) from None
    if "alignment" in item:
        value = item["alignment"]
        if not is_int(value) or value < 1 or value & (value - 1) or value > MAX_ALIGNMENT:
            raise doc.error(f"alignment must be a power of two from 1 to 2**30, got "
                            f"{describe_value(value)}", at("alignment"), culprit)
        spec.alignment = value
    for key in ("threads", "offload_min_batch"):
        if key in item:
            value = item[key]
            high = MAX_THREADS if key == "threads" else INT64_MAX
            try:
                value = checked_int(value, key, 1, high)
            except ValueError as err:
                raise doc.error(str(err), at(key), culprit) from None
            if key == "threads" and value > host.cores():
                note(f"{doc.file}: backend '{name}': threads {value} capped to the "
                     f"{host.cores()} cores of this machine")
                value = host.cores()
            setattr(spec, key, value)
    if "repack" in item:
        from ggmlrun.core.backends.repack import REPACK_KINDS

        if not isinstance(item["repack"], str) or item["repack"] not in REPACK_KINDS:
            raise doc.error(f"repack must be one of {', '.join(REPACK_KINDS)} (which weight "
                            f"types ggml-cpu repacks), got {describe_value(item['repack'])}",
                            at("repack"), culprit)
        spec.repack = item["repack"]
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
                                f"{describe_value(item[key])}", at(key), culprit)
            low, high = RATE_RANGE.get(key, (0.0, MAX_LATENCY))
            try:    # a rate of 1e-320 or a latency of 1e308 makes every modeled time infinite
                value = checked_float(value, key, low, high)
            except ValueError as err:
                raise doc.error(str(err), at(key), culprit) from None
            setattr(spec, key, value)
    return spec


def _ask_rpc_server(doc, item, spec, at, culprit) -> None:
    """An rpc backend: the live server's alignment, largest buffer and free memory (a `memory`
    key beside them overrides the memory), asked over ggml's RPC protocol."""
    from ggmlrun.core.backends.rpc import query

    endpoint = item.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise doc.error("an rpc backend needs 'endpoint: host:port' (its ggml rpc-server)",
                        at("endpoint") if "endpoint" in item else at("kind"), culprit)
    device = item.get("device", 0)
    try:
        device = checked_int(device, "device", 0, 2**31 - 1)
    except ValueError as err:
        raise doc.error(str(err), at("device"), culprit) from None
    try:
        server = query(endpoint)
    except InputError as err:
        raise doc.error(err.message if hasattr(err, "message") else str(err), at("endpoint"),
                        culprit) from None
    if device >= len(server.devices):
        raise doc.error(f"rpc-server {endpoint} has {len(server.devices)} device(s); device "
                        f"{device} is not one", at("device"), culprit)
    dev = server.devices[device]
    spec.endpoint, spec.rpc_device = endpoint, device
    spec.alignment, spec.max_buffer_size, spec.memory = dev.alignment, dev.max_size, dev.free


def _parse_op_list(doc, ops, where, culprit, key) -> list[str]:
    if not isinstance(ops, list):
        raise doc.error(f"{key} must be a list of op names like [argmax, get_rows], got "
                        f"{describe_value(ops)}", where, culprit)
    for j, op in enumerate(ops):
        if not isinstance(op, str) or op not in OPS:
            raise doc.error(f"{key}: unknown op {shown(op)}; {did_you_mean(str(op), OPS, ask=True)}",
                            where + (j,), culprit)
    return ops


def _number(value) -> float | None:
    """A positive-number field: a YAML number, or a string a float() reads ('50e12')."""
    if is_number(value):
        return float(value) if abs(value) < 1e300 else math.inf    # 2**1100 overflows float()
    if isinstance(value, str):
        try:
            return float(value.replace("_", ""))
        except ValueError:
            return None
    return None
