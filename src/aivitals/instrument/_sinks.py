"""Observers of finished requests and model calls (the OpenTelemetry view uses them).

Lists, not a framework: the hot path checks ``if REQUEST_SINKS`` and pays
nothing when no one listens. A sink that raises is disabled, never the request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["INFERENCE_SINKS", "REQUEST_SINKS", "notify"]

#: fn(call: InferenceCall) after every model call ends (successful or not).
INFERENCE_SINKS: list[Callable[[Any], None]] = []
#: fn(info: dict) after every instrumented request: method, route, status, seconds.
REQUEST_SINKS: list[Callable[[dict[str, Any]], None]] = []

_log = logging.getLogger("aivitals.instrument")


def notify(sinks: list[Callable[[Any], None]], value: Any) -> None:
    for sink in list(sinks):
        try:
            sink(value)
        except Exception:
            _log.exception("sink_failed", extra={"sink": repr(sink)})
            try:
                sinks.remove(sink)
            except ValueError:
                pass
