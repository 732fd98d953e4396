"""The one way out: every error becomes one line and an exit code (2 bad input, 1 a failure
while running, 130 interrupted); a traceback only with --debug."""

from __future__ import annotations

import errno
import os
import sys

import click

from ggmlrun.core.util.errors import GgmlrunError, InputError
from ggmlrun.cli.common import forget_json, json_emitted, stderr, MAX_MESSAGE, cli


# every catchable signal whose default action ends the process (signal(7)): each leaves no
# temporary file behind (a closed terminal sends SIGHUP, Ctrl-\\ SIGQUIT, a CPU limit SIGXCPU,
# timers SIGALRM/SIGVTALRM/SIGPROF, other programs SIGUSR1/SIGUSR2); SIGINT is
# KeyboardInterrupt, handled in `main`. Python itself ignores SIGPIPE and SIGXFSZ; SIGSEGV,
# SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGSYS and SIGTRAP are faults or debuggers, not requests.
CLEANUP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGXCPU",
                   "SIGPROF", "SIGVTALRM", "SIGIO", "SIGPWR", "SIGSTKFLT")


def _on_sigterm(signum, frame):
    """A signal that ends the process by default: leave no temporary file behind, then exit
    as a process ended by that signal does (128 + its number)."""
    from ggmlrun.core.util.atomic import remove_temp_files

    remove_temp_files()
    raise SystemExit(128 + signum)


def _install_signal_handlers() -> None:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for name in CLEANUP_SIGNALS:
            if hasattr(signal, name):          # SIGHUP and SIGQUIT are POSIX only
                signal.signal(getattr(signal, name), _on_sigterm)


def main(argv: list[str] | None = None) -> None:
    """The command (`argv` None: this process is ggmlrun, and its exit skips the interpreter's
    teardown); with `argv`, a call from a program or a test, which goes on afterwards."""
    as_program = argv is None
    argv = sys.argv[1:] if argv is None else argv
    try:
        try:
            _install_signal_handlers()
            from ggmlrun.core.util.inputs import forget_reads

            forget_reads()
            _main(argv)
        except KeyboardInterrupt:
            _interrupted()
    except SystemExit as done:
        if as_program:
            _exit_now(done.code)
        raise


def _exit_now(code) -> None:
    """Leave without the interpreter's teardown (freeing a loaded graph object by object, every
    module, NumPy's thread pool): ~0.045 s after a 10k-node `validate` of ~0.6 s, ~0.08 s at 100k.
    Safe here: every output file was written atomically and closed before the command returned,
    no atexit hook of ours is pending, and both streams are flushed first. A stream that cannot
    be flushed (a closed pipe) takes the usual exit, which reports it as before."""
    if code is None or isinstance(code, int):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            return
        os._exit(code or 0)


def _interrupted() -> None:
    from ggmlrun.core.util.atomic import remove_temp_files

    remove_temp_files()
    click.echo("ggmlrun: interrupted", err=True)
    sys.exit(130)


def _stdout_broken(err: OSError) -> bool:
    """Whether the failed write was to standard output (click's echo and rich's console hold it
    where they write: the innermost frame). If so, stdout is pointed at /dev/null so that the
    interpreter's own flush at exit adds no second message."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    names = tb.tb_frame.f_locals
    held = list(names.values()) + [getattr(names.get("self"), "file", None)]
    streams = [s for s in (sys.stdout, sys.__stdout__, getattr(sys.stdout, "buffer", None))
               if s is not None]
    if not any(value is stream for value in held for stream in streams):
        return False
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return True


def _main(argv: list[str]) -> None:
    debug = "--debug" in argv
    forget_json()
    as_json = "--json" in argv
    import warnings

    try:
        with warnings.catch_warnings():
            if not debug:
                # NumPy's floating-point warnings (a NaN output summed, an overflowing cast)
                # are about values the tables already show as inf/nan; a kernel's own are
                # silenced where they run. --debug shows them.
                warnings.simplefilter("ignore", RuntimeWarning)
            cli.main(args=argv, prog_name="ggmlrun", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as err:
        fail(_option_error(err), 2 if isinstance(err, click.UsageError) else err.exit_code,
             as_json)
    except click.exceptions.Abort as err:
        if isinstance(err.__context__, KeyboardInterrupt):
            _interrupted()
        stderr().print("ggmlrun: aborted")
        sys.exit(1)
    except GgmlrunError as err:
        if debug:
            raise
        fail(str(err), err.exit_code, as_json)
    except OSError as err:
        if debug:
            raise
        if not _stdout_broken(err):
            fail(f"internal error: {type(err).__name__}: {err} (run with --debug for a "
                 "traceback)", 1, as_json)
        if err.errno == errno.EPIPE:   # the reader went away (`| head`): nothing to tell it
            sys.exit(1)
        # no JSON object: stdout is what failed
        fail(f"cannot write to standard output: {err.strerror or err}", 1)
    except MemoryError:       # the checks before each allocation missed one: still one line
        if debug:
            raise
        fail("out of memory: the machine could not give what this run needs; use a smaller "
             "graph or free memory", 1, as_json)
    except Exception as err:  # noqa: BLE001 - one line for anything unexpected
        if debug:
            raise
        fail(f"internal error: {type(err).__name__}: {err} (run with --debug for a traceback)", 1,
             as_json)
    sys.exit(0)


def _option_error(err: click.ClickException) -> str:
    """click's message as one line, with where to read more in place of its usage block."""
    message = " ".join(err.format_message().split()).removesuffix(".")
    ctx = getattr(err, "ctx", None)
    if isinstance(err, click.UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


def fail(message: str, code: int, as_json: bool = False) -> None:
    """The one way out of a failed command: one `ggmlrun: error:` line on stderr, and with
    --json the same message as the command's one JSON object on stdout (SPEC section 4), unless
    the command already printed its object (a result that does not fit, then exit 1)."""
    from ggmlrun.core.util.fmt import clip

    # a huge value or name in a message is shown cut, so an error stays a readable line
    # (a file path, up to 256 characters, stays whole)
    message = " ".join(word if len(word) <= 256 else clip(word) for word in message.split(" "))
    if len(message) > MAX_MESSAGE:  # a huge value printed in full: keep where, and the advice
        message = f"{message[:MAX_MESSAGE - 300]} … {message[-250:]}"
    if as_json and not json_emitted():
        import json

        try:
            click.echo(json.dumps({"error": {"message": message, "exit": code}}))
        except OSError as err:       # stdout itself fails (a full disk): stderr still says why
            _stdout_broken(err)
    click.echo(f"ggmlrun: error: {message}", err=True)
    sys.exit(code)


__all__ = ["cli", "main", "InputError"]
