"""Passes over big graphs build many small acyclic objects; the cyclic GC only slows them."""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """No cyclic GC while a pass builds its many small objects (they form no cycles to find).

    On a 100k-node graph CPython's full collections, triggered by the objects a pass creates,
    re-scan every tensor of the graph and cost as much as the pass itself.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
