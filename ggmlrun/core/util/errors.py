"""One exception hierarchy. Every error carries what the user needs to find the culprit.

The CLI turns an `InputError` into exit 2 and a `RunError` into exit 1, printing `str(error)`:
one line of the form ``FILE:LINE: node 'h': what is wrong; how to fix it``.
"""

from __future__ import annotations


class GgmlrunError(Exception):
    """Base class; `exit_code` is what the command line returns for it."""

    exit_code = 1

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 culprit: str | None = None):
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.culprit = culprit

    def located(self, *, file: str | None = None, line: int | None = None,
                culprit: str | None = None) -> "GgmlrunError":
        """Fill in location fields a lower layer could not know; keeps what is already set."""
        self.file = self.file or file
        self.line = self.line or line
        self.culprit = self.culprit or culprit
        return self

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        who = f"{self.culprit}: " if self.culprit else ""
        return f"{where}{who}{self.message}"


class InputError(GgmlrunError):
    """Bad input: a malformed graph or backends file, bad params, a bad --input (exit 2)."""

    exit_code = 2


class RunError(GgmlrunError):
    """A failure while running a valid graph (exit 1)."""

    exit_code = 1


class CapacityError(RunError):
    """A backend's weights plus arena do not fit in its `memory`."""


def did_you_mean(name: str, known, ask: bool = False) -> str:
    """All the alternatives, the three closest first ('matmul' finds 'mul_mat'), for 'unknown X';
    `ask` adds the closest as a question: "known: mul_mat, ...; did you mean 'mul_mat'?" (after
    the list, so that "unknown op 'x'; known: ..." reads as it always has)."""
    from difflib import SequenceMatcher

    def squash(text: str) -> str:
        return "".join(sorted(text.replace("_", "").lower()))

    def likeness(candidate: str) -> float:
        return max(SequenceMatcher(None, name, candidate).ratio(),
                   SequenceMatcher(None, squash(name), squash(candidate)).ratio())

    known = sorted(known)
    if len(name) > 64:      # no real name is this long; comparing it would cost seconds
        return "known: " + ", ".join(known)
    close = [k for k in sorted(known, key=likeness, reverse=True)[:3] if likeness(k) >= 0.5]
    question = f"; did you mean '{close[0]}'?" if ask and close else ""
    return "known: " + ", ".join(close + [k for k in known if k not in close]) + question


def missing_file_hint(path) -> str:
    """'; the nearest name there is 'embed.npy'' for a file that is not there, or ''."""
    import difflib
    import os

    folder, name = os.path.split(str(path))
    try:
        names = [n for n in os.listdir(folder or ".") if not n.startswith(".")][:10_000]
    except OSError:
        return ""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return f"; the nearest name in {folder or '.'}/ is '{close[0]}'" if close else ""


class CheckError(RunError):
    """`run --check`: the planned run disagrees with the reference evaluator."""
