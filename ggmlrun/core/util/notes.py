"""One-line notes on stderr for choices the tool made for the user (a thread count capped, a
planner swapped past a size bound): they change no result, but a user should know."""

from __future__ import annotations

import sys


def note(text: str) -> None:
    sys.stderr.write(f"ggmlrun: note: {text}\n")
