"""The console tests' browser: one headless Chromium per test module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ._browser import chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver
