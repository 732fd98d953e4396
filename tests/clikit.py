"""Running the command line in-process, as the console script would, for tests."""

import contextlib
import io

from ggmlrun.cli import main


def invoke(*args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `ggmlrun ARGS`."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    return code, out.getvalue(), err.getvalue()
