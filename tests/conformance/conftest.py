"""Conformance tests compare ggmlrun with real ggml (ggml-python 0.0.45, the `conformance` extra).

Without it, every module here is reported as skipped, with the reason, instead of failing to
import. Every test collected here is marked `conformance` (select or deselect with -m).
"""

from __future__ import annotations

from pathlib import Path

import pytest

try:
    import ggml  # noqa: F401
    GGML_MISSING: str | None = None
except Exception as err:  # noqa: BLE001 - ImportError, or the shared library failing to load
    GGML_MISSING = (f"real ggml is not importable ({type(err).__name__}: {err}); "
                    "install it with: pip install -e '.[conformance]'")

HERE = Path(__file__).parent


if GGML_MISSING:
    class _SkippedModule(pytest.Module):
        def collect(self):
            pytest.skip(GGML_MISSING)

    def pytest_pycollect_makemodule(module_path, parent):
        return _SkippedModule.from_parent(parent, path=module_path)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.conformance)
