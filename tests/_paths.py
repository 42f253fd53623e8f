"""Where the tests' data lives: inside the repository, found from this file.

Nothing here reads outside the checkout, so a plain ``git clone`` runs the
whole suite (``tests/test_standalone.py`` keeps it so).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

#: The checkout's root.
REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: Real readings of an NVIDIA H200 recorded for this project (see its README.md).
H200 = FIXTURES / "gpu" / "h200"


def load_script(relative: str, name: str) -> ModuleType:
    """A script of the checkout that is not in a package (``benchmarks/``, ``deploy/``),
    loaded as module ``name`` from ``REPO / relative``."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
