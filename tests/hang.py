"""A hang guard for tests that run ggmlrun in-process: a timeout, never a timing assertion.

A test that once hung (a walk of 2**24 steps, a quadratic pass, a FIFO read forever) says so
with `with no_hang("what"):` around the call. The limit is far above any healthy run on a slow,
loaded machine, so it fails only on a hang, never on speed; speed targets live in benchmarks/.
A test that runs ggmlrun as a child process gives `subprocess.run` a `timeout=` instead.
"""

from __future__ import annotations

import contextlib
import signal

HANG_S = 120


@contextlib.contextmanager
def no_hang(what: str, seconds: int = HANG_S):
    """Fail (AssertionError naming `what`) if the body runs past `seconds`."""
    def expire(signum, frame):
        raise AssertionError(f"{what}: still running after {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
