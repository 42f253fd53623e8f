"""aivitals.instrument: one line turns an ASGI or WSGI AI service into an observable one.

**Usage**::

    import aivitals
    app = aivitals.instrument(app)                     # HTTP metrics, request id, /metrics
    aivitals.instrument.instrument_wsgi(flask_app)     # the same for Flask, Django, any WSGI
    aivitals.instrument.configure_logging("svc.jsonl")   # JSON lifecycle logs, off the loop

    with aivitals.inference(model="m", version="v3.2.1", input_ids=ids) as call:
        out = model(ids)
        call.output_ids(out)
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ._abort import InferenceAborted, abort_request, active_requests
from ._config import InstrumentConfig
from ._context import REQUEST_ID, REQUEST_STATE, RequestState, current_request_id
from ._exposition import WorkerProcessCollector, mark_worker_dead, metrics_app, metrics_wsgi_app
from ._inference import (
    InferenceCall,
    ModelLoad,
    inference,
    model_load,
    record_kv_cache,
    timed_inference,
)
from ._labels import OTHER, CardinalityGuard, normalize_version
from ._logging import CONTEXT_FIELDS, JsonFormatter, LogWriter, configure_logging, log_event
from ._middleware import AivitalsMiddleware, instrument
from ._multiprocess import ensure_multiprocess
from ._otel import GENAI_BUCKETS, OTEL_NAMES, OTelView, enable_otel
from ._queue import InstrumentedExecutor, InstrumentedQueue, PoolSaturated
from ._routes import UNMATCHED
from ._tokens import count_tokens
from ._wsgi import AivitalsWSGIMiddleware, instrument_wsgi

__all__ = [
    "CONTEXT_FIELDS",
    "GENAI_BUCKETS",
    "OTEL_NAMES",
    "OTHER",
    "REQUEST_ID",
    "REQUEST_STATE",
    "UNMATCHED",
    "AivitalsMiddleware",
    "AivitalsWSGIMiddleware",
    "CardinalityGuard",
    "InferenceAborted",
    "InferenceCall",
    "InstrumentConfig",
    "InstrumentedExecutor",
    "InstrumentedQueue",
    "JsonFormatter",
    "LogWriter",
    "ModelLoad",
    "OTelView",
    "PoolSaturated",
    "RequestState",
    "WorkerProcessCollector",
    "abort_request",
    "active_requests",
    "configure_logging",
    "count_tokens",
    "current_request_id",
    "enable_otel",
    "ensure_multiprocess",
    "inference",
    "instrument",
    "instrument_wsgi",
    "log_event",
    "mark_worker_dead",
    "metrics_app",
    "metrics_wsgi_app",
    "model_load",
    "normalize_version",
    "record_kv_cache",
    "timed_inference",
]


class _CallableModule(types.ModuleType):
    """Lets ``aivitals.instrument(app)`` work while the package keeps its other names."""

    def __call__(self, app: Any, **settings: Any) -> Any:
        return instrument(app, **settings)


sys.modules[__name__].__class__ = _CallableModule
