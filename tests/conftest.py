"""The tiers: ``make check`` runs the unit tests, ``make test`` all (see ``tests/_tiers.py``)."""

from __future__ import annotations

import pytest

from tests import _tiers


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks added here
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _tiers.mark(items)
