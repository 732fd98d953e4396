"""The model options, each once: its ggmlrun flag, its llama.cpp spellings (as common/arg.cpp
spells them), its group, its kind of value (which gives the type, range and how it is read
and written) and its help. The click options (cli/model_options.py), ModelOptions from the
command line's or the Python API's values, the line to paste and its parser
(command_line.py) and the options' JSON are all made from this table, so an option added
here reaches every one of them, and a spelling or a range is never written twice.

The defaults are ModelOptions' (params.py: the one struct the builder, placement and reserve
read, as llama.cpp's params structs are); a row reads its default from there. The groups are
llama.cpp's split of the same options: `model` (llama_model_params: where the weights go),
`context` (llama_context_params: the KV cache and the compute buffers), `server`
(common_params: what common/arg.cpp turns into the other two, and the devices), `ggml`
(ggmlrun's own or a ggml build option: no llama.cpp spelling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ggmlrun.models.options.params import (I32_MAX, KV_TYPES, LLAMA_MAX_SEQ, U32_MAX,
                                            ModelOptions, compile_override, split_proportions)

_FIELD_DEFAULTS = {f.name: f.default for f in fields(ModelOptions)}
_FROM_FIELD = object()      # a row whose default is ModelOptions' field of the same name


# --- kinds of value: how a value is read from text, checked, written and shown ------------------
class Kind:
    metavar = "VALUE"
    takes_value = True      # False: a switch, given or not
    repeatable = False      # True: each use adds one item to a tuple

    def read(self, text: str):
        """A value from command-line text; ValueError saying what is wrong."""
        raise NotImplementedError

    def check(self, value):
        """A value given from Python (the API): text is read as the command line reads it."""
        return self.read(value) if isinstance(value, str) else value

    def read_llama(self, text: str):
        """A value as llama.cpp's common/arg.cpp reads the text (a repeatable kind: a tuple
        of items)."""
        return self.read(text)

    def write(self, value) -> str:
        return str(value)

    def show(self, value) -> str:
        """The value in the help's "default ..." words."""
        return self.write(value)

    def json(self, value):
        return value


def _whole(text) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


@dataclass(frozen=True)
class Count(Kind):
    lo: int
    hi: int
    why: str = ""           # whose bound hi is, for the error
    metavar: str = "N"

    def read(self, text: str) -> int:
        return self.check(_whole(text))

    def check(self, value) -> int:
        if isinstance(value, str):
            value = _whole(value)
        if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi:
            raise ValueError(f"{value!r} is not a whole number from {self.lo} to {self.hi}"
                             + (f" ({self.why})" if self.why else ""))
        return value


@dataclass(frozen=True)
class Switch(Kind):
    """On or off with no value; giving it turns the field away from its default."""
    takes_value = False
    metavar = ""

    def check(self, value) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not True or False")
        return value



_TRUE, _FALSE = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


@dataclass(frozen=True)
class OnOff(Kind):
    """A switch spelled with its value (-fa on), as llama.cpp's is_truthy / is_falsey read it."""
    metavar = "[on|off]"

    def read(self, text: str) -> bool:
        word = str(text).strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        if word in ("auto", "-1"):
            raise ValueError("auto (llama.cpp's default) is not planned for yet: give on or off")
        raise ValueError(f"{text!r} is neither on nor off")

    def check(self, value) -> bool:
        return value if isinstance(value, bool) else self.read(value)

    def write(self, value) -> str:
        return "on" if value else "off"


@dataclass(frozen=True)
class Choice(Kind):
    values: tuple[str, ...]

    @property
    def metavar(self) -> str:
        return "[" + "|".join(self.values) + "]"

    def read(self, text: str) -> str:
        if text not in self.values:
            raise ValueError(f"{text!r} is not one of {', '.join(self.values)}")
        return text


