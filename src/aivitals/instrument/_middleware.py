"""The pure ASGI middleware: request id, HTTP metrics, lifecycle log lines.

Pure ASGI (never Starlette's base HTTP middleware class): ``receive`` is wrapped to count the
body bytes actually received, ``send`` to see the status, the first body byte
and the response size. Labelled children are looked up once per (method,
route) and per status and kept, so a request costs a few dict lookups and
prometheus_client observations.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from ._abort import abort_request
from ._config import InstrumentConfig
from ._context import REQUEST_ID, REQUEST_STATE, ROUTE, RequestState
from ._exposition import metrics_app
from ._labels import OTHER, CardinalityGuard
from ._logging import LIFECYCLE, log_event
from ._metrics import family
from ._routes import UNMATCHED, RouteResolver
from ._sinks import REQUEST_SINKS, notify

__all__ = ["AivitalsMiddleware", "instrument"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}
)
_ID_CHARS = rb"[A-Za-z0-9._:@/+=\-]"
#: request ids: unique, not secret; random.Random is seeded from os.urandom once
_random_bits = random.Random().getrandbits
_CLIENT_CLOSED = 499  # nginx's convention: the client went away before a response
_DURATION = "http_request_duration_seconds"
#: exceptions frameworks raise when the client went away mid-request
_DISCONNECT_ERRORS = frozenset({"ClientDisconnect", "ClientDisconnected"})


class _RouteChildren:
    """The labelled children of one (method, route), plus its per-status durations."""

    __slots__ = ("body", "disconnects", "durations", "in_flight", "labels", "response", "ttfb")

    def __init__(self, families: dict[str, Any], method: str, route: str) -> None:
        self.labels = (method, route)
        self.in_flight = families["http_requests_in_flight"].labels(method, route)
        self.body = families["http_request_body_size_bytes"].labels(method, route)
        self.response = families["http_response_body_size_bytes"].labels(method, route)
        self.ttfb = families["http_time_to_first_byte_seconds"].labels(method, route)
        self.disconnects = families["http_client_disconnects_total"].labels(method, route)
        self.durations: dict[int, Any] = {}


class _Exchange(RequestState):
    """What the wrapped receive/send saw of one request (and its ``RequestState``)."""

    __slots__ = (
        "body_bytes",
        "body_done",
        "disconnected",
        "first_byte",
        "received_logged",
        "response_bytes",
        "response_done",
        "status",
    )

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.body_bytes = 0
        self.body_done = False
        self.received_logged = False
        self.disconnected = False
        self.status = 0
        self.first_byte = 0.0
        self.response_bytes = 0
        self.response_done = False


class AivitalsMiddleware:
    """Instruments an ASGI app: metrics, request id, lifecycle logs, and ``/metrics``.

    **Usage**::

        app = AivitalsMiddleware(app)                       # any ASGI app
        fastapi_app.add_middleware(AivitalsMiddleware)      # or inside Starlette's stack
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        config: InstrumentConfig | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        guard: CardinalityGuard | None = None,
        **settings: Any,
    ) -> None:
        self.app = app
        self.config = config if config is not None else InstrumentConfig(**settings)
        if config is not None and settings:
            self.config = _merged(config, settings)
        cfg = self.config
        self._families = {name: family(name, registry) for name in _FAMILIES}
        self._unmatched = family("http_unmatched_requests_total", registry)
        self._errors = family("http_server_errors_total", registry)
        self._guard = guard or CardinalityGuard(max_values=cfg.max_route_values, registry=registry)
        self._resolver = RouteResolver(app, templates=cfg.routes)
        self._children: dict[tuple[str, str], _RouteChildren] = {}
        self._metrics_path = cfg.metrics_path
        self._metrics_app = metrics_app(registry=registry) if cfg.metrics_path else None
        self._header = cfg.request_id_header.encode("latin-1")
        self._id_ok = re.compile(_ID_CHARS + b"{1,%d}\\Z" % cfg.max_request_id_length)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == self._metrics_path and self._metrics_app is not None:
            await self._metrics_app(scope, receive, send)
            return
        if path in self.config.exclude_paths:
            await self.app(scope, receive, send)
            return
        await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        rid, rid_raw = self._request_id(scope)
        children = self._route_children(scope)
        children.in_flight.inc()
        ex = state = _Exchange(rid)
        rid_token = REQUEST_ID.set(rid)
        state_token = REQUEST_STATE.set(state)
        route_token = ROUTE.set(children.labels[1])
        logging_on = self.config.lifecycle_logs and LIFECYCLE.isEnabledFor(20)

        async def receive_wrapper() -> Message:
            message = await receive()
            kind = message["type"]
            if kind == "http.request":
                ex.body_bytes += len(message.get("body", b""))
                if not message.get("more_body", False):
                    ex.body_done = True
                    if logging_on:
                        self._log_received(scope, children, ex)
            elif kind == "http.disconnect" and not ex.response_done:
                self._client_gone(ex, rid, children)
            return message

        async def send_wrapper(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.body":
                body = message.get("body", b"")
                if body and not ex.first_byte and message.get("more_body", False):
                    ex.first_byte = time.perf_counter()  # a streamed response's first chunk
                ex.response_bytes += len(body)
                if not message.get("more_body", False):
                    ex.response_done = True
            elif kind == "http.response.start":
                ex.status = message["status"]
                message["headers"] = [*message.get("headers", ()), (self._header, rid_raw)]
                if logging_on and not ex.received_logged:
                    self._log_received(scope, children, ex)
            try:
                await send(message)
            except OSError:
                self._client_gone(ex, rid, children)
                raise

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        except asyncio.CancelledError:
            self._client_gone(ex, rid, children)
            raise
        except BaseException as exc:
            # record, then re-raise: the server answers 500 or closes, as without us
            if ex.disconnected or type(exc).__name__ in _DISCONNECT_ERRORS:
                self._client_gone(ex, rid, children)  # the app failed because the client left
                state.error_code = state.error_code or "CLIENT_DISCONNECT"
            else:
                name = self._guard.fold("http_server_errors_total", "exception", type(exc).__name__)
                self._errors.labels(*children.labels, name).inc()
                ex.status = ex.status or 500
                state.error_code = state.error_code or "INTERNAL"
            raise
        finally:
            self._finish(start, scope, children, ex, state, logging_on)
            ROUTE.reset(route_token)
            REQUEST_STATE.reset(state_token)
            REQUEST_ID.reset(rid_token)

    def _finish(
        self,
        start: float,
        scope: Scope,
        children: _RouteChildren,
        ex: _Exchange,
        state: RequestState,
        logging_on: bool,
    ) -> None:
        end = time.perf_counter()
        children.in_flight.dec()
        status = ex.status or _CLIENT_CLOSED
        duration = children.durations.get(status)
        if duration is None:
            duration = self._duration_child(children, status)
        duration.observe(end - start)
        children.body.observe(ex.body_bytes)
        children.response.observe(ex.response_bytes)
        if ex.first_byte:
            children.ttfb.observe(ex.first_byte - start)
        if logging_on:
            self._log_responded(scope, children, ex, state, status, end - start)
        if REQUEST_SINKS:
            method, route = children.labels
            info = {"method": method, "route": route, "status": status, "seconds": end - start}
            notify(REQUEST_SINKS, info)

    def _request_id(self, scope: Scope) -> tuple[str, bytes]:
        for name, value in scope["headers"]:
            if name == self._header:
                if self._id_ok.match(value):
                    return value.decode("ascii"), bytes(value)
                break
        raw = f"{_random_bits(128):032x}"  # no syscall per request, unlike os.urandom
        return raw, raw.encode("ascii")

    def _route_children(self, scope: Scope) -> _RouteChildren:
        method = scope["method"]
        if method not in _METHODS:
            method = OTHER
        resolver = self.config.route_resolver
        route = (resolver(scope) or UNMATCHED) if resolver else self._resolver.resolve(scope)
        children = self._children.get((method, route))
        if children is None:
            children = self._new_children(method, route)
        if route == UNMATCHED:
            self._unmatched.labels(method).inc()
        return children

    def _new_children(self, method: str, route: str) -> _RouteChildren:
        if route != UNMATCHED:
            route = self._guard.fold(_DURATION, "route", route)
        children = self._children.get((method, route))
        if children is None:
            children = _RouteChildren(self._families, method, route)
            self._children[(method, route)] = children
        return children

    def _duration_child(self, children: _RouteChildren, status: int) -> Any:
        code = status if 100 <= status <= 599 else 0
        child = self._families[_DURATION].labels(
            *children.labels, f"{code // 100}xx" if code else "other", str(code or OTHER)
        )
        children.durations[status] = child
        return child

    def _client_gone(self, ex: _Exchange, rid: str, children: _RouteChildren) -> None:
        if ex.disconnected or ex.response_done:
            return
        ex.disconnected = True
        children.disconnects.inc()
        if self.config.abort_on_disconnect:
            abort_request(rid, "client_disconnect")

    def _log_received(self, scope: Scope, children: _RouteChildren, ex: _Exchange) -> None:
        ex.received_logged = True
        fields = {
            "method": children.labels[0],
            "route": children.labels[1],
            "body_size_bytes": ex.body_bytes,
        }
        if ex.body_bytes and not ex.body_done:
            fields["body_complete"] = False  # logged at the response: the app read part of it
        log_event("received", fields)

    def _log_responded(
        self,
        scope: Scope,
        children: _RouteChildren,
        ex: _Exchange,
        state: RequestState,
        status: int,
        seconds: float,
    ) -> None:
        if not ex.received_logged:
            self._log_received(scope, children, ex)
        fields = {
            "route": children.labels[1],
            "status": status,
            "total_time_ms": round(seconds * 1000.0, 3),
            "gpu_time_ms": round(state.gpu_time * 1000.0, 3),
            "response_size_bytes": ex.response_bytes,
        }
        if ex.disconnected and not ex.response_done:
            fields["client_disconnected"] = True
        log_event("responded", fields)


_FAMILIES = (
    _DURATION,
    "http_time_to_first_byte_seconds",
    "http_requests_in_flight",
    "http_request_body_size_bytes",
    "http_response_body_size_bytes",
    "http_client_disconnects_total",
)


def _merged(config: InstrumentConfig, settings: dict[str, Any]) -> InstrumentConfig:
    from dataclasses import replace

    return replace(config, **settings)


def instrument(
    app: Any,
    *,
    config: InstrumentConfig | None = None,
    registry: CollectorRegistry | None = REGISTRY,
    **settings: Any,
) -> Any:
    """Instrument an ASGI app; returns the app to serve.

    A Starlette/FastAPI app gets the middleware added to its own stack (inside
    its error handler, so exceptions are seen before they become 500s) and is
    returned as is; any other ASGI app is returned wrapped. Settings are
    ``InstrumentConfig``'s keywords (``metrics_path="/metrics"`` by default).

    **Usage**::

        app = FastAPI()
        aivitals.instrument(app)
        app = aivitals.instrument(raw_asgi_app, routes=["/v1/generate"])
    """
    if isinstance(app, AivitalsMiddleware) or getattr(app, _MARK, False):
        return app  # instrumenting twice would count every request twice
    add = getattr(app, "add_middleware", None)
    if callable(add) and hasattr(app, "user_middleware"):
        add(AivitalsMiddleware, config=config, registry=registry, **settings)
        setattr(app, _MARK, True)
        return app
    return AivitalsMiddleware(app, config=config, registry=registry, **settings)


_MARK = "_aivitals_instrumented"
