"""The llama.cpp command line that reproduces an answer, and its parser, both made from the
option table (table.py).

`llama_cpp_args` spells every option that changed ggmlrun's figures the way llama.cpp's
`common/arg.cpp` spells it (`-ngl 45 -c 8192 -fa on -ctk q8_0 -ctv q8_0 -nkvo -ub 2048 -ts 24,12
-ot 'ffn_.*=CPU' ...`), so the line `fit` and `measure` print, pasted into llama.cpp, asks for
the same placement and buffers. `parse_llama_args` reads such a line, in any of llama.cpp's
spellings, back into the fields of a ModelOptions; an option the table does not have is a
ValueError naming it, never dropped.

Always spelled out, whatever ggmlrun's default: `-ngl` and `-c` (llama.cpp defaults them to
`auto`/the model's context), `-ngld` with a draft (`auto` too). `-fa` only when given (on or off): ggmlrun's default is llama.cpp's
`auto`, resolved on the placement as llama.cpp resolves it, so llama.cpp's own default asks for
the same. `-np`/`-kvu` only where they differ from the target's (`--for`: llama-server's -np
auto, 4 sequences in one unified cache; llama-cli's -np 1). A device split is written with `-ts` even when ggmlrun
split by device memory: llama.cpp splits by the *free* memory it finds, which is not the size
ggmlrun was told. `-b` is written only when `-ub` is past its default, which would clamp it.
Device names in `-ot` are ggmlrun's backend names (GPU0, SIM0, ...): llama.cpp names buffers by
its backend (CUDA0, Vulkan0, Metal); the CPU is CPU in both.
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from ggmlrun.models.options.kinds import split_text  # noqa: F401  (the line's -ts; tests)
from ggmlrun.models.options.params import ModelOptions, seq_max, unified
from ggmlrun.models.options.table import BY_NAME, OPTIONS, Option

GiB, MiB, KiB = 2**30, 2**20, 2**10


def memory_split(devices) -> tuple[float, ...]:
    """ggmlrun's default split (by each device's memory) as `-ts` proportions, in the largest
    unit that divides every size (24GiB,12GiB -> 24,12): a power-of-two scale, so the split
    points are the same."""
    sizes = [d.memory for d in devices]
    unit = next(u for u in (GiB, MiB, KiB, 1) if all(s % u == 0 for s in sizes))
    return tuple(float(s // unit) for s in sizes)


def seq_max_default(target: str) -> tuple[int, bool]:
    """(n_seq_max, kv_unified) a target sets when -np is not given."""
    opts = ModelOptions(target=target)
    return seq_max(opts), unified(opts)


def _words(option: Option, value) -> list[str]:
    """One row's words: nothing at its default (unless llama.cpp's default differs), a
    switch's spelling, one spelling per rule of a repeatable option, else each llama.cpp
    option that sets the field with the value (-ctk X -ctv X)."""
    if value == option.default and not option.always:
        return []
    if not option.kind.takes_value:
        return [option.llama[0][0]]
    if option.kind.repeatable:
        return [w for item in value for w in (option.llama[0][0], option.kind.write(item))]
    return [w for spellings in option.llama for w in (spellings[0], option.kind.write(value))]


def llama_cpp_args(opts: ModelOptions, backends, *, ngl: int | None, ctx: int) -> list[str]:
    """The llama.cpp arguments that reproduce `opts` on `backends` at this -ngl and context."""
    values = {**{o.name: getattr(opts, o.name) for o in OPTIONS if o.field},
              "ngl": ngl, "ctx": ctx}
    devices = [b for b in backends if b.kind != "cpu"]
    values["batch"] = max(opts.ubatch, BY_NAME["batch"].default)
    if values["tensor_split"] is None and len(devices) > 1:
        values["tensor_split"] = memory_split(devices)
    values["load_mode"] = None                 # --no-mmap is written instead
    values["fit_target"] = BY_NAME["fit_target"].default    # llama.cpp's --fit: not an answer
    values["fit_ctx"] = BY_NAME["fit_ctx"].default
    # -np and -kvu against the target's own pair: llama-server's auto (4, unified), llama-cli's
    # (1, not); a pair that differs is written whole (-np 4 -kvu for llama-cli)
    pair, default = (seq_max(opts), unified(opts)), seq_max_default(opts.target)
    values["parallel"] = None if pair == default else pair[0]
    values["kv_unified"] = pair[1] and pair != default
    values["rpc"] = tuple(e for e in (getattr(b, "endpoint", None) for b in devices
                                      if b.kind == "rpc") if e)
    args: list[str] = []
    for option in OPTIONS:
        if option.name.endswith("_draft") and opts.model_draft is None:
            continue                           # a draft's options, only with a draft (-md)
        if option.llama:
            args += _words(option, values[option.name])
    return args


PROGRAMS = {"server": "llama-server", "cli": "llama-cli"}     # --for: the program the line is for


def program(opts: ModelOptions) -> str:
    return PROGRAMS[opts.target]


def model_words(source: str, local_gguf: bool) -> list[str]:
    """How llama.cpp names the model ggmlrun was given (the inverse of llama_command's -m, -hf,
    -hff, -mu): `hf://OWNER/REPO[:QUANT]` is `-hf OWNER/REPO[:QUANT]`, a file in a repository
    `-hf OWNER/REPO -hff PATH`, a URL `-mu URL`, a local GGUF file `-m PATH`; a model card
    or a pinned revision (`@REV`, which -hf cannot say) names nothing llama.cpp loads: []."""
    if source.startswith("hf://"):
        body = source[len("hf://"):]
        if "@" in body:
            return []
        owner, _, rest = body.partition("/")
        repo, _, path = rest.partition("/")
        return ["-hf", f"{owner}/{repo}", "-hff", path] if path else ["-hf", body]
    if source.startswith(("http://", "https://")):
        return ["-mu", source]
    return ["-m", source] if source and local_gguf else []


def paste_line(opts: ModelOptions, command: str, model: list[str]) -> str:
    """The line to paste: the program (--for), the model as llama.cpp names it, the options."""
    return " ".join([program(opts), *map(shlex.quote, model), command]).rstrip()


def llama_cpp_line(opts: ModelOptions, backends, *, ngl: int | None, ctx: int) -> str:
    """The arguments as one line to paste in a shell (regexes quoted)."""
    return shlex.join(llama_cpp_args(opts, backends, ngl=ngl, ctx=ctx))


# --- reading a line back --------------------------------------------------------------------
def _spellings() -> dict[str, tuple[Option, int | None]]:
    """Every llama.cpp spelling in the table: its row and which of the row's llama.cpp
    options it is (None: a switch's spelling that sets it back)."""
    found: dict[str, tuple[Option, int | None]] = {}
    for option in OPTIONS:
        for index, spellings in enumerate(option.llama):
            found.update({s: (option, index) for s in spellings})
        found.update({s: (option, None) for s in option.llama_off})
    return found


SPELLINGS = _spellings()


def parse_llama_args(line: str | list[str]) -> dict:
    """llama.cpp's spelling back into ModelOptions' fields (and `ngl`, `ctx`, `rpc`), in any
    of the table's spellings, the last use of an option winning as in llama.cpp; `ubatch`
    always (-ub clamped to -b). Anything else is a ValueError naming it."""
    words = shlex.split(line) if isinstance(line, str) else list(line)
    if words and words[0] == "llama.cpp:":
        words = words[1:]
    out: dict = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word not in SPELLINGS:
            raise ValueError(f"llama.cpp option {word!r} is not one ggmlrun models")
        option, index = SPELLINGS[word]
        if not option.kind.takes_value:
            value, i = (index is not None) != bool(option.default), i + 1
        elif i + 1 >= len(words):
            raise ValueError(f"llama.cpp option {word!r} needs a value")
        else:
            try:
                value = option.kind.read_llama(words[i + 1])
            except ValueError as err:
                raise ValueError(f"{word} {words[i + 1]}: {err}") from None
            i += 2
        if option.kind.repeatable:
            value = (*out.get(option.name, ()), *value)
        out[option.name] = value
    if out.get("load_mode") is not None:
        out["no_mmap"] = out.pop("load_mode")
    out.pop("load_mode", None)
    batch = out.pop("batch", BY_NAME["batch"].default)
    out["ubatch"] = min(batch, out.get("ubatch", BY_NAME["ubatch"].default))
    return out


def options_from_line(line: str | list[str], base: ModelOptions | None = None) -> ModelOptions:
    """A ModelOptions from a llama.cpp line: each option llama.cpp spells is the line's or, not
    named, its default; the others (--ggml, --sched-copies) keep `base`'s."""
    fields = parse_llama_args(line)
    return replace(base or ModelOptions(),
                   **{o.name: fields.get(o.name, o.default) for o in OPTIONS
                      if o.field and o.llama})
