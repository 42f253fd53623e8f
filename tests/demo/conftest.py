from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def demo_models():  # type: ignore[no-untyped-def]
    """The two demo models, loaded once per test session (seconds on CPU)."""
    from aivitals.demo import DemoConfig, DemoModels

    return DemoModels.load(DemoConfig())
