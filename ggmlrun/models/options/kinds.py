"""The kinds of value an option takes (models/options/table.py's rows): how each is read
from the command line's text or llama.cpp's, checked when given from Python, written into the
line to paste, shown in the help and put in JSON. A kind is the option's type and range, so
that a bound (llama.cpp's uint32, LLAMA_MAX_SEQ) or a spelling of a value (on/off, 3,1,
REGEX=BACKEND) is written once, here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ggmlrun.models.options.params import I32_MAX, compile_override, split_proportions


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
    """-fa on|off|auto as common/arg.cpp reads it (is_truthy, is_falsey, is_autoy): True,
    False, or None for auto (llama.cpp's default, resolved per placement)."""
    metavar = "[on|off|auto]"

    def read(self, text: str) -> bool | None:
        word = str(text).strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        if word in ("auto", "-1"):
            return None
        raise ValueError(f"{text!r} is neither on, off nor auto")

    def check(self, value) -> bool | None:
        return value if value is None or isinstance(value, bool) else self.read(value)

    def write(self, value) -> str:
        return "auto" if value is None else "on" if value else "off"


@dataclass(frozen=True)
class Choice(Kind):
    values: tuple[str, ...]

    @property
    def metavar(self) -> str:
        return "[" + "|".join(self.values) + "]"

    def read(self, text: str) -> str:
        if text not in self.values:
            raise ValueError(f"choose one of {', '.join(self.values)}")
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


FLT_MIN, FLT_MAX = 2.0**-126, (2 - 2.0**-23) * 2.0**127


def _llama_reads(parts) -> bool:
    """Whether llama.cpp takes these proportions as written: its -ts reads each with
    std::stof, which refuses a number past float32's range or below its smallest normal (0 is
    fine), and its float32 running sum must stay finite for the split points to mean anything."""
    from ggmlrun.core.util.float32 import f32

    acc = 0.0
    for p in parts:
        if p != 0 and not FLT_MIN <= p <= FLT_MAX:
            return False
        acc = f32(acc + f32(p))
    return math.isfinite(acc)


def split_text(parts) -> str:
    """-ts as ggmlrun prints it everywhere (the title, the JSON, the line to paste): the
    proportions as given (`--tensor-split 24,12` is `24,12`; fit's searched split is layers
    per device, `80,15`), each the shortest text that reads back to the same number. Only
    proportions llama.cpp could not read (past float32's range: 1e300,1e300) are rescaled, to
    small integers where a power-of-two scale makes them integers (those leave llama.cpp's
    float32 split points exactly as they were), else to a power-of-two scale."""
    parts = [float(p) for p in parts]
    if _llama_reads(parts):
        return ",".join(_number(p) for p in parts)
    parts = list(split_proportions(parts))
    for k in range(0, 64):
        scaled = [math.ldexp(p, k) for p in parts]
        if all(s == int(s) for s in scaled) and sum(scaled) < 2**24:
            ints = [int(s) for s in scaled]
            gcd = math.gcd(*ints) or 1
            return ",".join(str(n // gcd) for n in ints)
    return ",".join(_number(p) for p in parts)


def split_numbers(parts) -> list[int | float] | None:
    """split_text's proportions as JSON numbers (whole ones as integers: [24, 12])."""
    if parts is None:
        return None
    return [int(w) if w.lstrip("-").isdigit() else float(w)
            for w in split_text(parts).split(",")]


@dataclass(frozen=True)
class Split(Kind):
    """-ts proportions, kept as given (split_text's form: only proportions llama.cpp could not
    read are rescaled), so that a line written and read back is the same value."""
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
            split_proportions(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{value!r}: {err}") from None
        return tuple(float(x) for x in split_text(value).split(","))

    def write(self, value) -> str:
        return split_text(value)

    def json(self, value):
        return split_numbers(value)


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
class ModelName(Kind):
    """A MODEL as the command line names one (a path, a URL, hf://OWNER/REPO[:QUANT]): text,
    read by the loader, not here."""
    metavar = "MODEL"

    def read(self, text: str) -> str:
        if not str(text).strip():
            raise ValueError("give a model: a path, a URL or hf://OWNER/REPO")
        return str(text)

    def check(self, value) -> str:
        import os

        return self.read(os.fspath(value) if isinstance(value, os.PathLike) else value)


@dataclass(frozen=True)
class Devices(Kind):
    """-devd DEV,DEV,... or none (no device): backend names, in order; the names are checked
    against the backends where the model is planned."""
    metavar = "NAME,...|none"

    def read(self, text: str) -> tuple[str, ...]:
        text = str(text).strip()
        if text == "none":
            return ()
        names = tuple(n.strip() for n in text.split(","))
        if not all(names) or len(set(names)) != len(names):
            raise ValueError(f"{text!r}: give device names separated by commas, each once, "
                             f"or none")
        return names

    def check(self, value):
        if value is None or isinstance(value, str):
            return value if value is None else self.read(value)
        return self.read(",".join(value)) if value else ()

    def write(self, value) -> str:
        return ",".join(value) if value else "none"


@dataclass(frozen=True)
class Endpoints(Kind):
    """--rpc HOST:PORT,...: ggml rpc-servers, the devices (SPEC section 3)."""
    metavar = "HOST:PORT,..."

    def read(self, text: str) -> tuple[str, ...]:
        return tuple(str(text).split(","))

    def write(self, value) -> str:
        return ",".join(value)


@dataclass(frozen=True)
class Targets(Kind):
    """--fit-target MiB0,MiB1,...: what llama.cpp's own --fit keeps free per device, in MiB
    (common/arg.cpp splits on ',' and '/'; one value is every device's)."""
    metavar = "MiB,..."

    def read(self, text: str) -> tuple[int, ...]:
        parts = [p for p in str(text).replace("/", ",").split(",") if p.strip()]
        values = tuple(_whole(p) for p in parts)
        if not values or any(v < 0 for v in values):
            raise ValueError(f"{text!r}: MiB per device as whole numbers >= 0 (e.g. 1024 or "
                             f"2048,512)")
        return values

    def check(self, value):
        return self.read(value) if isinstance(value, str) else self.read(
            ",".join(str(v) for v in (value if isinstance(value, (tuple, list)) else (value,))))

    def write(self, value) -> str:
        return ",".join(str(v) for v in value)

    def json(self, value):
        return list(value)
