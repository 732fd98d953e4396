"""A llama-server or llama-cli command line as the user runs it (`fit`/`measure ... --
llama-server -hf OWNER/REPO:QUANT -c 32768 -fa on ...`), read into what ggmlrun plans for.

Each word is read as llama.cpp's common_params_parse reads it (common/arg.cpp): a `--long_name`
is `--long-name`; an option takes as many values as its handler (llama_args.py, generated from
arg.cpp); an option the tool does not define is refused with llama.cpp's own error, "invalid
argument" (llama-cli has no -kvu, llama-server no -st). What is left is one of three kinds:

* the model options of the option table: their words go, unchanged, to the one parser of
  llama.cpp lines (command_line.parse_llama_args), after the values only llama.cpp's own
  defaults spell (-c 0: the training context; -ngl -1/auto: fit's to choose, -2: every layer;
  -np -1: llama-server's auto, the default);
* what says which model and how llama.cpp's --fit runs: -m, -hf (with -hff), -mu, --fit,
  --fit-target, --fit-ctx, read here;
* everything else llama.cpp takes (sampling, the server's port, threads, -cms, ...):
  not modelled, kept as written so that the answer names every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ggmlrun.models.options.command_line import SPELLINGS, parse_llama_args
from ggmlrun.models.options.llama_args import ARGS

MiB = 2**20
TOOLS = {"llama-server": "server", "llama-cli": "cli"}
FIT_DEFAULT_CTX = 4096            # common.h: fit_params_min_ctx
FIT_DEFAULT_TARGET = 1024 * MiB   # common.h: fit_params_target, per device

# llama.cpp's spellings read here, not by the table: the model and llama.cpp's --fit
_OWN = {"-m": "model", "--model": "model", "-hf": "hf", "-hfr": "hf", "--hf-repo": "hf",
        "-hff": "hf_file", "--hf-file": "hf_file", "-mu": "url", "--model-url": "url",
        "-fit": "fit", "--fit": "fit", "-fitt": "fit_target", "--fit-target": "fit_target",
        "-fitc": "fit_ctx", "--fit-ctx": "fit_ctx"}


# -sm/--split-mode: `layer` (llama.cpp's default) is how ggmlrun places a model over devices
_SPLIT_MODE = ("-sm", "--split-mode")
SPLIT_MODES = ("none", "layer", "row", "tensor")


def _known() -> dict[str, tuple[int, tuple[str, ...]]]:
    """Every spelling arg.cpp defines: (values it takes, the tools that accept it). A spelling
    defined twice (-np: llama-server's under `if (ex == LLAMA_EXAMPLE_SERVER)`, everyone
    else's in the `else`) belongs to the tools of either."""
    known: dict[str, tuple[int, tuple[str, ...]]] = {}
    for on, off, n, tools in ARGS:
        for s in (*on, *off):
            before = known.get(s, (n, ()))[1]
            known[s] = (n, tuple(t for t in ("server", "cli") if t in before or t in tools))
    return known


KNOWN = _known()


@dataclass
class LlamaCommand:
    tool: str                                  # llama-server | llama-cli
    model: str | Path | None = None            # a path, hf://..., or a URL
    model_words: str | None = None             # how the command named it (-m X, -hf Y)
    fields: dict = field(default_factory=dict) # parse_llama_args' fields (ngl, ctx: see below)
    written: dict = field(default_factory=dict)  # field -> the spelling the command used
    ngl_auto: bool = True                      # -ngl absent, -1 or auto: --fit's to choose
    ctx_train: bool = False                    # -c 0: the model's training context
    fit: bool = True                           # --fit on (llama.cpp's default) or off
    fit_target: tuple[int, ...] | None = None  # bytes per device (one: every device)
    fit_ctx: int | None = None                 # --fit-ctx
    unmodelled: list[str] = field(default_factory=list)   # as written, with their values

    @property
    def ctx_auto(self) -> bool:
        """Whether llama.cpp's --fit may choose the context: -c absent or 0, --fit on."""
        return self.fit and "ctx" not in self.fields


def _int(word: str, value: str) -> int:
    """std::stoi's reading: a whole number (llama.cpp refuses the rest)."""
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError(f"{word} {value}: not a whole number (llama.cpp: stoi)") from None


def _fit_target(value: str) -> tuple[int, ...]:
    """--fit-target MiB0,MiB1,... (split at , and /), in bytes; one value is every device's."""
    import re

    try:
        parts = tuple(int(p) * MiB for p in re.split(r"[,/]+", value) if p != "")
    except ValueError:
        raise ValueError(f"--fit-target {value}: give MiB per device, e.g. 1024 or "
                         f"1024,512") from None
    if not parts or any(p < 0 for p in parts):
        raise ValueError(f"--fit-target {value}: give MiB per device, e.g. 1024 or 1024,512")
    return parts


def read_command(words: list[str]) -> LlamaCommand:
    """The command line after `--`; ValueError, one line, for what llama.cpp would refuse
    or what names no tool ggmlrun answers for."""
    if not words:
        raise ValueError("after -- give the llama.cpp command line as you run it, e.g. "
                         "-- llama-server -hf OWNER/REPO:Q4_K_M -c 32768")
    name = Path(words[0]).name.removesuffix(".exe")
    if name not in TOOLS:
        raise ValueError(f"after --: {words[0]!r} is not llama-server or llama-cli (the tools "
                         f"whose command lines ggmlrun reads)")
    tool = TOOLS[name]
    cmd = LlamaCommand(tool=name)
    table: list[str] = []
    own: dict[str, tuple[str, str]] = {}
    i = 1
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            word = word.replace("_", "-")          # llama.cpp: --ctx_size is --ctx-size
        known = KNOWN.get(word)
        if known is not None and tool not in known[1] or known is None and word not in SPELLINGS:
            raise ValueError(f"{name} refuses {words[i]!r} (llama.cpp: error: invalid "
                             f"argument: {word})")
        n = known[0] if known else (1 if SPELLINGS[word][0].kind.takes_value else 0)
        if i + n >= len(words):
            raise ValueError(f"{name}: {word} needs a value (llama.cpp: expected value for "
                             f"argument)")
        values = words[i + 1:i + 1 + n]
        i += 1 + n
        if word in _SPLIT_MODE:
            if values[0] not in SPLIT_MODES:
                raise ValueError(f"{word} {values[0]}: choose one of {', '.join(SPLIT_MODES)} "
                                 f"(llama.cpp: invalid value)")
            if values[0] != "layer":            # layer, llama.cpp's default, is what is modelled
                cmd.unmodelled.append(f"{word} {values[0]}")
        elif word in _OWN:
            own[_OWN[word]] = (word, values[0])
        elif word in SPELLINGS:
            option = SPELLINGS[word][0]
            cmd.written[option.name] = word
            table += [word, *values]
        else:
            cmd.unmodelled.append(" ".join([word, *values]))
    table = _llama_defaults(cmd, table)
    if "batch" in cmd.written:              # -b clamps -ub: the command sets ubatch then
        cmd.written.setdefault("ubatch", cmd.written.pop("batch"))
    if "load_mode" in cmd.written:          # -lm none is --no-mmap (parse_llama_args)
        cmd.written.setdefault("no_mmap", cmd.written.pop("load_mode"))
    fields = parse_llama_args(table)
    cmd.fields = {k: v for k, v in fields.items() if k in cmd.written}
    _read_own(cmd, own)
    return cmd


def _llama_defaults(cmd: LlamaCommand, table: list[str]) -> list[str]:
    """The values only llama.cpp's defaults spell, taken out of the table's words: -c 0 (the
    training context) and -ngl -1 / auto (fit's to choose), -ngl <= -2 (every layer). The
    last -c and -ngl win, as in llama.cpp."""
    out, i = [], 0
    while i < len(table):
        word = table[i]
        option = SPELLINGS[word][0]
        if option.name in ("ctx", "ngl"):
            cmd.written[option.name] = word
        if option.name == "ctx":
            cmd.ctx_train = table[i + 1].strip() == "0"
            if cmd.ctx_train:
                cmd.written.pop("ctx", None)
                out = _drop(out, "ctx")
                i += 2
                continue
        if option.name == "parallel" and table[i + 1].strip() == "-1":
            cmd.written.pop("parallel", None)   # llama-server's auto: the default
            out = _drop(out, "parallel")
            i += 2
            continue
        if option.name == "ngl":
            value = table[i + 1].strip().lower()
            cmd.ngl_auto = value in ("auto", "-1")
            if cmd.ngl_auto:
                cmd.written.pop("ngl", None)
                out = _drop(out, "ngl")
                i += 2
                continue
            if value.lstrip("-").isdigit() and int(value) <= -2:
                table = table[:i + 1] + ["all"] + table[i + 2:]
        out += table[i:i + 1 + (1 if option.kind.takes_value else 0)]
        i += 1 + (1 if option.kind.takes_value else 0)
    return out


def _drop(words: list[str], name: str) -> list[str]:
    """The words without an earlier use of the option `name` (a later one wins)."""
    out, i = [], 0
    while i < len(words):
        option = SPELLINGS[words[i]][0]
        step = 2 if option.kind.takes_value else 1
        if option.name != name:
            out += words[i:i + step]
        i += step
    return out


def _read_own(cmd: LlamaCommand, own: dict[str, tuple[str, str]]) -> None:
    from ggmlrun.models.options.kinds import OnOff

    if "fit" in own:
        word, value = own["fit"]
        try:
            cmd.fit = OnOff().read(value)
        except ValueError:
            raise ValueError(f"{word} {value}: give on or off (llama.cpp: unknown value for "
                             f"--fit)") from None
    if "fit_target" in own:
        cmd.fit_target = _fit_target(own["fit_target"][1])
    if "fit_ctx" in own:
        word, value = own["fit_ctx"]
        cmd.fit_ctx = _int(word, value)
        if cmd.fit_ctx < 1:
            raise ValueError(f"{word} {value}: give a context of 1 or more")
    names = [k for k in ("model", "hf", "url") if k in own]
    if len(names) > 1:
        words = " and ".join(own[k][0] for k in names)
        raise ValueError(f"{cmd.tool}: {words} both name the model: give one")
    if "hf_file" in own and "hf" not in own:
        raise ValueError(f"{cmd.tool}: {own['hf_file'][0]} needs -hf OWNER/REPO")
    if not names:
        return
    word, value = own[names[0]]
    cmd.model_words = f"{word} {value}"
    if names[0] == "model":
        cmd.model = Path(value)
    elif names[0] == "url":
        cmd.model = value
    else:
        repo, _, quant = value.partition(":")
        if repo.count("/") != 1:
            raise ValueError(f"{word} {value}: write OWNER/REPO[:QUANT]")
        if "hf_file" in own:
            cmd.model = f"hf://{repo}/{own['hf_file'][1]}"
        else:
            cmd.model = f"hf://{repo}" + (f":{quant}" if quant else "")
