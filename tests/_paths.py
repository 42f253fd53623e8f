"""Where the tests' data lives: inside the repository, found from this file.

Nothing here reads outside the checkout, so a plain ``git clone`` runs the
whole suite (``tests/test_standalone.py`` keeps it so).
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: Real readings of an NVIDIA H200 recorded for this project (see its README.md).
H200 = FIXTURES / "gpu" / "h200"
