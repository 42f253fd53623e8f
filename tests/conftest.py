from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the repository: datasets and fixtures, never copied in."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not found (datasets and fixtures live beside the repo)")
    return SHARED
