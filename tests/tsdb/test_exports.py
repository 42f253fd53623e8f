"""The deliberate public surface of aivitals.tsdb."""

from __future__ import annotations

import aivitals.tsdb as tsdb


def _isort_style(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_all_is_sorted_and_complete() -> None:
    assert tsdb.__all__ == sorted(tsdb.__all__, key=_isort_style)
    assert set(tsdb.__all__) == {
        "DEFAULT_AGENT",
        "AppendStats",
        "Backend",
        "InstantSample",
        "PrometheusBackend",
        "QueryResult",
        "RangeSeries",
        "RemoteConnection",
        "ResultType",
        "Store",
        "parse_api_time",
        "parse_duration",
        "parse_time",
        "remote_options",
    }
    for name in tsdb.__all__:
        assert getattr(tsdb, name) is not None
