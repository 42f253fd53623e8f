"""Arrival schedules computed up front, so the send times never depend on the service.

An open-loop generator that waits for a reply before choosing the next send
time under-reports latency when the service stalls (coordinated omission).
Here every intended send time is known before the first request leaves, and
latency is measured from that intended time.
"""

from __future__ import annotations

import random

from ..errors import ConfigError

__all__ = ["poisson_schedule", "uniform_schedule"]


def _check(rate: float, duration: float) -> None:
    if not rate > 0:
        raise ConfigError(f"rate: {rate!r} must be > 0 requests per second")
    if not duration > 0:
        raise ConfigError(f"duration: {duration!r} must be > 0 seconds")


def poisson_schedule(rate: float, duration: float, *, seed: int | None = None) -> list[float]:
    """Send offsets (seconds from start) of a Poisson process at ``rate`` per second.

    Inter-arrival gaps are exponential with mean ``1/rate``; the count over
    ``duration`` is Poisson with mean ``rate * duration``.

    **Usage**::

        offsets = poisson_schedule(100.0, 10.0, seed=1)   # about 1,000 offsets in [0, 10)
    """
    _check(rate, duration)
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def uniform_schedule(rate: float, duration: float) -> list[float]:
    """Evenly spaced send offsets at ``rate`` per second (a constant-rate open loop)."""
    _check(rate, duration)
    n = int(rate * duration)
    return [i / rate for i in range(n)]
