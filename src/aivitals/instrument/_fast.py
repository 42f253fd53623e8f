"""Lean metric children for the per-request path in single-process mode.

prometheus_client takes two locks and walks the bucket list per histogram
observation; a request makes five or six observations, which is most of the
middleware's cost. These children use a C bisect under one shared lock, and
a collector per family renders them as ordinary Prometheus families. The
middleware does not even take the lock: it appends each request's start and
end to ``PENDING`` and ``fold_pending`` applies them in batches, at every
collect (so a scrape is exact) and every ``FOLD_AT`` entries (so memory stays
bounded). In multiprocess mode prometheus_client's own classes are used (its
values live in the shared files).
"""

from __future__ import annotations

import collections
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from ..signals import MetricSpec, MetricType

__all__ = [
    "FOLD_AT",
    "LOCK",
    "PENDING",
    "FastFamily",
    "Finished",
    "fold_pending",
    "is_lean",
]


#: One lock for every lean child: updates hold it for a few bytecodes, so
#: sharing costs nothing measurable, and it lets ``observe_request`` record a
#: whole request's observations under one acquisition instead of four.
LOCK = threading.Lock()


class _Histogram:
    __slots__ = ("bounds", "counts", "exemplars", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0
        #: per bucket, the latest exemplar (None until one is set; OpenMetrics only)
        self.exemplars: list[Exemplar | None] | None = None

    def exemplar(self, value: float, labels: dict[str, str]) -> None:
        """Keep ``value`` as its bucket's exemplar (the latest wins, as in prometheus_client).

        Only the value's bucket gets it; the count is the caller's to record.
        """
        slots = self.exemplars
        if slots is None:
            slots = self.exemplars = [None] * len(self.bounds)
        slots[bisect_left(self.bounds, value)] = Exemplar(labels, value, time.time())

    def observe(self, value: float) -> None:
        index = bisect_left(self.bounds, value)  # first bound >= value, as "le" means
        with LOCK:
            self.counts[index] += 1
            self.total += value

    def snapshot(self) -> tuple[list[int], float]:
        with LOCK:
            return list(self.counts), self.total


class _Value:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        with LOCK:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with LOCK:
            self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _Counter(_Value):
    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"counters only go up; inc({amount!r}) refused")
        with LOCK:
            self.value += amount


def is_lean(*children: object) -> bool:
    """Whether all of these children are this module's (not prometheus_client's)."""
    return all(isinstance(c, _Histogram | _Value) for c in children)


#: Requests recorded by the middleware but not yet folded into their lean
#: children: an in-flight child when a request starts, a ``Finished`` tuple
#: when it ends. Appending is one atomic deque operation (no lock) on the
#: request path; ``fold_pending`` applies the batch under ``LOCK``.
PENDING: collections.deque[Any] = collections.deque()
#: pending entries that make the request adding the last one fold them
FOLD_AT = 1024


#: What the middleware appends when a request ends (a plain tuple: building a
#: NamedTuple costs a Python call): its route's (in flight, body size,
#: response size) children, its duration child (per status), the seconds,
#: and the body and response sizes.
Finished = tuple[tuple["_Value", "_Histogram", "_Histogram"], "_Histogram", float, float, float]


def fold_pending() -> None:
    """Apply every pending request start and end to the children, under one lock.

    Run by every lean family's ``collect`` (a scrape sees every request that
    finished before it) and by the request that fills ``PENDING`` to
    ``FOLD_AT``, which bounds the memory held between scrapes.
    """
    with LOCK:
        pending = PENDING
        # entries appended while this runs wait for the next fold
        for _ in range(len(pending)):
            entry = pending.popleft()
            if type(entry) is _Value:  # a request started
                entry.value += 1.0
                continue
            (in_flight, body, response), duration, seconds, body_bytes, response_bytes = entry
            in_flight.value -= 1.0
            duration.counts[bisect_left(duration.bounds, seconds)] += 1
            duration.total += seconds
            body.counts[bisect_left(body.bounds, body_bytes)] += 1
            body.total += body_bytes
            response.counts[bisect_left(response.bounds, response_bytes)] += 1
            response.total += response_bytes


class FastFamily:
    """One catalogue family: ``.labels(*values)`` children, and a prometheus_client collector."""

    def __init__(self, spec: MetricSpec, buckets: Sequence[float] | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.labelnames = spec.labels
        self._children: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        if spec.type is MetricType.HISTOGRAM:
            chosen = [float(b) for b in (buckets or spec.buckets or ())]
            if not chosen or chosen[-1] != math.inf:
                chosen.append(math.inf)
            self._bounds = tuple(chosen)

    def labels(self, *values: str, **by_name: str) -> Any:
        # Same call forms as prometheus_client's labels(), positional or by
        # name, so a package sharing this family needs not know which it got.
        if by_name:
            if values or set(by_name) != set(self.labelnames):
                raise ValueError(
                    f"{self.name}: expected labels {self.labelnames}, got {sorted(by_name)}"
                )
            values = tuple(by_name[name] for name in self.labelnames)
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {key}")
            with self._lock:
                child = self._children.get(key)
                if child is None:
                    child = self._new_child()
                    self._children[key] = child
        return child

    def _new_child(self) -> Any:
        kind = self.spec.type
        if kind is MetricType.HISTOGRAM:
            return _Histogram(self._bounds)
        if kind is MetricType.COUNTER:
            return _Counter()
        return _Value()

    # unlabelled families are used directly, as with prometheus_client
    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self.labels().dec(amount)

    def set(self, value: float) -> None:
        self.labels().set(value)

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    # the prometheus_client collector protocol
    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        if PENDING:
            fold_pending()
        family = self._family()
        with self._lock:
            children = list(self._children.items())
        for labels, child in children:
            if isinstance(child, _Histogram):
                counts, total = child.snapshot()
                cumulative = 0
                buckets: list[tuple[Any, ...]] = []
                for bound, count in zip(self._bounds, counts, strict=True):
                    cumulative += count
                    buckets.append((floatToGoString(bound), cumulative))  # type: ignore[no-untyped-call]
                if child.exemplars is not None:
                    # the text format drops them; OpenMetrics prints them on their bucket
                    buckets = [
                        (*bucket, exemplar) if exemplar is not None else bucket
                        for bucket, exemplar in zip(buckets, list(child.exemplars), strict=True)
                    ]
                family.add_metric(list(labels), buckets, total)
            else:
                family.add_metric(list(labels), child.value)
        return [family]

    def _family(self) -> Any:
        kind, names = self.spec.type, list(self.labelnames)
        if kind is MetricType.HISTOGRAM:
            return HistogramMetricFamily(self.name, self.spec.help, labels=names)
        if kind is MetricType.COUNTER:
            return CounterMetricFamily(self.name, self.spec.help, labels=names)
        return GaugeMetricFamily(self.name, self.spec.help, labels=names)
