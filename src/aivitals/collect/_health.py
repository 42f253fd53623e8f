"""Shared plumbing for collectors: error counting and the health series.

A collector subclasses ``BaseCollector`` and implements ``_collect``; the base
turns an exception into ``aivitals_collector_up 0`` plus an error count, so
``collect()`` never raises. Partial failures (one NVML field, one unreadable
/proc file) are counted with ``count_error`` while the rest keeps flowing.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from ..signals import Sample

__all__ = ["BaseCollector", "RunResult", "health_samples", "reason_of"]


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run of a collector produced: its data samples and whether it worked."""

    samples: list[Sample]
    ok: bool
    duration: float


def reason_of(exc: BaseException) -> str:
    """A short, bounded reason label for an exception (its class name, snake-ish)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, PermissionError):
        return "permission"
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, OSError):
        return "os_error"
    if isinstance(exc, ValueError):
        return "parse"
    return "exception"


def health_samples(
    name: str, *, ok: bool, duration: float, errors: Mapping[str, int]
) -> list[Sample]:
    """``aivitals_collector_up``, ``_duration_seconds`` and ``_errors_total`` of one collector."""
    out = [
        Sample("aivitals_collector_up", {"collector": name}, 1.0 if ok else 0.0),
        Sample("aivitals_collector_duration_seconds", {"collector": name}, duration),
    ]
    out += [
        Sample("aivitals_collector_errors_total", {"collector": name, "reason": r}, float(n))
        for r, n in sorted(errors.items())
    ]
    return out


class BaseCollector(ABC):
    """Base of the shipped collectors: ``collect()`` never raises.

    Subclasses set ``name`` and implement ``_collect``. ``errors`` counts
    failures by reason since the collector was made.

    **Usage**::

        class Uptime(BaseCollector):
            name = "uptime"
            def _collect(self):
                yield Sample("host_uptime_seconds", {}, time.monotonic())
    """

    name: str = "base"

    def __init__(self) -> None:
        self.errors: Counter[str] = Counter()
        self._errors_lock = threading.Lock()

    def count_error(self, reason: str, n: int = 1) -> None:
        with self._errors_lock:
            self.errors[reason] += n

    def error_counts(self) -> dict[str, int]:
        with self._errors_lock:
            return dict(self.errors)

    @abstractmethod
    def _collect(self) -> Iterable[Sample]:
        """The source-specific part: yield data samples; raise on failure."""

    def run(self) -> RunResult:
        """One run: the data samples, without the health series."""
        start = time.perf_counter()
        try:
            samples = list(self._collect())
            ok = True
        except Exception as exc:  # a collector must never take the agent down
            self.count_error(reason_of(exc))
            samples, ok = [], False
        return RunResult(samples, ok, time.perf_counter() - start)

    def collect(self) -> Iterator[Sample]:
        """The data samples followed by this collector's health series."""
        result = self.run()
        yield from result.samples
        yield from health_samples(
            self.name, ok=result.ok, duration=result.duration, errors=self.error_counts()
        )
