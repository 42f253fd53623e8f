"""One metric family per catalogue name per registry, built once.

Several middlewares, inference contexts and queues may share a registry;
prometheus_client refuses to register a name twice, so every part asks here.
Gauges get the multiprocess mode that makes sense when uvicorn or gunicorn
runs several workers (in-flight counts add up; a load time is the latest).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from .. import signals

__all__ = ["GAUGE_MODES", "family", "multiprocess_dir"]

#: prometheus_client multiprocess_mode per gauge (default "livesum": a gauge
#: of things in progress adds up over the live workers).
GAUGE_MODES: dict[str, str] = {
    "model_load_time_seconds": "livemostrecent",
    "queue_capacity": "livemax",
    "worker_pool_max_workers": "livesum",
    "kv_cache_usage_ratio": "livemax",
    "model_info": "livemax",
}

_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)
_UNREGISTERED: dict[str, Any] = {}
_LOCK = threading.Lock()


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when multiprocess mode is on, else None."""
    # prometheus_client still honours the lower-case spelling too
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get(
        "prometheus_multiproc_dir"  # noqa: SIM112
    )


def family(name: str, registry: CollectorRegistry | None = REGISTRY) -> Any:
    """The prometheus_client metric for catalogue entry ``name`` in ``registry``.

    **Usage**::

        hist = family("model_inference_time_seconds", registry)
        hist.labels("m", "v1", "0").observe(0.12)
    """
    with _LOCK:
        cache = _UNREGISTERED if registry is None else _BY_REGISTRY.setdefault(registry, {})
        metric = cache.get(name)
        if metric is None:
            from ._multiprocess import ensure_multiprocess

            ensure_multiprocess()  # a multi-worker gunicorn: files before the first metric
            metric = _build(name, registry)
            cache[name] = metric
        return metric


def _build(name: str, registry: CollectorRegistry | None) -> Any:
    spec = signals.get(name)
    if spec.type is not signals.MetricType.INFO and not multiprocess_dir():
        from ._fast import FastFamily

        fast = FastFamily(spec)
        if registry is not None:
            try:
                registry.register(fast)
            except ValueError:
                return _existing(registry, name)
        return fast
    if spec.type is signals.MetricType.GAUGE:
        return signals.metric(
            name, registry=registry, multiprocess_mode=GAUGE_MODES.get(name, "livesum")
        )
    if spec.type is signals.MetricType.INFO and multiprocess_dir():
        # Info does not work in multiprocess mode; a gauge of 1 exposes the same text.
        return Gauge(
            name,
            spec.help,
            labelnames=spec.labels,
            registry=registry,
            multiprocess_mode="livemax",
        )
    try:
        return signals.metric(name, registry=registry)
    except ValueError:
        if registry is None:
            raise
        return _existing(registry, name)


def _existing(registry: CollectorRegistry, name: str) -> Any:
    """The family another package (protect, the demo) already registered under ``name``.

    Same catalogue entry, same labels: sharing it is what the catalogue is for.
    """
    collector = registry._names_to_collectors.get(name)
    if collector is None:
        raise ValueError(f"{name} is registered in a form aivitals cannot share")
    return collector
