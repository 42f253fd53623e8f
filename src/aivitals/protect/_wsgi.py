"""``protect_wsgi(app, ...)``: the input guard and admission control for WSGI apps.

From the outside in, as ``protect()`` orders its ASGI parts::

    admission precheck   bad priority/timeout headers -> 400; queue full or deadline
                         unmeetable -> 429 + Retry-After, before a byte of the body is read
    input guard          size (Content-Length first, then while reading), UTF-8, control
                         characters, JSON, full-width, tokens
    admission            memory reservation, queue, concurrency slot held until the server
                         closes the response
    app

What WSGI cannot do, and this module therefore does not: a running handler
cannot be cancelled (no 504 on a deadline, no abort when the client leaves:
the server only learns it when writing), and a body read cannot be bounded in
time (the server's own timeouts apply, gunicorn's ``--timeout``). The
admission limit and queue are per worker process: under gunicorn's sync
worker each process serves one request at a time, so only ``gthread`` (or
another threaded worker) lets requests queue inside a process.
"""

from __future__ import annotations

import inspect
import io
import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.instrument import REQUEST_ID, AivitalsWSGIMiddleware, current_request_id
from aivitals.signals import ErrorCode

from ._admission import AdmissionConfig, AdmissionController, AdmissionRefused, Ticket
from ._asgi import _SAFE_ID, error_payload, log
from ._guard import (
    GUARD_SCOPE_KEY,
    GuardConfig,
    GuardRoutes,
    _Refusal,
    check_body_blocking,
    is_json,
    record_disconnect,
    record_refusal,
)
from ._metrics import metrics_for
from ._middleware import request_lengths

__all__ = ["ProtectedWSGI", "protect_wsgi"]

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_CHUNK = 65_536
_PRIORITY_KEY = "aivitals.priority"
_DEADLINE_KEY = "aivitals.deadline"


class ProtectedWSGI:
    """The wrapped WSGI app, with a handle on its admission controller (``controller``)."""

    def __init__(self, app: WSGIApp, *, controller: AdmissionController) -> None:
        self.app = app
        self.controller = controller

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        # Used alone, protection binds the request id itself; a thread serves
        # one request after another, so the binding must not outlive this one.
        if current_request_id():
            return self.app(environ, start_response)
        raw = environ.get("HTTP_X_REQUEST_ID", "")
        token = REQUEST_ID.set(raw if _SAFE_ID.match(raw) else uuid.uuid4().hex)
        try:
            return self.app(environ, start_response)
        finally:
            REQUEST_ID.reset(token)


def protect_wsgi(
    app: WSGIApp,
    *,
    guard: GuardConfig | None = None,
    guard_routes: Mapping[str, GuardConfig | None] | None = None,
    admission: AdmissionConfig | None = None,
    registry: CollectorRegistry | None = REGISTRY,
) -> ProtectedWSGI:
    """Wrap a WSGI app with the input guard and admission control (429 + Retry-After).

    Each part is on with its default config when its argument is omitted.
    Instrument the result, not ``app``: ``instrument_wsgi(protect_wsgi(app))``
    (an app instrumented already is refused with ``ConfigError``), and serve
    what that returns. Health checks and deadlines that abort the work are
    ASGI-only (see the module docstring for what WSGI cannot do).

    **Usage**::

        from aivitals.instrument import instrument_wsgi
        from aivitals.protect import AdmissionConfig, GuardConfig, protect_wsgi

        service = instrument_wsgi(protect_wsgi(
            flask_app,
            guard=GuardConfig(max_body_bytes=100_000),
            admission=AdmissionConfig(initial_limit=2, queue_size=8),
        ))
    """
    if not callable(app) or _is_async(app):
        raise ConfigError(
            f"protect_wsgi: expected a WSGI application, got {type(app).__name__}; "
            f"ASGI apps take aivitals.protect.protect(app)"
        )
    if _instrumented(app):
        raise ConfigError(
            "protect_wsgi(app): app is instrumented already, so protection would sit outside "
            "the instrumentation (429s uncounted, /metrics queued and refused under load); "
            "instrument the protected app instead: instrument_wsgi(protect_wsgi(app, ...))"
        )
    controller = AdmissionController(
        admission if admission is not None else AdmissionConfig(), registry=registry
    )
    inner: WSGIApp = _Admission(app, controller)
    inner = _Guard(inner, GuardRoutes(guard, guard_routes), registry)
    inner = _Admission(inner, controller, precheck_only=True)
    return ProtectedWSGI(inner, controller=controller)


