"""aivitals: keeps AI model-serving services healthy, from P99 latency down to GPU memory.

The base package is light: importing it loads neither numpy nor torch.

**Usage**::

    import aivitals
    app = aivitals.instrument(app)                  # FastAPI/Starlette or any ASGI app
    app = aivitals.instrument_wsgi(app)             # Flask, Django or any WSGI app
    with aivitals.inference(model="m", version="v3.2.1", input_ids=ids) as call:
        call.output_ids(model(ids))

``aivitals.instrument`` is the instrumentation package, and calling it is
``aivitals.instrument.instrument(app)``; its other names stay reachable
(``aivitals.instrument.configure_logging(...)``, ``InstrumentedQueue``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from . import instrument
from .errors import (
    AivitalsError,
    AlreadyRunning,
    BackendAuthError,
    BackendError,
    BackendTimeout,
    CardinalityLimitError,
    CollectorError,
    ConfigError,
    ExpositionError,
    FaultError,
    FaultRefused,
    NotifyError,
    ParseError,
    QueryError,
    RuleError,
    SampleRejected,
    ServiceError,
    SignatureError,
    StoreError,
    UnsupportedQueryError,
)
from .instrument import (
    InstrumentConfig,
    abort_request,
    configure_logging,
    inference,
    instrument_wsgi,
    model_load,
    timed_inference,
)

__all__ = [
    "AdmissionConfig",
    "Agent",
    "AgentConfig",
    "AivitalsError",
    "AlreadyRunning",
    "BackendAuthError",
    "BackendError",
    "BackendTimeout",
    "CardinalityLimitError",
    "CollectorError",
    "ConfigError",
    "ExpositionError",
    "FaultError",
    "FaultRefused",
    "GuardConfig",
    "HealthConfig",
    "InstrumentConfig",
    "NotifyError",
    "ParseError",
    "PrometheusBackend",
    "QueryError",
    "RemoteConnection",
    "RuleEngine",
    "RuleError",
    "SampleRejected",
    "ServiceError",
    "SignatureError",
    "SimGPU",
    "Store",
    "StoreError",
    "UnsupportedQueryError",
    "__version__",
    "abort_request",
    "configure_logging",
    "inference",
    "instrument",
    "instrument_wsgi",
    "model_load",
    "timed_inference",
]


# Heavier parts (numpy through the store) load on first use, so that a service
# importing aivitals for instrumentation pays for none of them.
_LAZY: dict[str, str] = {
    "AdmissionConfig": "aivitals.protect",
    "Agent": "aivitals.agent",
    "AgentConfig": "aivitals.agent",
    "GuardConfig": "aivitals.protect",
    "HealthConfig": "aivitals.protect",
    "PrometheusBackend": "aivitals.tsdb",
    "RemoteConnection": "aivitals.tsdb",
    "RuleEngine": "aivitals.alerts",
    "SimGPU": "aivitals.collect.gpu",
    "Store": "aivitals.tsdb",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'aivitals' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
