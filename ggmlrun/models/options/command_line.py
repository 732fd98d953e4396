"""The llama.cpp command line that reproduces an answer, and its parser.

`llama_cpp_args` spells every option that changed ggmlrun's figures the way llama.cpp's
`common/arg.cpp` spells it (`-ngl 45 -c 8192 -fa on -ctk q8_0 -ctv q8_0 -nkvo -ub 2048 -ts 24,12
-ot 'ffn_.*=CPU' ...`), so the line `fit` and `measure` print, pasted into llama.cpp, asks for
the same placement and buffers. `parse_llama_args` reads such a line back into the fields of a
ModelOptions: the tests print a line for every option, parse it, measure again and compare.

Always spelled out, whatever ggmlrun's default: `-ngl` and `-c` (llama.cpp defaults them to
`auto`/the model's context), and `-fa` (llama.cpp's default is `auto`, which turns flash
attention on where the device has it). A device split is written with `-ts` even when ggmlrun
split by device memory: llama.cpp splits by the *free* memory it finds, which is not the size
ggmlrun was told. Device names in `-ot` are ggmlrun's backend names (GPU0, SIM0, ...): llama.cpp
names buffers by its backend (CUDA0, Vulkan0, Metal); the CPU is CPU in both.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import replace

from ggmlrun.models.options.params import ModelOptions

LLAMA_BATCH = 2048          # llama.cpp's default -b: n_ubatch = min(n_batch, n_ubatch)
LLAMA_UBATCH = 512          # llama.cpp's default -ub
GiB, MiB, KiB = 2**30, 2**20, 2**10


def _number(x: float) -> str:
    """A float as the shortest text that reads back to the same value (3.0 -> 3)."""
    if x == int(x) and abs(x) < 2**53:
        return str(int(x))
    return repr(float(x))


def split_text(parts) -> str:
    """Proportions as small integers where a power-of-two scale makes them integers
    (0.75,0.375 -> 6,3 -> 2,1): scaling by a power of two leaves llama.cpp's float32 split
    points exactly as they were, and so does dividing integers whose sums float32 holds
    exactly (below 2**24) by their common divisor (the same ratios, rounded once)."""
    parts = [float(p) for p in parts]
    for k in range(0, 64):
        scaled = [math.ldexp(p, k) for p in parts]
        if all(s == int(s) for s in scaled) and sum(scaled) < 2**24:
            ints = [int(s) for s in scaled]
            gcd = math.gcd(*ints) or 1
            return ",".join(str(n // gcd) for n in ints)
    return ",".join(_number(p) for p in parts)


def memory_split(devices) -> str:
    """ggmlrun's default split (by each device's memory) as `-ts` proportions, in the largest
    unit that divides every size (24GiB,12GiB -> 24,12): a power-of-two scale, so the split
    points are the same."""
    sizes = [d.memory for d in devices]
    for unit in (GiB, MiB, KiB, 1):
        if all(s % unit == 0 for s in sizes):
            return ",".join(str(s // unit) for s in sizes)
    return ",".join(str(s) for s in sizes)  # pragma: no cover - unit 1 always divides


def llama_cpp_args(opts: ModelOptions, backends, *, ngl: int, ctx: int) -> list[str]:
    """The llama.cpp arguments that reproduce `opts` on `backends` at this -ngl and context."""
    args = ["-ngl", str(ngl), "-c", str(ctx), "-fa", "on" if opts.flash_attn else "off"]
    if opts.ubatch != LLAMA_UBATCH:
        if opts.ubatch > LLAMA_BATCH:      # llama.cpp clamps -ub to -b (default 2048)
            args += ["-b", str(opts.ubatch)]
        args += ["-ub", str(opts.ubatch)]
    if opts.kv_type != "f16":
        args += ["-ctk", opts.kv_type, "-ctv", opts.kv_type]
    if opts.no_kv_offload:
        args.append("-nkvo")
    devices = [b for b in backends if b.kind != "cpu"]
    if opts.tensor_split is not None:
        args += ["-ts", split_text(opts.tensor_split)]
    elif len(devices) > 1:
        args += ["-ts", memory_split(devices)]
    for pattern, backend in opts.overrides:
        args += ["-ot", f"{pattern}={backend}"]
    if not opts.op_offload:
        args.append("--no-op-offload")
    endpoints = [getattr(b, "endpoint", None) for b in devices if b.kind == "rpc"]
    if any(endpoints):                     # ggml rpc-servers as devices (SPEC section 3)
        args += ["--rpc", ",".join(e for e in endpoints if e)]
    # options other branches add to ModelOptions, spelled as llama.cpp spells them
    if getattr(opts, "swa_full", False):
        args.append("--swa-full")
    if getattr(opts, "cpu_moe", False):
        args.append("--cpu-moe")
    n_cpu_moe = getattr(opts, "n_cpu_moe", None)
    if n_cpu_moe:
        args += ["--n-cpu-moe", str(n_cpu_moe)]
    parallel = getattr(opts, "parallel", 1)
    if parallel and parallel != 1:
        args += ["-np", str(parallel)]
    if getattr(opts, "kv_unified", False):
        args.append("-kvu")
    if getattr(opts, "no_mmap", False):
        args.append("--no-mmap")
    return args


def llama_cpp_line(opts: ModelOptions, backends, *, ngl: int, ctx: int) -> str:
    """The arguments as one line to paste in a shell (regexes quoted)."""
    return shlex.join(llama_cpp_args(opts, backends, ngl=ngl, ctx=ctx))


# --- reading a line back --------------------------------------------------------------------
_FLAGS = {"-nkvo": "no_kv_offload", "--no-kv-offload": "no_kv_offload",
          "--swa-full": "swa_full", "--cpu-moe": "cpu_moe", "-cmoe": "cpu_moe",
          "--no-mmap": "no_mmap", "-kvu": "kv_unified", "--kv-unified": "kv_unified"}
_VALUES = {"-ngl": "ngl", "--gpu-layers": "ngl", "--n-gpu-layers": "ngl",
           "-c": "ctx", "--ctx-size": "ctx", "-ub": "ubatch", "--ubatch-size": "ubatch",
           "-b": "batch", "--batch-size": "batch", "-fa": "flash_attn", "--flash-attn": "flash_attn",
           "-ctk": "cache_type_k", "--cache-type-k": "cache_type_k",
           "-ctv": "cache_type_v", "--cache-type-v": "cache_type_v",
           "-ts": "tensor_split", "--tensor-split": "tensor_split",
           "-ot": "override", "--override-tensor": "override",
           "--n-cpu-moe": "n_cpu_moe", "-ncmoe": "n_cpu_moe", "-np": "parallel",
           "--parallel": "parallel", "--rpc": "rpc"}


def parse_llama_args(line: str | list[str]) -> dict:
    """llama.cpp's spelling back into ModelOptions' fields (and `ngl`, `ctx`): only the options
    `llama_cpp_args` writes; anything else is a ValueError naming it."""
    words = shlex.split(line) if isinstance(line, str) else list(line)
    if words and words[0] == "llama.cpp:":
        words = words[1:]
    out: dict = {}
    overrides: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in _FLAGS:
            out[_FLAGS[word]] = True
            i += 1
            continue
        if word == "--no-op-offload" or word == "-nopo":
            out["op_offload"] = False
            i += 1
            continue
        if word not in _VALUES or i + 1 >= len(words):
            raise ValueError(f"llama.cpp option {word!r} is not one ggmlrun writes")
        key, value = _VALUES[word], words[i + 1]
        i += 2
        if key == "override":
            for item in value.split(","):
                pattern, _, backend = item.rpartition("=")
                overrides.append((pattern, backend))
        elif key == "tensor_split":
            out[key] = tuple(float(v) for v in value.replace("/", ",").split(","))
        elif key == "flash_attn":
            out[key] = {"on": True, "off": False, "1": True, "0": False}[value]
        elif key == "rpc":
            out[key] = tuple(value.split(","))
        elif key in ("cache_type_k", "cache_type_v", "ngl"):
            out[key] = value if key != "ngl" or value in ("all", "auto") else int(value)
        else:
            out[key] = int(value)
    if overrides:
        out["overrides"] = tuple(overrides)
    k, v = out.pop("cache_type_k", "f16"), out.pop("cache_type_v", "f16")
    if k != v:
        raise ValueError(f"-ctk {k} and -ctv {v} differ; ggmlrun's --kv-type sets both")
    out["kv_type"] = k
    batch = out.pop("batch", LLAMA_BATCH)
    out["ubatch"] = min(batch, out.get("ubatch", LLAMA_UBATCH))
    return out


def options_from_line(line: str | list[str], base: ModelOptions | None = None) -> ModelOptions:
    """A ModelOptions from a llama.cpp line (the fields it does not name keep `base`'s, or
    llama.cpp's defaults: f16 cache, flash attention off, ubatch 512, op offload on)."""
    from ggmlrun.models.options.params import split_proportions

    fields = parse_llama_args(line)
    base = base or ModelOptions()
    changes = {"ctx": fields.get("ctx"), "ubatch": fields["ubatch"],
               "flash_attn": fields.get("flash_attn", False),
               "ngl": fields.get("ngl") if isinstance(fields.get("ngl"), int) else None,
               "no_kv_offload": fields.get("no_kv_offload", False),
               "kv_type": fields["kv_type"], "overrides": fields.get("overrides", ()),
               "tensor_split": (split_proportions(fields["tensor_split"])
                                if "tensor_split" in fields else None),
               "op_offload": fields.get("op_offload", True)}
    for key in ("swa_full", "cpu_moe", "n_cpu_moe", "parallel", "no_mmap", "kv_unified"):
        if key in fields and hasattr(base, key):
            changes[key] = fields[key]
    return replace(base, **changes)
