"""aivitals: keeps AI model-serving services healthy, from P99 latency down to GPU memory.

The base package is light: importing it loads neither numpy nor torch. The
instrumentation entry points (``aivitals.instrument(app)``,
``aivitals.inference(...)``) are added to this surface by their package.
"""

from __future__ import annotations

__version__ = "0.1.0"

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
]
