"""Drift-free periodic jobs, each on its own daemon thread.

A job runs at ``t0 + k * interval`` on the monotonic clock. A run that
overruns skips the slots it missed (counted) instead of running late ones
back to back, and a hung run blocks only its own thread: the others keep
their schedule.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

__all__ = ["Job"]

log = logging.getLogger("aivitals.agent")


class Job:
    """``fn(wall_time)`` every ``interval`` seconds until ``stop`` is set."""

    def __init__(self, name: str, interval: float, fn: Callable[[float], None]) -> None:
        self.name = name
        self.interval = interval
        self.fn = fn
        self.running_since: float | None = None  # monotonic start of the run in progress
        self.runs = 0
        self.missed = 0
        self.failures = 0
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event, *, first_delay: float = 0.0) -> None:
        self._thread = threading.Thread(
            target=self._loop, args=(stop, first_delay), name=f"aivitals-{self.name}", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self, stop: threading.Event, first_delay: float) -> None:
        due = time.monotonic() + first_delay
        while not stop.wait(max(0.0, due - time.monotonic())):
            self.running_since = time.monotonic()
            try:
                self.fn(time.time())
            except Exception:  # a job's bug must not end its schedule
                self.failures += 1
                log.exception("agent job %s failed", self.name)
            finally:
                self.running_since = None
                self.runs += 1
            due += self.interval
            late = time.monotonic() - due
            if late > 0:
                skipped = math.ceil(late / self.interval)
                self.missed += skipped
                due += skipped * self.interval
