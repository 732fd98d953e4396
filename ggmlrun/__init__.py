"""ggmlrun: ggml's scheduler, graph allocator and executor, rebuilt to be read and run."""

import os as _os
import signal as _signal
import sys as _sys

from ggmlrun.version import __version__  # noqa: E402,F401

# the Python API (docs/models.md, "ggmlrun as a library"): both import their machinery when
# called, so `import ggmlrun` loads two small modules more
from ggmlrun.api import fit, measure  # noqa: E402
from ggmlrun.core.util.errors import InputError, RunError  # noqa: E402


def _interrupted_at_startup(signum, frame):
    """Ctrl-C while the command line is still importing: one line, never a traceback.
    `cli.main` replaces this as soon as it runs."""
    _os.write(2, b"ggmlrun: interrupted\n")
    _os._exit(130)


# Commands that run no kernel need no BLAS thread pool. OpenBLAS (NumPy's BLAS) starts one
# thread per core as NumPy loads unless OPENBLAS_NUM_THREADS says otherwise: ~0.06 s of a 2-core
# machine's start-up. `validate` and `plan` of a graph file never load NumPy (core/util/
# lazynumpy.py); measure, dot, fit and every command on a model do. A user's value is kept.
_COMPUTES_NOTHING = ("validate", "plan", "measure", "fit", "dot")
# `validate` and `plan` build one graph, answer and leave (cli/main.py `_exit_now`). They leave
# almost no cyclic garbage (tens of objects, measured), yet the cyclic GC re-scans every tensor
# built so far as they build more: ~0.01 s of a 10k-node `validate`, ~0.25 s at 100k. So their
# process runs without it (the passes already pause it: core/util/gcpause.py).
_ONE_GRAPH_THEN_EXIT = ("validate", "plan")

# only when this process is the ggmlrun command itself, never when a program imports us
if _os.path.basename(_sys.argv[0] if _sys.argv else "") in ("ggmlrun", "-m"):
    _signal.signal(_signal.SIGINT, _interrupted_at_startup)
    if _sys.argv[1:2] and _sys.argv[1] in _COMPUTES_NOTHING:
        _os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if _sys.argv[1:2] and _sys.argv[1] in _ONE_GRAPH_THEN_EXIT:
        import gc as _gc

        _gc.disable()
