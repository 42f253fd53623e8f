"""Per-request context shared by instrumentation, protection and logging.

Context variables rather than arguments, because the model call and the log
formatter sit many frames below the middleware that knows the request.
"""

from __future__ import annotations

from contextvars import ContextVar

#: The current request's id (honoured from ``X-Request-ID`` or generated).
REQUEST_ID: ContextVar[str | None] = ContextVar("aivitals_request_id", default=None)
#: The route template of the current request (``/v1/items/{id}``), once matched.
ROUTE: ContextVar[str | None] = ContextVar("aivitals_route", default=None)


def current_request_id() -> str | None:
    """The id of the request being served in this task or thread, if any."""
    return REQUEST_ID.get()
