"""Click commands only: parse, call the core, hand results to the report layer.

Data goes to stdout, diagnostics to stderr. Every error leaves through `main()`: one line, exit
2 for bad input, 1 for a failure while running, a traceback only with --debug. One module per
family of commands; importing them registers them on the `cli` group.
"""

from ggmlrun.cli import fit_command, graph_commands, tools  # noqa: F401  (they register commands)
from ggmlrun.cli.common import cli
from ggmlrun.cli.main import fail, main
from ggmlrun.core.util.errors import InputError

__all__ = ["cli", "main", "fail", "InputError"]
