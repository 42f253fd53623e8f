"""The embedded time-series store, PromQL evaluation and the ``Backend`` protocol."""

from __future__ import annotations

from ._types import Backend, InstantSample, QueryResult, RangeSeries, ResultType

__all__ = ["Backend", "InstantSample", "QueryResult", "RangeSeries", "ResultType"]
