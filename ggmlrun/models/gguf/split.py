"""Split GGUF sets (llama-gguf-split): shard names, and the checks llama.cpp's loader makes.

A set of N is named `PREFIX-00001-of-0000N.gguf` ... `PREFIX-0000N-of-0000N.gguf`
(llama_split_path); llama.cpp loads it from its first shard and finds the others by that name.
ggmlrun takes any shard's name and reads the set from the first. The checks are the loader's
(llama_model_loader): `split.count` (u16) on the first shard, `split.no` (u16) on every shard,
0 on the first and i on the i-th ("illegal split file idx"), no tensor name in two shards
("tensor is duplicated"), and `split.tensors.count` (i32) equal to all the shards' tensors
("corrupted model"). One more than llama.cpp: a shard whose own `split.count` is not the
first's belongs to another set (llama.cpp would load it and fail later, or not at all).
"""

from __future__ import annotations

import re

from ggmlrun.core.util.errors import InputError

SHARD = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
COUNT, NO, TENSORS = "split.count", "split.no", "split.tensors.count"


def parse_shard(name: str) -> tuple[str, int, int] | None:
    """(prefix, shard number from 1, count) of a shard's name (a path or a URL), else None."""
    match = SHARD.match(name)
    if match is None or int(match["count"]) < 1:
        return None
    return match["prefix"], int(match["no"]), int(match["count"])


def shard_name(prefix: str, no: int, count: int) -> str:
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def split_count(header) -> int:
    """The set's size by the first shard's `split.count` (1 when absent)."""
    if COUNT not in header.kv:
        return 1
    _typed(header, COUNT, "u16")
    return header.kv[COUNT]


def check_set(headers: list, names: list[str]) -> int:
    """The loader's checks over the shards in order; the set's tensor count."""
    count = len(headers)
    first = headers[0]
    if split_count(first) != count:
        raise InputError(f"split.count is {split_count(first)} but the set has {count} shards",
                         file=names[0])
    seen: dict[str, str] = {}
    for i, (header, name) in enumerate(zip(headers, names)):
        if NO not in header.kv:
            raise InputError(f"missing key {NO} in GGUF split {i + 1} of {count}", file=name)
        no = _typed(header, NO, "u16")
        if no != i:
            raise InputError(f"illegal split file idx: {no} (llama.cpp's split.no counts from "
                             f"0), expected {i}: shard {i + 1} of {count} is missing, duplicated "
                             f"or out of order", file=name)
        if i and COUNT in header.kv and _typed(header, COUNT, "u16") != count:
            raise InputError(f"a shard of another set: its split.count is "
                             f"{header.kv[COUNT]}, this set's {count}", file=name)
        for t in header.tensors:
            if t.name in seen:
                raise InputError(f"invalid model: tensor '{t.name}' is duplicated (also in "
                                 f"{seen[t.name]})", file=name)
            seen[t.name] = name
    if TENSORS not in first.kv:
        raise InputError(f"key not found in model: {TENSORS}", file=names[0])
    expected = _typed(first, TENSORS, "i32")
    if expected != len(seen):
        raise InputError(f"corrupted model: {expected} tensors expected ({TENSORS}) but "
                         f"{len(seen)} found in the {count} shards", file=names[0])
    return len(seen)


def _typed(header, key: str, gtype: str):
    """A key of exactly its type, as llama.cpp's get_key requires."""
    if header.kv_types[key] != gtype:
        raise InputError(f"key '{key}' has wrong type {header.kv_types[key]} but expected type "
                         f"{gtype}", file=header.path)
    return header.kv[key]
