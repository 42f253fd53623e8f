"""The protection layer's metrics, built once per registry from the catalogue.

Several middlewares (and several apps in one process) share one registry;
building the metrics twice would raise "Duplicated timeseries", so they are
cached per registry.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from aivitals import signals

__all__ = ["ProtectMetrics", "metrics_for"]


@dataclass(frozen=True, slots=True)
class ProtectMetrics:
    input_rejections: Any
    admission_limit: Any
    admission_in_flight: Any
    admission_queue_length: Any
    admission_queue_wait: Any
    admission_rejections: Any
    request_timeouts: Any
    queue_length: Any
    queue_capacity: Any
    queue_wait: Any
    health_check_up: Any
    service_ready: Any

    @classmethod
    def build(cls, registry: CollectorRegistry | None) -> ProtectMetrics:
        def make(name: str) -> Any:
            try:
                return signals.metric(name, registry=registry)
            except ValueError:
                # The instrumentation may have built the shared queue_* families
                # in this registry already: use theirs (same catalogue labels).
                assert registry is not None
                return registry._names_to_collectors[signals.get(name).name]

        return cls(
            input_rejections=make("input_rejections_total"),
            admission_limit=make("admission_concurrency_limit"),
            admission_in_flight=make("admission_in_flight"),
            admission_queue_length=make("admission_queue_length"),
            admission_queue_wait=make("admission_queue_wait_seconds"),
            admission_rejections=make("admission_rejections_total"),
            request_timeouts=make("request_timeouts_total"),
            queue_length=make("queue_length"),
            queue_capacity=make("queue_capacity"),
            queue_wait=make("queue_wait_seconds"),
            health_check_up=make("health_check_up"),
            service_ready=_OnFirstSet(lambda: make("service_ready")),
        )


class _OnFirstSet:
    """A gauge registered when it is first set: an unlabelled gauge exports 0 from the
    moment it exists, and ``service_ready 0`` from a service that never evaluates its
    readiness (guard and admission control only, or before the first ``/readyz``)
    pages ServiceNotReady for a check nobody ran."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._gauge: Any = None
        self._lock = threading.Lock()

    def set(self, value: float) -> None:
        with self._lock:
            if self._gauge is None:
                self._gauge = self._make()
        self._gauge.set(value)


_LOCK = threading.Lock()
_CACHE: weakref.WeakKeyDictionary[CollectorRegistry, ProtectMetrics] = weakref.WeakKeyDictionary()


def metrics_for(registry: CollectorRegistry | None = REGISTRY) -> ProtectMetrics:
    """The shared metrics of ``registry``; ``None`` gives unregistered ones."""
    if registry is None:
        return ProtectMetrics.build(None)
    with _LOCK:
        found = _CACHE.get(registry)
        if found is None:
            found = _CACHE[registry] = ProtectMetrics.build(registry)
        return found