@dataclass(frozen=True)
class Layers(Kind):
    """-ngl: a layer count, or every layer (None); llama.cpp's `auto` is read as every layer."""
    metavar = "N|all"

    def read(self, text: str) -> int | None:
        if str(text).strip().lower() in ("all", "auto"):
            return None
        try:
            return self.check(int(text))
        except ValueError:
            raise ValueError(f"{text!r} is neither a layer count (0 to {I32_MAX}, llama.cpp's "
                             f"int32) nor 'all'") from None

    def check(self, value) -> int | None:
        if value is None or isinstance(value, str):
            return value if value is None else self.read(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= I32_MAX:
            raise ValueError(f"{value!r} is neither a layer count (0 to {I32_MAX}, llama.cpp's "
                             f"int32) nor 'all'")
        return value

    def write(self, value) -> str:
        return "all" if value is None else str(value)


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


@dataclass(frozen=True)
class Split(Kind):
    """-ts proportions, kept as the line writes them (split_text's form, scaled by
    split_proportions), so that 6,3 and 2,1 are one value, as they are one placement."""
    metavar = "A,B,..."

    def read(self, text: str) -> tuple[float, ...]:
        try:
            parts = tuple(float(v) for v in str(text).replace("/", ",").split(","))
        except ValueError:
            raise ValueError(f"{text!r}: give one non-negative number per device, "
                             f"e.g. 3,1") from None
        return self.check(parts)

    def check(self, value) -> tuple[float, ...] | None:
        if value is None or isinstance(value, str):
            return value if value is None else self.read(value)
        try:
            once = split_proportions(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{value!r}: {err}") from None
        return split_proportions(float(x) for x in split_text(once).split(","))

    def write(self, value) -> str:
        return split_text(value)

    def json(self, value):
        return None if value is None else [float(x) for x in split_text(value).split(",")]


@dataclass(frozen=True)
class Overrides(Kind):
    """-ot REGEX=BACKEND, in order (the first match wins); each rule's regex as RE2 takes it."""
    metavar = "REGEX=BACKEND"
    repeatable = True

    def read(self, text: str) -> tuple[str, str]:
        pattern, eq, backend = str(text).rpartition("=")
        if not eq or not pattern or not backend:
            raise ValueError(f"{text!r}: write REGEX=BACKEND, e.g. 'ffn_.*=CPU'")
        try:
            compile_override(pattern)
        except ValueError as err:
            raise ValueError(f"the pattern '{pattern}' (in {text!r}) is not a regular "
                             f"expression RE2 takes: {err}") from None
        return (pattern, backend)

    def check(self, value) -> tuple[tuple[str, str], ...]:
        if isinstance(value, str):
            raise ValueError(f"{value!r}: give a list of REGEX=BACKEND rules, not one string")
        rules = []
        for item in value:
            text = item if isinstance(item, str) else "=".join(item)
            rules.append(self.read(text))
        return tuple(rules)

    def read_llama(self, text: str) -> tuple[tuple[str, str], ...]:
        """llama.cpp's -ot takes a comma-separated list of rules, each split at its first
        '=' (parse_tensor_buffer_overrides)."""
        rules = []
        for item in str(text).split(","):
            pattern, eq, backend = item.partition("=")
            rules.append(self.read(f"{pattern}={backend}") if eq else self.read(item))
        return tuple(rules)

    def write(self, value) -> str:
        return f"{value[0]}={value[1]}"

    def show(self, value) -> str:
        return "none"

    def json(self, value):
        return [list(rule) for rule in value]


@dataclass(frozen=True)
class LoadMode(Kind):
    """llama.cpp's -lm/--load-mode (which replaced --no-mmap/--mmap): none is --no-mmap, mmap
    and auto map the file; mlock and dio are not modelled."""
    metavar = "MODE"

    def read(self, text: str) -> bool:
        if text in ("none", "mmap", "auto"):
            return text == "none"
        raise ValueError(f"load mode {text!r} is not modelled: give none, mmap or auto")


@dataclass(frozen=True)
class Endpoints(Kind):
    """--rpc HOST:PORT,...: ggml rpc-servers, the devices (SPEC section 3)."""
    metavar = "HOST:PORT,..."

    def read(self, text: str) -> tuple[str, ...]:
        return tuple(str(text).split(","))

    def write(self, value) -> str:
        return ",".join(value)


# --- the table ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    name: str                               # ModelOptions' field; the API's keyword
    kind: Kind
    group: str                              # model | context | server | ggml (module docstring)
    help: str
    flag: str | None = None                 # ggmlrun's; None: llama.cpp's only
    llama: tuple[tuple[str, ...], ...] = () # each llama.cpp option setting it: its spellings,
                                            # the one the line writes first
    llama_off: tuple[str, ...] = ()         # llama.cpp's spellings that set a switch back
    dest: str | None = None                 # the click parameter, where not `name`
    default_text: str | None = None         # the default in words, where the value cannot say it
    always: bool = False                    # written even at its default (llama.cpp's differs)
    shared: bool = False                    # its flag is declared with the graph files' options
    own_default: object = _FROM_FIELD       # only for a row ModelOptions has no field for

    @property
    def field(self) -> bool:
        return self.own_default is _FROM_FIELD

    @property
    def default(self):
        return _FIELD_DEFAULTS[self.name] if self.field else self.own_default

    @property
    def spelled(self) -> str:
        """llama.cpp's spellings, for the help: -c/--ctx-size."""
        return ", ".join("/".join(s) for s in self.llama)

    @property
    def default_words(self) -> str:
        """A switch's flag is never given by default (--no-op-offload: op offload on)."""
        if not self.kind.takes_value:
            return "off"
        return self.default_text or self.kind.show(self.default)

    def help_text(self) -> str:
        """The click help: `[models]` for an option only models take (a shared one applies
        to graph files too)."""
        where = f" (llama.cpp {self.spelled})" if self.llama else ""
        tag = "" if self.shared else "[models] "
        return f"{tag}{self.help}{where}; default {self.default_words}."


OPTIONS: tuple[Option, ...] = (       # in the order the line to paste writes them
    Option("ngl", Layers(), "model", "Layers on the devices, or 'all'; the output layer counts "
           "as one", flag="--ngl", llama=(("-ngl", "--gpu-layers", "--n-gpu-layers"),),
           default_text="all", always=True),
    Option("ctx", Count(1, U32_MAX, "llama.cpp's uint32"), "context", "Context length",
           flag="--ctx", dest="ctx_size", llama=(("-c", "--ctx-size"),),
           default_text="the model's, at most 4096", always=True),
    Option("flash_attn", OnOff(), "context", "Flash attention", flag="--flash-attn",
           llama=(("-fa", "--flash-attn"),), always=True),
    Option("batch", Count(1, U32_MAX, "llama.cpp's uint32"), "context",
           "Logical batch: -ub is clamped to it, so it is written only for a larger -ub",
           llama=(("-b", "--batch-size"),), own_default=2048),
    Option("ubatch", Count(1, U32_MAX, "llama.cpp's uint32"), "context",
           "Tokens the graph is reserved for, at most --ctx", flag="--ubatch",
           llama=(("-ub", "--ubatch-size"),)),
    Option("kv_type", Choice(KV_TYPES), "context", "KV cache type, K and V", flag="--kv-type",
           llama=(("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v"))),
    Option("no_kv_offload", Switch(), "context", "Keep the KV cache on the CPU",
           flag="--no-kv-offload", llama=(("-nkvo", "--no-kv-offload"),),
           llama_off=("-kvo", "--kv-offload")),
    Option("tensor_split", Split(), "model", "Layer proportions over the non-CPU backends in "
           "order", flag="--tensor-split", llama=(("-ts", "--tensor-split"),),
           default_text="by device memory"),
    Option("overrides", Overrides(), "model", "Weights matching REGEX go to BACKEND, "
           "repeatable; the first match wins", flag="--override-tensor", dest="tensor_overrides",
           llama=(("-ot", "--override-tensor"),)),
    Option("op_offload", Switch(), "context", "Never move a CPU-weight op to a device for its "
           "batch", flag="--no-op-offload", dest="no_op_offload",
           llama=(("--no-op-offload",),), llama_off=("--op-offload",), shared=True),
    Option("rpc", Endpoints(), "server", "ggml rpc-servers as devices (from the backends)",
           llama=(("--rpc",),), own_default=()),
    Option("swa_full", Switch(), "context", "Sliding-window layers get a full-size KV cache "
           "(off: a window's worth plus one ubatch)", flag="--swa-full",
           llama=(("--swa-full",),)),
    Option("cpu_moe", Switch(), "server", "Keep every expert tensor of a mixture of experts on "
           "the CPU", flag="--cpu-moe", llama=(("--cpu-moe", "-cmoe"),)),
    Option("n_cpu_moe", Count(0, I32_MAX, "llama.cpp's int32"), "server", "Keep the expert "
           "tensors of the first N layers on the CPU (fit: the fewest that fit)",
           flag="--n-cpu-moe", llama=(("--n-cpu-moe", "-ncmoe"),)),
    Option("parallel", Count(1, LLAMA_MAX_SEQ, "llama.cpp's LLAMA_MAX_SEQ"), "context",
           "Sequences the context serves (n_seq_max): an output buffer each; with "
           "--kv-unified one shared cache", flag="--parallel", llama=(("-np", "--parallel"),)),
    Option("kv_unified", Switch(), "context", "One KV cache for all --parallel sequences",
           flag="--kv-unified", llama=(("-kvu", "--kv-unified"),),
           llama_off=("-no-kvu", "--no-kv-unified")),
    Option("no_mmap", Switch(), "model", "CPU weights allocated, not memory-mapped",
           flag="--no-mmap", llama=(("--no-mmap",),), llama_off=("--mmap",)),
    Option("load_mode", LoadMode(), "model", "-lm none is --no-mmap; read, never written",
           llama=(("-lm", "--load-mode"),), own_default=None),
    Option("sched_copies", Count(1, 64), "ggml", "ggml's GGML_SCHED_MAX_COPIES, a build "
           "option: the copies of every input the scheduler keeps when llama.cpp turns on "
           "pipeline parallelism (every layer over 2+ devices); 1 turns it off",
           flag="--sched-copies"),
    Option("ggml", Choice(("0.25", "0.15")), "ggml", "Whose scheduler and allocator rules: "
           "ggml 0.25.3 (llama.cpp's) or 0.15.3", flag="--ggml", shared=True),
)
BY_NAME = {o.name: o for o in OPTIONS}
assert {o.name for o in OPTIONS if o.field} == set(_FIELD_DEFAULTS), "a field without a row"


def check_values(given: dict) -> dict:
    """Python values by option name (the API's keywords), checked and read as the command
    line reads its text; ValueError naming the option. Only ModelOptions' fields."""
    out = {}
    for name, value in given.items():
        option = BY_NAME.get(name)
        if option is None or not option.field:
            known = ", ".join(o.name for o in OPTIONS if o.field)
            raise ValueError(f"no option {name!r}; the options: {known}")
        try:
            out[name] = option.default if value is None else option.kind.check(value)
        except ValueError as err:
            raise ValueError(f"{name}={value!r}: {err}") from None
    return out


def make_options(values: dict) -> ModelOptions:
    """ModelOptions from checked values by name; a value left out or None is the default."""
    return ModelOptions(**{name: value for name, value in values.items()
                           if value is not None and BY_NAME[name].field})


def given(value, takes_value: bool = True) -> bool:
    """Whether click got the option: not None, no repeat (()) or, for a switch, not False;
    0 and off are values given (`--ngl 0`, `--flash-attn off`), though 0 == False."""
    return value is not None and value != () and (takes_value or value is not False)


def from_cli(kw: dict) -> dict:
    """The command line's values (by click parameter) by option name: a switch given is the
    field away from its default, an option not given is left out."""
    out = {}
    for option in OPTIONS:
        value = kw.get(option.dest or option.name)
        if not option.flag or not given(value, option.kind.takes_value):
            continue
        out[option.name] = (not option.default) if not option.kind.takes_value else value
    return out


def options_json(opts: ModelOptions) -> dict:
    """The options as JSON, by name (the API's keywords)."""
    return {o.name: o.kind.json(getattr(opts, o.name)) for o in OPTIONS if o.field}


def check_fields(opts: ModelOptions) -> None:
    """Each field of a ModelOptions made in code (not read by the table) in its range, as the
    command line would have checked it: ValueError naming the flag."""
    for option in OPTIONS:
        value = getattr(opts, option.name) if option.field else None
        if value is not None and value != option.default:
            try:
                option.kind.check(value)
            except ValueError as err:
                raise ValueError(f"{option.flag or option.name} {value!r}: {err}") from None
