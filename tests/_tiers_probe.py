"""A pytest plugin for tests/test_tiers.py: ``-p tests._tiers_probe`` prints one line
per collected test, ``TIER <check|rest> <its tier marks> <node id>``, after ``-m``
has chosen; ``check`` is what ``-m`` kept."""

from __future__ import annotations

import pytest

_MARKS = ("integration", "slow")


def _line(tier: str, item: pytest.Item) -> str:
    marks = ",".join(m for m in _MARKS if item.get_closest_marker(m)) or "-"
    return f"TIER {tier} {marks} {item.nodeid}"


def pytest_deselected(items: list[pytest.Item]) -> None:
    for item in items:
        print(_line("rest", item))


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        print(_line("check", item))
