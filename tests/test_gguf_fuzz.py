"""Fuzzing GGUF input: the bundled models mutated (bytes flipped, the file cut, length and count
fields set to huge values, keys duplicated or removed, offsets, shapes and types changed) with a
seeded RNG, then `validate`, `plan`, `measure`, `fit` and now and then `run`, in-process.

Whatever the file, ggmlrun answers with exit 0, 1 or 2, one message, never a traceback, an
"internal error" or a Python warning, and never hangs (each case under tests/hang.py's guard;
the slowest case's seconds are printed, a figure, never asserted). The default profile runs
300 cases (well under 30 s); GGMLRUN_FUZZ_CASES=20000 runs a long profile by hand (GGMLRUN_FUZZ_SEED picks
another sequence; GGMLRUN_FUZZ_REPORT=FILE writes the counts as JSON; GGMLRUN_FUZZ_COMMANDS and
GGMLRUN_FUZZ_MODELS narrow it, below). Every bundled model is a seed, and besides the header's
fields the mutations aim at values: an architecture's own keys (expert counts and widths, the
sliding window and its pattern, shared-expert widths, NextN layers, expert scales) set to
hostile values of their stored type, absent keys of the newer architectures added, and tensor
data (MXFP4 and q8_0 block scales, norms, sinks) overwritten.
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import struct
import time
import warnings

from ggmlrun.core.util import ram
from ggmlrun.models import run as model_run
from tests.clikit import invoke
from tests.ggufkit import ARRAY, MODELS, SIZES, kv_bytes, layout, rebuild
from tests.hang import HANG_S, no_hang

CASES = int(os.environ.get("GGMLRUN_FUZZ_CASES", "300"))
SEED = int(os.environ.get("GGMLRUN_FUZZ_SEED", "19"))
REPORT = os.environ.get("GGMLRUN_FUZZ_REPORT")
# per case: a hang guard (tests/hang.py), never a timing assertion
HANG_S = int(os.environ.get("GGMLRUN_FUZZ_HANG_S", str(HANG_S)))
HUGE = [0, 1, 2**8 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 10**9, 2**62,
        2**63 - 1, 2**63, 2**64 - 1]
# hostile values for a hyperparameter kept in its stored type (so that the type check passes and
# the value reaches the range rules and the graph): counts and widths around the model's own
U32_VALUES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 64, 255, 1024, 1025, 2**16, 2**24, 2**24 + 1,
              2**31 - 1, 2**31, 2**32 - 1]
F32_VALUES = [0.0, -0.0, -1.0, 1e-45, 1e-30, 1e-6, 0.5, 1.0, 2.0, 1e30, 3.4e38,
              float("nan"), float("inf"), float("-inf")]
# keys of the newer architectures a file may lack; added with a hostile value when absent
NEW_KEYS = {"expert_count": 4, "expert_used_count": 4, "expert_feed_forward_length": 4,
            "expert_shared_feed_forward_length": 4, "expert_shared_count": 4,
            "leading_dense_block_count": 4, "nextn_predict_layers": 4,
            "attention.sliding_window": 4, "attention.sliding_window_pattern": 4,
            "rope.freq_base_swa": 6, "expert_weights_scale": 6, "expert_gating_func": 4,
            "expert_weights_norm": 7, "final_logit_softcapping": 6,
            "attention.shared_kv_layers": 4, "embedding_length_per_layer_input": 4,
            "full_attention_interval": 4, "attention.key_length_swa": 4,
            "rope.dimension_count_swa": 4, "rope.scaling.factor": 6}
COMMANDS = ([["validate"]] * 6 + [["plan"]] * 2 + [["measure"]] * 2 + [["fit"]] * 2
            + [["run", "--tokens", "1,2,3", "--json"]])
# a long run may aim: GGMLRUN_FUZZ_COMMANDS=run,fit keeps those commands, GGMLRUN_FUZZ_MODELS=
# gpt-oss,moe keeps the bundled models whose name holds one of the words
ONLY = os.environ.get("GGMLRUN_FUZZ_COMMANDS")
if ONLY:
    COMMANDS = [c for c in COMMANDS if c[0] in ONLY.split(",")]
PICK = os.environ.get("GGMLRUN_FUZZ_MODELS")


def _u64_fields(lay) -> list[tuple[int, str]]:
    """Positions of the header's u64 fields: string lengths, array counts, offsets, dims."""
    spots = [(8, "tensor count"), (16, "key count")]
    for key, (start, at_type, _) in lay.keys.items():
        spots.append((start, f"key '{key}' length"))
        spots.append((at_type + 8, f"key '{key}' array count / string length"))
    for name, (start, at_offset, _) in lay.infos.items():
        spots += [(start, f"tensor '{name}' name length"), (at_offset, f"tensor '{name}' offset"),
                  (at_offset - 12, f"tensor '{name}' last dim")]
    return spots


