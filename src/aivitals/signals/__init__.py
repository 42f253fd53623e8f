"""The signal catalogue: every metric aivitals emits or understands.

**Usage**::

    from aivitals import signals
    spec = signals.get("model_inference_time_seconds")
    signals.translate("vllm:num_requests_waiting")   # ("queue_length", 1.0, (("queue", "engine"),))
"""

from __future__ import annotations

from ._aliases import ALIASES, DERIVED, FOREIGN_LABELS, alias_for, translate
from ._catalogue import (
    FAST_BUCKETS,
    LATENCY_BUCKETS,
    METRICS,
    SIZE_BUCKETS,
    TOKEN_BUCKETS,
    family_of,
    get,
    iter_metrics,
)
from ._errors import ERROR_CODES, ErrorCode, ErrorInfo, classify_exception
from ._prom import metric
from ._sample import Sample
from ._spec import Alias, Derived, Layer, MetricSpec, MetricType

__all__ = [
    "ALIASES",
    "DERIVED",
    "ERROR_CODES",
    "FAST_BUCKETS",
    "FOREIGN_LABELS",
    "LATENCY_BUCKETS",
    "METRICS",
    "SIZE_BUCKETS",
    "TOKEN_BUCKETS",
    "Alias",
    "Derived",
    "ErrorCode",
    "ErrorInfo",
    "Layer",
    "MetricSpec",
    "MetricType",
    "Sample",
    "alias_for",
    "classify_exception",
    "family_of",
    "get",
    "iter_metrics",
    "metric",
    "translate",
]
