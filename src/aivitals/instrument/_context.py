"""Per-request context shared by instrumentation, protection and logging.

Context variables rather than arguments, because the model call and the log
formatter sit many frames below the middleware that knows the request.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

__all__ = ["REQUEST_ID", "REQUEST_STATE", "TRACERS", "RequestState", "current_request_id"]

#: A request id bound outside the middleware (protection used alone, a job
#: runner); inside an instrumented request the id lives on ``REQUEST_STATE``,
#: so the middleware sets one context variable a request, not two. Read the
#: id in force with ``current_request_id()``.
REQUEST_ID: ContextVar[str | None] = ContextVar("aivitals_request_id", default=None)


class RequestState:
    """What the model call learns about the request, for the request's log lines.

    One mutable object per request, bound in ``REQUEST_STATE`` by the
    middleware: the inference context fills it in (a thread-pool endpoint sees
    the same object, since the context is copied, not the object), and the
    ``responded`` line and the JSON formatter read it.

    The fields default at class level, so creating one per request stores two
    attributes, not eight (this sits on every request's path).
    """

    #: the route template (``/v1/items/{id}``) the middleware matched
    route: str | None = None
    model_version: str | None = None
    input_token_count: int | None = None
    max_new_tokens: int | None = None
    gpu_device_id: str | None = None
    error_code: str | None = None
    gpu_time: float = 0.0

    def __init__(self, request_id: str | None = None, route: str | None = None) -> None:
        self.request_id = request_id
        self.route = route


#: The current request's ``RequestState`` (None outside a request).
REQUEST_STATE: ContextVar[RequestState | None] = ContextVar("aivitals_request_state", default=None)

#: The request tracer in force (``_otel._Tracing``, set by ``enable_otel``): the
#: middleware opens a W3C trace-context span per request with ``TRACERS[0]``,
#: and pays one list test per request while the list is empty.
TRACERS: list[Any] = []


def current_request_id() -> str | None:
    """The id of the request being served in this task or thread, if any."""
    state = REQUEST_STATE.get()
    if state is not None and state.request_id:
        return state.request_id
    return REQUEST_ID.get()
