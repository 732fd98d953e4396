"""NumPy on first use: loading and checking a graph never imports it.

Why: a graph load (all of `validate`, the first phase of every command) is names, shapes and
dtypes in plain Python, yet `import numpy` takes ~0.1 s, a fifth of `validate` on 10k nodes.
So the modules a graph load imports (core/util, core/ir and its ops, core/frontend) take NumPy
from here, and NumPy loads the first time anything uses it: a kernel, generated data, a file
of values. docs/architecture.md ("NumPy on first use") gives the rules:

- `from ggmlrun.core.util.lazynumpy import np`, never `import numpy as np`;
- nothing at module level touches `np`: a value NumPy makes (a scalar type such as
  `F32 = np.float32`, a constant, a table of ufuncs, an ndarray subclass) is declared
  `F32 = numpy_later(lambda np: np.float32)`, or with `@numpy_later` on a function of `np`
  that returns it;
- the moment NumPy is imported, by anyone, `np` and every such value, in every ggmlrun
  module (imported copies included), are replaced by the real objects: a kernel reads a plain
  module global, as fast as `import numpy as np` would give it, and code that has an array
  (so NumPy is loaded) only ever sees real values.

Before that, a stand-in (`Later`) loads NumPy when an attribute of it is read or it is called
(`np.zeros(...)`, `F32(2.0)`), which is all that code without an array may do with it. Where
NumPy is already loaded (a program or a test imported it first), `np` and every `numpy_later`
value are the real objects from the start.
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
from typing import Any, Callable

_LOCK = threading.RLock()      # a `make` may use another value, so the same thread re-enters
_UNMADE = object()
_numpy = None                  # the numpy module, once its values are in place


class Later:
    """A NumPy value not made yet; reading an attribute of it, or calling it, loads NumPy."""

    __slots__ = ("_make", "_value")

    def __init__(self, make: Callable[[Any], Any]):
        self._make = make
        self._value = _UNMADE

    def value(self):
        if self._value is _UNMADE:
            with _LOCK:                      # made once: an ndarray subclass must be one class
                if self._value is _UNMADE:
                    self._value = self._make(_load())
        return self._value

    def __getattr__(self, name: str):
        return getattr(self.value(), name)

    def __call__(self, *args, **kwargs):
        return self.value()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<made when NumPy loads: {getattr(self._make, '__qualname__', self._make)}>"


def numpy_later(make: Callable[[Any], Any]):
    """`make(numpy)`: now if NumPy is loaded, else a `Later` that becomes it when NumPy loads."""
    if _numpy is not None or "numpy" in sys.modules:
        return make(_load())
    return Later(make)


def _load():
    if _numpy is None:
        import numpy         # while _Watch is on sys.meta_path, this puts the values in place

        if _numpy is None:   # NumPy was imported before this module began to watch
            _put_in_place(numpy)
    return _numpy


def _put_in_place(numpy) -> None:
    """Every `Later` a ggmlrun module holds as a global becomes its value."""
    global _numpy
    with _LOCK:
        _numpy = numpy
        if _Watch in sys.meta_path:
            sys.meta_path.remove(_Watch)
        for name, module in list(sys.modules.items()):
            if name.startswith("ggmlrun.") and module is not None:
                namespace = vars(module)
                for key, value in list(namespace.items()):
                    if type(value) is Later:
                        namespace[key] = value.value()


class _Watch:
    """On sys.meta_path until NumPy is imported: it gives the usual finder's spec with a loader
    that puts the values in place as the last step of that import, before the importer (ours,
    gguf's, a user's) gets the module."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "numpy":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenPutInPlace(spec.loader)
        return spec


class _ThenPutInPlace:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self.loader    # NumPy sees its own loader
        self.loader.exec_module(module)
        _put_in_place(module)


if "numpy" not in sys.modules:
    sys.meta_path.insert(0, _Watch)
np = numpy_later(lambda numpy: numpy)