def mutate(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
    lay = layout(raw)
    kind = rng.choice(["flip", "flip", "cut", "huge", "huge", "dupkey", "dropkey", "offset",
                       "type", "dims", "valuetype", "version", "many", "hparam", "hparam",
                       "hparam", "addkey", "weights"])
    if kind == "flip":
        data = bytearray(raw)
        top = min(lay.data_offset, len(raw)) if rng.random() < 0.9 else len(raw)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(4, top)] = rng.randrange(256)
        return bytes(data), "flip"
    if kind == "cut":
        at = rng.choice([rng.randrange(4, lay.data_offset + 64), rng.randrange(4, len(raw))])
        return raw[:at], f"cut at {at}"
    if kind == "huge":
        at, what = rng.choice(_u64_fields(lay))
        value = rng.choice(HUGE + [struct.unpack_from("<Q", raw, at)[0] + rng.choice([-1, 1, 32])])
        return _patch(raw, at, value % 2**64), f"{what} = {value}"
    if kind == "dupkey":
        key = rng.choice(list(lay.keys))
        start, _, end = lay.keys[key]
        return rebuild(raw, extra_kv=raw[start:end]), f"key '{key}' twice"
    if kind == "dropkey":
        key = rng.choice([k for k in lay.keys if k != "general.alignment"])
        return rebuild(raw, drop_key=key), f"key '{key}' removed"
    if kind == "offset":
        name = rng.choice(list(lay.infos))
        at = lay.infos[name][1]
        now = struct.unpack_from("<Q", raw, at)[0]
        value = rng.choice([now + rng.choice([-32, -1, 1, 16, 32, 4096]), 0, 2**64 - 1,
                            len(raw), 2**63])
        return _patch(raw, at, value % 2**64), f"tensor '{name}' offset {value}"
    if kind == "type":
        name = rng.choice(list(lay.infos))
        at = lay.infos[name][1] - 4
        value = rng.choice([rng.randrange(0, 45), -1, 2**31 - 1, 9, 15])
        return _patch(raw, at, value, "<i"), f"tensor '{name}' type {value}"
    if kind == "dims":
        name = rng.choice(list(lay.infos))
        start = lay.infos[name][0]
        at = start + 8 + len(name.encode())
        value = rng.choice([0, 1, 2, 3, 4, 5, 2**32 - 1])
        return _patch(raw, at, value, "<I"), f"tensor '{name}' n_dims {value}"
    if kind == "valuetype":
        key = rng.choice(list(lay.keys))
        at = lay.keys[key][1]
        value = rng.choice(list(range(-1, 14)))
        return _patch(raw, at, value, "<i"), f"key '{key}' type {value}"
    if kind == "version":
        value = rng.choice([0, 1, 2, 4, 0x03000000, 2**32 - 1])
        return _patch(raw, 4, value, "<I"), f"version {value}"
    if kind == "hparam":
        return _hparam(raw, lay, rng)
    if kind == "addkey":
        arch = _arch(raw, lay)
        absent = [k for k in NEW_KEYS if arch and f"{arch}.{k}" not in lay.keys]
        if not absent:
            return _hparam(raw, lay, rng)
        key = rng.choice(absent)
        gtype = NEW_KEYS[key]
        value = _value(gtype, rng)
        payload = struct.pack({4: "<I", 6: "<f", 7: "<?"}[gtype], value)
        return rebuild(raw, extra_kv=kv_bytes(f"{arch}.{key}", gtype, payload)), \
            f"key '{arch}.{key}' added = {value}"
    if kind == "weights":           # a tensor's data: MXFP4/q8_0 block scales, norms, sinks
        name = rng.choice(list(lay.infos))
        start = lay.data_offset + struct.unpack_from("<Q", raw, lay.infos[name][1])[0]
        end = min(len(raw), start + 4096)
        if start >= end:
            return raw, "unchanged"
        data = bytearray(raw)
        fill = rng.choice([0x00, 0x7F, 0x80, 0xFE, 0xFF, None])
        for _ in range(rng.randint(1, 64)):
            data[rng.randrange(start, end)] = rng.randrange(256) if fill is None else fill
        return bytes(data), f"tensor '{name}' data bytes set to {fill}"
    data = raw                                   # several of the above at once
    for _ in range(rng.randint(2, 4)):
        if len(data) > 64 and _parses(data):
            try:                 # a field the last mutation moved past the end: skip it
                data, _ = mutate(data, rng)
            except (struct.error, IndexError, ValueError, KeyError):
                pass
    nested = struct.pack("<iQ", 9, 1) * rng.randint(1, 50) + struct.pack("<iQ", 4, 0)
    if rng.random() < 0.3 and _parses(data):
        data = rebuild(data, extra_kv=kv_bytes("x.nested", 9, nested))
    return data, "several"


def _arch(raw: bytes, lay) -> str:
    """The architecture's name; "" when an earlier mutation removed or broke it."""
    if "general.architecture" not in lay.keys:
        return ""
    at = lay.keys["general.architecture"][1] + 4
    n = struct.unpack_from("<Q", raw, at)[0]
    return raw[at + 8:at + 8 + n].decode(errors="replace")