def _is_async(app: Any) -> bool:
    # an ``async def`` app, or an instance whose class's __call__ is one (ASGI)
    call = getattr(type(app), "__call__", None)  # noqa: B004
    return inspect.iscoroutinefunction(app) or inspect.iscoroutinefunction(call)


def _instrumented(app: Any) -> bool:
    return isinstance(app, AivitalsWSGIMiddleware) or isinstance(
        getattr(app, "wsgi_app", None), AivitalsWSGIMiddleware
    )


def _request_id() -> str:
    return current_request_id() or ""


def respond_error(
    start_response: StartResponse,
    code: ErrorCode,
    message: str,
    *,
    status: int | None = None,
    headers: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    """Answer with the standard error body (the one the ASGI side sends)."""
    chosen, payload = error_payload(code, message, request_id=_request_id(), status=status)
    body = json.dumps(payload, separators=(",", ":")).encode()
    start_response(
        f"{chosen} {HTTPStatus(chosen).phrase}",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *headers,
        ],
    )
    return [body]


class _Guard:
    """The input guard on a blocking thread: read (bounded), check, replay the body."""

    def __init__(self, app: WSGIApp, routes: GuardRoutes, registry: CollectorRegistry | None):
        self.app = app
        self.routes = routes
        self._metrics = metrics_for(registry)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        route, cfg = self.routes.config_for(environ.get("PATH_INFO", ""))
        if cfg is None or environ.get("REQUEST_METHOD", "GET") not in cfg.methods:
            return self.app(environ, start_response)
        try:
            body = _read_body(environ, cfg)
            body, result = check_body_blocking(body, is_json(environ.get("CONTENT_TYPE"), cfg), cfg)
        except _Refusal as refusal:
            record_refusal(self._metrics, route, _request_id(), refusal)
            return respond_error(
                start_response, refusal.code, refusal.message, status=refusal.status
            )
        except _BodyCut:
            record_disconnect(self._metrics, route, _request_id())
            return respond_error(
                start_response, ErrorCode.CLIENT_DISCONNECT, "the body ended early", status=400
            )
        environ[GUARD_SCOPE_KEY] = result
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return self.app(environ, start_response)


class _BodyCut(Exception):
    pass


