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


def did_you_mean(name: str, known) -> str:
    """The alternatives, closest first, for 'unknown X' messages."""
    import difflib

    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=3)
    rest = [k for k in known if k not in close]
    shown = close + rest
    text = ", ".join(shown[:12]) + (", ..." if len(shown) > 12 else "")
    return f"known: {text}"


class CheckError(RunError):
    """`run --check`: the planned run disagrees with the reference evaluator."""
