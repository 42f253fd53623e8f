"""Faults that must happen inside the demo process, driven by ``/_aivitals/chaos``.

Each fault is a flag plus parameters the request path reads; every one has a
bounded duration after which it reverts by itself, and ``stop_all`` (called on
shutdown) reverts everything. The endpoint exists only when the service was
started with a chaos token (``AIVITALS_CHAOS_TOKEN``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

__all__ = ["FAULTS", "FaultSpec", "InProcessFaults"]

#: Longest an in-process fault may stay on, seconds.
MAX_DURATION = 3600.0


@dataclass(frozen=True, slots=True)
class FaultSpec:
    name: str
    help: str
    params: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    """param -> (default, minimum, maximum)"""


FAULTS: dict[str, FaultSpec] = {
    spec.name: spec
    for spec in (
        FaultSpec(
            "gpu_leak",
            "every request leaves `mib_per_request` MiB allocated on the GPU",
            # down to 0.01 MiB: the severity sweep's at-threshold leak (2e6 B/s) at a few
            # requests a second is under half a MiB per request
            {"mib_per_request": (256.0, 0.01, 65536.0)},
        ),
        FaultSpec(
            "slow_inference",
            "contention: every generated token takes `factor` times as long",
            {"factor": (4.0, 1.0, 100.0)},
        ),
        FaultSpec(
            "event_loop_block",
            "each request handler sleeps `seconds` synchronously on the event loop",
            {"seconds": (0.2, 0.001, 5.0)},
        ),
        FaultSpec(
            "worker_pool_stuck",
            "`workers` pool workers block until the fault stops",
            {"workers": (0.0, 0.0, 1024.0)},
        ),
        FaultSpec(
            "process_memory_leak",
            "every request keeps `mib_per_request` MiB of process memory",
            {"mib_per_request": (4.0, 0.01, 1024.0), "max_mib": (4096.0, 1.0, 65536.0)},
        ),
        FaultSpec(
            "no_abort_timeouts",
            "a passed deadline cancels only the await; the generation keeps running",
        ),
        FaultSpec("cold_start", "drop the loaded models; the next request reloads them"),
        # faults the knowledge base has no signature for (the diagnosis's generic part)
        FaultSpec(
            "slow_dependency",
            "every model request first awaits a call to a dependency that answers in "
            "`seconds` (x 0.75-1.25); the event loop stays free",
            {"seconds": (0.2, 0.001, 10.0)},
        ),
        FaultSpec(
            "thread_leak",
            "every request starts `per_request` threads that never end, until `max_threads` "
            "are alive; they end when the fault stops",
            {"per_request": (2.0, 1.0, 64.0), "max_threads": (400.0, 1.0, 4000.0)},
        ),
    )
}


class InProcessFaults:
    """The faults active in this process, each with its parameters and expiry.

    **Usage**::

        faults = InProcessFaults(on_change={"worker_pool_stuck": pool_hook})
        faults.start("slow_inference", {"factor": 3, "duration": 60})
        faults.param("slow_inference", "factor")   # 3.0, or None when inactive
        faults.stop("slow_inference")
    """

    def __init__(self, *, on_change: Mapping[str, Callable[[bool, dict[str, float]], None]]):
        self._active: dict[str, tuple[dict[str, float], float, float]] = {}
        self._hooks = dict(on_change)
        self._lock = threading.Lock()
        self._timers: dict[str, threading.Timer] = {}

    def start(self, name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        spec = FAULTS.get(name)
        if spec is None:
            raise ConfigError(f"fault={name!r}: expected one of {', '.join(sorted(FAULTS))}")
        values, duration = _validate(spec, dict(params or {}))
        self.stop(name)
        now = time.time()
        with self._lock:
            self._active[name] = (values, now, now + duration)
            timer = threading.Timer(duration, self.stop, args=(name,))
            timer.daemon = True
            self._timers[name] = timer
            timer.start()
        self._notify(name, True, values)
        return self.describe(name) or {}

    def stop(self, name: str) -> bool:
        if name not in FAULTS:
            raise ConfigError(f"fault={name!r}: expected one of {', '.join(sorted(FAULTS))}")
        with self._lock:
            entry = self._active.pop(name, None)
            timer = self._timers.pop(name, None)
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        if entry is None:
            return False
        self._notify(name, False, entry[0])
        return True

    def stop_all(self) -> list[str]:
        with self._lock:
            names = list(self._active)
        return [n for n in names if self.stop(n)]

    def active(self, name: str) -> bool:
        return name in self._active

    def param(self, name: str, key: str) -> float | None:
        entry = self._active.get(name)
        return None if entry is None else entry[0].get(key)

    def describe(self, name: str) -> dict[str, Any] | None:
        entry = self._active.get(name)
        if entry is None:
            return None
        values, started, until = entry
        return {"fault": name, "params": values, "started_at": started, "until": until}

    def listing(self) -> list[dict[str, Any]]:
        with self._lock:
            names = sorted(self._active)
        return [d for n in names if (d := self.describe(n)) is not None]

    def _notify(self, name: str, on: bool, values: dict[str, float]) -> None:
        hook = self._hooks.get(name)
        if hook is not None:
            hook(on, values)


def _validate(spec: FaultSpec, params: dict[str, Any]) -> tuple[dict[str, float], float]:
    duration = params.pop("duration", 300.0)
    duration = _number(spec.name, "duration", duration, 0.001, MAX_DURATION)
    unknown = set(params) - set(spec.params)
    if unknown:
        allowed = ", ".join(sorted(spec.params)) or "none besides duration"
        raise ConfigError(
            f"fault {spec.name!r}: unknown params {', '.join(sorted(unknown))} (allowed: {allowed})"
        )
    values = {}
    for key, (default, low, high) in spec.params.items():
        values[key] = _number(spec.name, key, params.get(key, default), low, high)
    return values, duration


def _number(fault: str, key: str, raw: Any, low: float, high: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ConfigError(f"fault {fault!r}: {key}={raw!r} is not a finite number")
    if not low <= float(raw) <= high:
        raise ConfigError(f"fault {fault!r}: {key}={raw!r} outside [{low:g}, {high:g}]")
    return float(raw)