def _read_body(environ: Environ, cfg: GuardConfig) -> bytes:
    """The body, refused past ``max_body_bytes`` before reading it when Content-Length says so."""
    limit = cfg.max_body_bytes
    declared = _content_length(environ)
    if declared is not None and declared > limit:
        raise _Refusal(
            ErrorCode.INPUT_TOO_LARGE,
            f"body of {declared} bytes (Content-Length) is over the limit of {limit} bytes",
        )
    stream = environ["wsgi.input"]
    if declared is None and not environ.get("wsgi.input_terminated"):
        return b""  # no length and a stream the server does not end: PEP 3333 says none
    chunks: list[bytes] = []
    size = 0
    while declared is None or size < declared:
        want = _CHUNK if declared is None else min(_CHUNK, declared - size)
        chunk = stream.read(want)
        if not chunk:
            if declared is not None:
                raise _BodyCut
            break
        size += len(chunk)
        if size > limit:
            raise _Refusal(
                ErrorCode.INPUT_TOO_LARGE,
                f"body is over the limit of {limit} bytes (refused at {size} bytes)",
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _content_length(environ: Environ) -> int | None:
    value = environ.get("CONTENT_LENGTH")
    if not value:
        return None
    try:
        return max(0, int(value))
    except ValueError:
        return None


class _Admission:
    """Admission control on a blocking thread: refuse early, or hold a slot until the close."""

    def __init__(
        self, app: WSGIApp, controller: AdmissionController, *, precheck_only: bool = False
    ) -> None:
        self.app = app
        self.controller = controller
        self.precheck_only = precheck_only
        cfg = controller.config
        self._priority_key = "HTTP_" + cfg.priority_header.upper().replace("-", "_")
        self._timeout_key = "HTTP_" + cfg.timeout_header.upper().replace("-", "_")

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        paths = self.controller.config.paths
        if paths is not None and not environ.get("PATH_INFO", "").startswith(paths):
            return self.app(environ, start_response)
        try:
            priority, deadline = self._parse(environ)
            cost = 0 if self.precheck_only else self._cost(environ)
            self.controller.check_blocking(priority=priority, deadline=deadline, cost=cost)
            if self.precheck_only:
                return self.app(environ, start_response)
            ticket = self.controller.acquire_blocking(
                priority=priority, deadline=deadline, cost=cost
            )
        except ConfigError as exc:
            return respond_error(start_response, ErrorCode.INPUT_REJECTED, str(exc), status=400)
        except AdmissionRefused as refused:
            return self._refuse(start_response, refused, environ)
        try:
            result = self.app(environ, start_response)
        except BaseException:
            self.controller.release_blocking(ticket)
            raise
        return _Holding(result, self.controller, ticket)

    def _parse(self, environ: Environ) -> tuple[str, float]:
        if _PRIORITY_KEY in environ:
            return environ[_PRIORITY_KEY], environ[_DEADLINE_KEY]
        priority = self.controller.parse_priority(environ.get(self._priority_key))
        seconds = self.controller.parse_timeout(environ.get(self._timeout_key))
        # the deadline counts from arrival: body upload and queueing spend it too
        deadline = time.monotonic() + seconds
        environ[_PRIORITY_KEY] = priority
        environ[_DEADLINE_KEY] = deadline
        return priority, deadline

    def _cost(self, environ: Environ) -> int:
        cfg = self.controller.config
        if cfg.memory_capacity is None:
            return 0
        prompt_tokens, max_new = request_lengths(
            environ.get(GUARD_SCOPE_KEY), environ.get("CONTENT_LENGTH"), cfg.max_new_tokens_fields
        )
        if max_new is None:
            max_new = cfg.default_max_new_tokens
        return int(cfg.memory_estimator(prompt_tokens, max_new))

    def _refuse(
        self, start_response: StartResponse, refused: AdmissionRefused, environ: Environ
    ) -> list[bytes]:
        log.info(
            "admission refused: %s",
            refused,
            extra={
                "error_code": refused.code.value,
                "request_id": _request_id(),
                "reason": refused.reason,
                "priority": environ.get(_PRIORITY_KEY),
            },
        )
        return respond_error(
            start_response,
            refused.code,
            str(refused),
            status=429,
            headers=[("Retry-After", str(refused.retry_after))],
        )


class _Holding:
    """The response iterable of an admitted request: its slot is given back at the end.

    The end is the last chunk or the server's ``close()``, whichever comes
    first: a streamed response is still being produced after the app returned.
    """

    def __init__(self, result: Iterable[bytes], controller: AdmissionController, ticket: Ticket):
        self.result = result
        self.controller = controller
        self.ticket: Ticket | None = ticket
        self._iterator: Iterator[bytes] | None = None

    def __iter__(self) -> _Holding:
        return self

    def __next__(self) -> bytes:
        if self._iterator is None:
            self._iterator = iter(self.result)
        try:
            return next(self._iterator)
        except BaseException:
            self._release()
            raise

    def close(self) -> None:
        try:
            close = getattr(self.result, "close", None)
            if close is not None:
                close()
        finally:
            self._release()

    def _release(self) -> None:
        ticket, self.ticket = self.ticket, None
        if ticket is not None:
            self.controller.release_blocking(ticket)
