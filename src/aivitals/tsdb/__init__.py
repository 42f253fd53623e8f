"""The embedded time-series store, PromQL evaluation and the ``Backend`` protocol.

::

    from aivitals.tsdb import Store
    store = Store(retention=3600)
    store.ingest_exposition(text, timestamp=time.time(), target="api:8000")
    store.query('sum by (le) (rate(http_request_duration_seconds_bucket[5m]))')
"""

from __future__ import annotations

from ._options import remote_options
from ._prometheus import PrometheusBackend
from ._remote import RemoteConnection
from ._store import AppendStats, Store
from ._time import DEFAULT_AGENT, parse_api_time, parse_duration, parse_time
from ._types import Backend, InstantSample, QueryResult, RangeSeries, ResultType

__all__ = [
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
]