def _value(gtype: int, rng: random.Random):
    if gtype == 6:
        return rng.choice(F32_VALUES)
    if gtype == 7:
        return rng.random() < 0.5
    return rng.choice(U32_VALUES)


def _hparam(raw: bytes, lay, rng: random.Random) -> tuple[bytes, str]:
    """One of the architecture's own keys (or one item of a per-layer array) set to a hostile
    value of its stored type."""
    arch = _arch(raw, lay)
    keys = [k for k in lay.keys if arch and k.startswith(arch + ".")]
    if not keys:
        return raw, "unchanged"
    key = rng.choice(keys)
    at = lay.keys[key][1]
    gtype = struct.unpack_from("<i", raw, at)[0]
    at += 4
    if gtype == ARRAY:
        etype, count = struct.unpack_from("<iQ", raw, at)
        if etype not in (4, 5, 6, 7) or not count:
            return raw, "unchanged"
        item = rng.randrange(count)
        gtype, at = etype, at + 12 + item * SIZES[etype]
        key = f"{key}[{item}]"
    if gtype not in (4, 5, 6, 7):
        return raw, "unchanged"
    value = _value(6 if gtype == 6 else 7 if gtype == 7 else 4, rng)
    if gtype == 5:
        value = value if value < 2**31 else value - 2**32
    return _patch(raw, at, value, {4: "<I", 5: "<i", 6: "<f", 7: "<?"}[gtype]), \
        f"key '{key}' = {value}"


def _parses(raw: bytes) -> bool:
    try:
        return raw[:4] == b"GGUF" and layout(raw).data_offset <= len(raw)
    except (struct.error, UnicodeDecodeError, KeyError, IndexError, MemoryError, OverflowError):
        return False


def _patch(raw: bytes, at: int, value, fmt: str = "<Q") -> bytes:
    data = bytearray(raw)
    struct.pack_into(fmt, data, at, value)
    return bytes(data)


def check_case(path, command) -> tuple[int, float]:
    """(exit code, seconds) of one case, its invariants asserted; a run that succeeds gives
    finite logits, whatever was mutated (a key or the weights' bytes)."""
    t0 = time.monotonic()
    with no_hang(f"{command[0]} of a mutated file", HANG_S), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = invoke(*command[:1], path, *command[1:])
    seconds = time.monotonic() - t0
    assert code in (0, 1, 2), (command, code, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert "Warning" not in err and not caught, (err[-2000:], [str(w.message) for w in caught])
    assert code == 0 or err.startswith("ggmlrun: error: "), err[-2000:]
    # a kernel's exception (exit 1 "while executing node ...") means a value reached it
    # unchecked: bad input is found before anything runs
    assert "while executing node" not in err, err[-2000:]
    if code == 0 and command[0] == "run":    # never a non-finite answer, whatever changed
        # (run MODEL refuses non-finite logits: weights' bytes, not only keys)
        summary = json.loads(out)["outputs"]["result_output"]
        assert math.isfinite(summary["sum"]) and math.isfinite(summary["l2"]), summary
    return code, seconds


def test_fuzz_gguf(tmp_path, monkeypatch):
    monkeypatch.setattr(ram, "available_bytes", lambda: 8 << 30)       # the host is not read
    monkeypatch.setattr(model_run, "address_space", lambda: None)
    rng = random.Random(SEED)
    bases = [m.read_bytes() for m in MODELS
             if not PICK or any(word in m.name for word in PICK.split(","))]
    codes = collections.Counter()
    by_command = collections.Counter()
    slowest = (0.0, "")
    path = tmp_path / "fuzz.gguf"
    for case in range(CASES):
        data, what = mutate(rng.choice(bases), rng)
        command = rng.choice(COMMANDS)
        path.write_bytes(data)
        try:
            code, seconds = check_case(path, command)
        except AssertionError as failure:
            keep = tmp_path / f"case{case}.gguf"
            keep.write_bytes(data)
            raise AssertionError(f"case {case} (seed {SEED}): {what}; {command[0]} {keep}: "
                                 f"{failure}") from None
        codes[code] += 1
        by_command[f"{command[0]} {code}"] += 1
        slowest = max(slowest, (seconds, f"case {case}: {command[0]}, {what}"))
    summary = {"cases": CASES, "seed": SEED, "exit_codes": dict(sorted(codes.items())),
               "by_command": dict(sorted(by_command.items())), "hangs": 0,
               "internal_errors": 0, "warnings": 0, "kernel_exceptions": 0,
               "nan_logits_from_a_key": 0, "slowest_s": round(slowest[0], 3),
               "slowest": slowest[1]}
    print(json.dumps(summary))
    if REPORT:
        with open(REPORT, "w") as handle:
            json.dump(summary, handle, indent=1)
    assert codes[2] > CASES // 2          # most mutations are caught as bad input
