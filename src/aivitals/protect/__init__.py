"""aivitals.protect: input guard, admission control, timeouts that abort, deep health.

**Usage**::

    from aivitals.protect import AdmissionConfig, GuardConfig, HealthConfig, protect

    app = protect(app, guard=GuardConfig(), admission=AdmissionConfig(),
                  health=HealthConfig(probe=tiny_inference))
    service = aivitals.instrument(app)   # instrumentation outside: 429s counted, /metrics free

    service = instrument_wsgi(protect_wsgi(flask_app, guard=..., admission=...))   # WSGI

A complete service: ``examples/service.py`` (the README's example).
"""

from __future__ import annotations

from ._admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionRefused,
    Ticket,
    default_memory_estimator,
    kv_cache_estimator,
)
from ._deadline import DeadlineMiddleware, parse_timeout
from ._guard import GUARD_SCOPE_KEY, GuardConfig, GuardResult, InputGuard
from ._health import CheckResult, Health, HealthConfig, HealthMiddleware
from ._limit import GradientLimit
from ._middleware import AdmissionMiddleware
from ._wire import Protected, protect
from ._wsgi import ProtectedWSGI, protect_wsgi

__all__ = [
    "GUARD_SCOPE_KEY",
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionMiddleware",
    "AdmissionRefused",
    "CheckResult",
    "DeadlineMiddleware",
    "GradientLimit",
    "GuardConfig",
    "GuardResult",
    "Health",
    "HealthConfig",
    "HealthMiddleware",
    "InputGuard",
    "Protected",
    "ProtectedWSGI",
    "Ticket",
    "default_memory_estimator",
    "kv_cache_estimator",
    "parse_timeout",
    "protect",
    "protect_wsgi",
]
