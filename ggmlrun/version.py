"""ggmlrun's version, in a module of its own so that the command line can print it without
importing the package's `__init__` from below (pyproject.toml's version must equal it:
tests/test_startup.py)."""

__version__ = "0.1.0"
