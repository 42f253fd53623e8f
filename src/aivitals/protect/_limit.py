"""The adaptive concurrency limit: a gradient limiter between a floor and a ceiling.

Gradient2-like (Netflix concurrency-limits), with the baseline taken as Envoy's
adaptive-concurrency filter does, from the lowest latency seen:

* Latency samples are grouped into windows (``window_samples`` requests, at
  least ``window_seconds``); a window's latency is its mean.
* The baseline is the minimum window latency over ``baseline_horizon``
  seconds: what a request costs without contention. Gradient2's long-term
  exponential average drifts upward under sustained overload (the limit then
  grows with the latency it should be fighting); a windowed minimum does not.
* ``gradient = clamp(tolerance * baseline / window_latency, 0.5, 1.0)``.
  Below 1 the limit shrinks multiplicatively by it; at 1 (latency within
  tolerance) it grows by ``sqrt(limit)``, only if the window actually used at
  least half the limit (an idle service learns nothing about its capacity).
  The step is smoothed: ``limit = limit * (1 - smoothing) + new * smoothing``.

**Usage**::

    limit = GradientLimit(initial=4, floor=1, ceiling=256)
    limit.on_sample(latency_seconds, in_flight, now)
    limit.limit   # the concurrency allowed now
"""

from __future__ import annotations

import math
from collections import deque

from aivitals.errors import ConfigError

__all__ = ["GradientLimit"]


class GradientLimit:
    """Latency-gradient concurrency limit. Not thread-safe: one event loop drives it."""

    def __init__(
        self,
        *,
        initial: float = 4,
        floor: float = 1,
        ceiling: float = 256,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        window_samples: int = 20,
        window_seconds: float = 0.05,
        baseline_horizon: float = 600.0,
    ) -> None:
        if not 1 <= floor <= initial <= ceiling:
            raise ConfigError(
                f"limit bounds must satisfy 1 <= floor <= initial <= ceiling, "
                f"got floor={floor!r} initial={initial!r} ceiling={ceiling!r}"
            )
        if not tolerance >= 1.0:
            raise ConfigError(f"tolerance must be >= 1, got {tolerance!r}")
        if not 0 < smoothing <= 1:
            raise ConfigError(f"smoothing must be in (0, 1], got {smoothing!r}")
        if window_samples < 1:
            raise ConfigError(f"window_samples must be >= 1, got {window_samples!r}")
        self.limit = float(initial)
        self.floor = float(floor)
        self.ceiling = float(ceiling)
        self.tolerance = tolerance
        self.smoothing = smoothing
        self.window_samples = window_samples
        self.window_seconds = window_seconds
        self.baseline_horizon = baseline_horizon
        self._history: deque[tuple[float, float]] = deque()
        self._start: float | None = None
        self._sum = 0.0
        self._count = 0
        self._peak_in_flight = 0

    @property
    def baseline(self) -> float | None:
        """The no-contention latency estimate, once one window closed."""
        return min(v for _, v in self._history) if self._history else None

    def on_sample(self, latency: float, in_flight: int, now: float) -> bool:
        """Record one finished request; True when a window closed and the limit moved."""
        if self._start is None:
            self._start = now
        self._sum += latency
        self._count += 1
        self._peak_in_flight = max(self._peak_in_flight, in_flight)
        if self._count < self.window_samples or now - self._start < self.window_seconds:
            return False
        self._close_window(self._sum / self._count, now)
        return True

    def _close_window(self, latency: float, now: float) -> None:
        history = self._history
        history.append((now, latency))
        while history and history[0][0] < now - self.baseline_horizon:
            history.popleft()
        baseline = min(v for _, v in history)
        gradient = max(0.5, min(1.0, self.tolerance * baseline / latency)) if latency > 0 else 1.0
        if gradient < 1.0:
            target = self.limit * gradient
        elif self._peak_in_flight >= self.limit / 2:
            target = self.limit + math.sqrt(self.limit)
        else:
            target = self.limit
        smoothed = self.limit * (1 - self.smoothing) + target * self.smoothing
        self.limit = max(self.floor, min(self.ceiling, smoothed))
        self._start, self._sum, self._count, self._peak_in_flight = now, 0.0, 0, 0
