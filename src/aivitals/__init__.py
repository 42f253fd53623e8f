"""aivitals: keeps AI model-serving services healthy, from P99 latency down to GPU memory.

The base package is light: importing it loads neither numpy nor torch.

**Usage**::

    import aivitals
    app = aivitals.instrument(app)                  # FastAPI/Starlette or any ASGI app
    with aivitals.inference(model="m", version="v3.2.1", input_ids=ids) as call:
        call.output_ids(model(ids))

``aivitals.instrument`` is the instrumentation package, and calling it is
``aivitals.instrument.instrument(app)``; its other names stay reachable
(``aivitals.instrument.configure_logging(...)``, ``InstrumentedQueue``).
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import instrument
from .errors import (
    AivitalsError,
    AlreadyRunning,
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
    model_load,
    timed_inference,
)

__all__ = [
    "AivitalsError",
    "AlreadyRunning",
    "BackendError",
    "BackendTimeout",
    "CardinalityLimitError",
    "CollectorError",
    "ConfigError",
    "ExpositionError",
    "FaultError",
    "FaultRefused",
    "InstrumentConfig",
    "NotifyError",
    "ParseError",
    "QueryError",
    "RuleError",
    "SampleRejected",
    "ServiceError",
    "SignatureError",
    "StoreError",
    "UnsupportedQueryError",
    "__version__",
    "abort_request",
    "configure_logging",
    "inference",
    "instrument",
    "model_load",
    "timed_inference",
]
