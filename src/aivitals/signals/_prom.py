"""Build prometheus_client metrics from catalogue entries.

Every package that emits a metric calls ``metric(name)`` instead of spelling
out the type, help, labels and buckets again, so the exposition always agrees
with the catalogue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.metrics import MetricWrapperBase

from ._catalogue import get
from ._spec import MetricType


def metric(
    name: str,
    *,
    registry: CollectorRegistry | None = REGISTRY,
    labels: Sequence[str] | None = None,
    buckets: Sequence[float] | None = None,
    namespace: str = "",
    **kwargs: Any,
) -> MetricWrapperBase:
    """A prometheus_client metric for the catalogue entry ``name``.

    ``labels`` and ``buckets`` override the catalogue's (a user may drop a
    label or set SLA-aligned buckets); ``registry=None`` creates an
    unregistered metric. Extra keyword arguments go to prometheus_client
    (``multiprocess_mode`` for gauges, for instance).
    """
    spec = get(name)
    labelnames = tuple(spec.labels if labels is None else labels)
    common: dict[str, Any] = {
        "documentation": spec.help,
        "labelnames": labelnames,
        "registry": registry,
        "namespace": namespace,
    }
    if spec.type is MetricType.COUNTER:
        return Counter(spec.name, **common, **kwargs)
    if spec.type is MetricType.GAUGE:
        return Gauge(spec.name, **common, **kwargs)
    if spec.type is MetricType.HISTOGRAM:
        chosen = tuple(buckets) if buckets is not None else (spec.buckets or ())
        return Histogram(spec.name, buckets=chosen, **common, **kwargs)
    base = spec.name[: -len("_info")] if spec.name.endswith("_info") else spec.name
    return Info(base, **common, **kwargs)
