"""The pure ASGI middleware: request id, HTTP metrics, lifecycle log lines.

Pure ASGI (never Starlette's base HTTP middleware class): ``receive`` is wrapped to count the
body bytes actually received, ``send`` to see the status, the first body byte
and the response size. Labelled children are looked up once per (method,
route) and per status and kept, so a request costs a few dict lookups and
prometheus_client observations.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from time import perf_counter, time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from ..errors import ConfigError
from ._abort import abort_request
from ._config import InstrumentConfig
from ._context import REQUEST_STATE, TRACERS, RequestState
from ._exposition import metrics_app
from ._fast import FOLD_AT, PENDING, FastFamily, fold_pending, is_lean
from ._labels import OTHER, CardinalityGuard
from ._logging import LIFECYCLE, RequestLines, fast_lane, log_event
from ._metrics import family
from ._routes import UNMATCHED, RouteResolver, declared_routes, metrics_path_taken
from ._sinks import REQUEST_SINKS, notify

__all__ = ["AivitalsMiddleware", "instrument"]

_log = logging.getLogger("aivitals.instrument")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}
)
_ID_CHARS = rb"[A-Za-z0-9._:@/+=\-]"
#: (method, route) keys kept for the hot path's single dict lookup
_MAX_CHILD_KEYS = 4096


class _RequestIds:
    """Generated request ids: a random per-process prefix and a counter.

    32 characters: 20 random hex digits drawn once per process (80 bits),
    then a 12-digit decimal counter. Unique, not secret, and cheap: one
    string concatenation per request, no syscall and no hex formatting. A
    forked worker draws a new prefix, so gunicorn's pre-forked workers never
    share ids.
    """

    def __init__(self) -> None:
        self.prefix = ""
        self.counter: itertools.count[int] = itertools.count()
        self.reseed()

    def reseed(self) -> None:
        self.prefix = secrets.token_hex(10)
        # from 10**11: every id has the same length for 900 billion requests
        self.counter = itertools.count(10**11)

    def new(self) -> str:
        """The next id (the middleware inlines this expression)."""
        return self.prefix + str(next(self.counter))


_ids = _RequestIds()
os.register_at_fork(after_in_child=_ids.reseed)
_CLIENT_CLOSED = 499  # nginx's convention: the client went away before a response
_DURATION = "http_request_duration_seconds"
#: exceptions frameworks raise when the client went away mid-request
_DISCONNECT_ERRORS = frozenset({"ClientDisconnect", "ClientDisconnected"})


class _RouteChildren:
    """The labelled children of one (method, route), plus its per-status durations."""

    __slots__ = (
        "body",
        "disconnects",
        "durations",
        "in_flight",
        "labels",
        "lean",
        "lines",
        "response",
        "ttfb",
    )

    def __init__(self, families: dict[str, Any], method: str, route: str) -> None:
        self.labels = (method, route)
        self.in_flight = families["http_requests_in_flight"].labels(method, route)
        self.body = families["http_request_body_size_bytes"].labels(method, route)
        self.response = families["http_response_body_size_bytes"].labels(method, route)
        self.ttfb = families["http_time_to_first_byte_seconds"].labels(method, route)
        self.disconnects = families["http_client_disconnects_total"].labels(method, route)
        self.durations: dict[int, Any] = {}
        self.lines = RequestLines(LIFECYCLE.name, method, route)
        # lean children (single-process mode): requests are recorded through
        # _fast.PENDING, and this is the route's part of each entry (else None)
        lean = is_lean(self.in_flight, self.body, self.response)
        lean = lean and isinstance(families[_DURATION], FastFamily)
        self.lean = (self.in_flight, self.body, self.response) if lean else None


class _Record(RequestState):
    """One request as the metrics and log lines see it, whatever the server protocol.

    The ASGI exchange below and the WSGI one (``_wsgi.py``) add their
    plumbing. Rarely read flags default at class level (no ``__slots__``), so
    a request without lifecycle logs stores eleven attributes at creation,
    not twenty-two.
    """

    body_bytes = 0
    body_done = False
    received_logged = False
    disconnected = False
    status = 0
    first_byte = 0.0
    response_bytes = 0
    response_done = False
    #: the log writer's direct lane (None: through a LogRecord); False until looked up
    lane: Any = False
    children: _RouteChildren
    abort_on_disconnect = True

    def client_gone(self) -> None:
        if self.disconnected or self.response_done:
            return
        self.disconnected = True
        self.children.disconnects.inc()
        if self.abort_on_disconnect and self.request_id:
            abort_request(self.request_id, "client_disconnect")

    def log_received(self) -> None:
        self.received_logged = True
        # body_complete: false when the app read only part of the body
        complete = self.body_done or not self.body_bytes
        self.log((self.children.lines, 0, self.context(), time(), self.body_bytes, complete))

    def log_responded(self, status: int, seconds: float) -> None:
        if not self.received_logged:
            self.log_received()
        # milliseconds to the microsecond; float arithmetic, as round(x, 3)
        # costs a quarter of a microsecond each
        self.log(
            (
                self.children.lines,
                1,
                self.context(),
                time(),
                status,
                (seconds * 1e6 + 0.5) // 1 / 1000,
                (self.gpu_time * 1e6 + 0.5) // 1 / 1000,
                self.response_bytes,
                self.disconnected and not self.response_done,
            )
        )

    def context(self) -> tuple[Any, ...]:
        return (
            self.request_id,
            self.model_version,
            self.input_token_count,
            self.gpu_device_id,
            self.error_code,
        )

    def log(self, item: tuple[Any, ...]) -> None:
        # a RequestLines tuple: straight into the writer's buffer when it is
        # the only handler (looked up once per request), else through log_event
        lane = self.lane
        if lane is False:
            lane = self.lane = fast_lane(LIFECYCLE)
        if lane is None:
            _, event, _, fields, _ = self.children.lines.event(item)
            log_event(event, fields)
        else:
            lane.push(item)


class _Exchange(_Record):
    """One ASGI request: its record, and the wrapped receive/send.

    ``receive``/``send`` are methods of this one object rather than closures,
    which would allocate a function and a cell per captured variable for every
    request.
    """

    def __init__(
        self,
        request_id: str,
        header: tuple[bytes, bytes],
        children: _RouteChildren,
        receive: Receive,
        send: Send,
        logging_on: bool,
        abort_on_disconnect: bool,
    ) -> None:
        self.request_id = request_id
        self.route = children.labels[1]
        self.header = header
        self.children = children
        self.inner_receive = receive
        self.inner_send = send
        self.logging_on = logging_on
        self.abort_on_disconnect = abort_on_disconnect
        # Read on every request: stored here, so those reads stay specialised
        # (an attribute found only on the class takes the interpreter's slow
        # generic lookup each time).
        self.body_bytes = 0
        self.response_bytes = 0
        self.first_byte = 0.0
        if logging_on:  # what the log lines read
            self.received_logged = False
            self.lane = False
            self.model_version = None
            self.input_token_count = None
            self.gpu_device_id = None
            self.error_code = None
            self.gpu_time = 0.0

    async def receive(self) -> Message:
        message = await self.inner_receive()
        kind = message["type"]
        if kind == "http.request":
            self.body_bytes += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.body_done = True
                if self.logging_on:
                    self.log_received()
        elif kind == "http.disconnect" and not self.response_done:
            self.client_gone()
        return message

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            body = message.get("body", b"")
            if message.get("more_body", False):
                if body and not self.first_byte:
                    self.first_byte = perf_counter()  # a streamed response's first chunk
            else:
                self.response_done = True
            self.response_bytes += len(body)
        elif kind == "http.response.start":
            self.status = message["status"]
            message["headers"] = [*message.get("headers", ()), self.header]
            if self.logging_on and not self.received_logged:
                self.log_received()
        try:
            await self.inner_send(message)
        except OSError:
            self.client_gone()
            raise


class _TracedExchange(_Exchange):
    """An ASGI request while a tracer is enabled: its span, and ``traceparent`` in the response.

    A subclass, so that untraced requests keep the plain exchange's code.
    The lifecycle lines go through ``log_event`` to carry ``trace_id``.
    """

    span: Any = None
    otel_token: Any = None
    trace_id: str | None = None
    traceparent: tuple[bytes, bytes] | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self.traceparent is not None:
            message["headers"] = [*message.get("headers", ()), self.traceparent]
        await _Exchange.send(self, message)

    def log(self, item: tuple[Any, ...]) -> None:
        _, event, _, fields, _ = self.children.lines.event(item)
        log_event(event, {**fields, "trace_id": self.trace_id})


class _RouteTable:
    """The labelled children of every (method, route), shared by the ASGI and WSGI middleware."""

    _children: dict[tuple[str, str], _RouteChildren]
    _families: dict[str, Any]
    _guard: CardinalityGuard
    _special: set[str] | frozenset[str]

    def _new_children(self, method: str, route: str) -> _RouteChildren:
        # first request of this (method, route): the raw pair maps onto the
        # children of the normalised pair, kept under both keys after this
        raw = (method, route)
        if method not in _METHODS:
            method = OTHER
        if route != UNMATCHED:
            route = self._guard.fold(_DURATION, "route", route)
        children = self._children.get((method, route))
        if children is None:
            children = _RouteChildren(self._families, method, route)
            self._children[(method, route)] = children
        if len(self._children) < _MAX_CHILD_KEYS:
            self._children[raw] = children
        return children

    def _duration_child(self, children: _RouteChildren, status: int) -> Any:
        code = status if 100 <= status <= 599 else 0
        child = self._families[_DURATION].labels(
            *children.labels, f"{code // 100}xx" if code else "other", str(code or OTHER)
        )
        children.durations[status] = child
        return child

    def _declare_pairs(self, pairs: list[tuple[str, str]]) -> None:
        """Create each (method, route)'s request series at zero (2xx, status 200)."""
        for method, route in pairs:
            if route in self._special or len(self._children) >= _MAX_CHILD_KEYS:
                continue
            children = self._children.get((method, route)) or self._new_children(method, route)
            if 200 not in children.durations:
                self._duration_child(children, 200)


class AivitalsMiddleware(_RouteTable):
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
        #: (method, raw path) -> children, for paths a route matched: the hot
        #: path's one lookup (a custom route_resolver may look past the path,
        #: so with one every request asks it)
        self._by_path: dict[tuple[str, str], _RouteChildren] = {}
        self._metrics_path = cfg.metrics_path
        self._metrics_app = metrics_app(registry=registry) if cfg.metrics_path else None
        self._header = cfg.request_id_header.encode("latin-1")
        self._route_resolver = cfg.route_resolver
        self._lifecycle_logs = cfg.lifecycle_logs
        self._abort_on_disconnect = cfg.abort_on_disconnect
        self._exclude_paths = cfg.exclude_paths
        # paths handled off the instrumented path: one set test per request
        self._special = cfg.exclude_paths | ({cfg.metrics_path} if cfg.metrics_path else set())
        self._id_ok = re.compile(_ID_CHARS + b"{1,%d}\\Z" % cfg.max_request_id_length)
        #: the declared routes' series exist (at zero) once this is True; see _declare
        self._declared = False
        self._check_metrics_path(starting=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._special:
            await self._not_instrumented(scope, receive, send)
            return
        # The hot path: everything a request costs is in this method, inlined
        # (request id, route lookup, the final observations) because each
        # Python call or coroutine level saved is a measurable part of the
        # few microseconds a request costs.
        start = perf_counter()
        header = self._header
        rid: str | None = None
        rid_raw = b""
        for name, value in scope["headers"]:
            if name == header:
                if self._id_ok.match(value):
                    rid_raw = bytes(value)
                    rid = rid_raw.decode("ascii")
                break
        if rid is None:
            rid = _ids.prefix + str(next(_ids.counter))  # _ids.new(), inlined
            rid_raw = rid.encode("ascii")
        children = self._by_path.get((scope["method"], scope["path"]))
        if children is None:
            children = self._route_children(scope)
        if children.lean:
            PENDING.append(children.in_flight)  # started; see _fast.fold_pending
        else:
            children.in_flight.inc()
        tracer = TRACERS[0] if TRACERS else None
        ex = (_Exchange if tracer is None else _TracedExchange)(
            rid,
            (header, rid_raw),
            children,
            receive,
            send,
            self._lifecycle_logs and LIFECYCLE.isEnabledFor(20),
            self._abort_on_disconnect,
        )
        state_token = REQUEST_STATE.set(ex)
        if tracer is not None:
            tracer.start(scope, ex, *children.labels)
        try:
            await self.app(scope, ex.receive, ex.send)
        except asyncio.CancelledError:
            ex.client_gone()
            raise
        except BaseException as exc:
            # record, then re-raise: the server answers 500 or closes, as without us
            if ex.disconnected or type(exc).__name__ in _DISCONNECT_ERRORS:
                ex.client_gone()  # the app failed because the client left
                ex.error_code = ex.error_code or "CLIENT_DISCONNECT"
            else:
                name = self._guard.fold("http_server_errors_total", "exception", type(exc).__name__)
                self._errors.labels(*children.labels, name).inc()
                ex.status = ex.status or 500
                ex.error_code = ex.error_code or "INTERNAL"
            raise
        finally:
            seconds = perf_counter() - start
            status = ex.status or _CLIENT_CLOSED
            duration = children.durations.get(status)
            if duration is None:
                duration = self._duration_child(children, status)
            body = ex.body_bytes
            if not ex.body_done:
                # answered without reading the whole body (a guard refusing it by its
                # Content-Length): the client sent it all the same, and 100 kB inputs
                # refused unread were measured as 0-byte requests
                body = max(body, _declared_length(scope))
            if children.lean:
                # a Finished entry; folded in a batch, or at the next scrape
                PENDING.append((children.lean, duration, seconds, body, ex.response_bytes))
                if len(PENDING) >= FOLD_AT:
                    fold_pending()
            else:
                children.in_flight.dec()
                duration.observe(seconds)
                children.body.observe(body)
                children.response.observe(ex.response_bytes)
            if ex.first_byte:
                children.ttfb.observe(ex.first_byte - start)
            if ex.logging_on:
                ex.log_responded(status, seconds)
            if REQUEST_SINKS:
                info = {
                    "method": children.labels[0],
                    "route": children.labels[1],
                    "status": status,
                    "seconds": seconds,
                }
                notify(REQUEST_SINKS, info)
            if tracer is not None:
                # after the sinks: their histogram points are recorded inside the
                # span, so OpenTelemetry's exemplars point at this trace
                tracer.end(ex, status, duration, seconds)
            REQUEST_STATE.reset(state_token)

    async def _not_instrumented(self, scope: Scope, receive: Receive, send: Send) -> None:
        # lifespan, websockets, excluded paths, and the exposition itself
        if not self._declared:
            self._declare()
        metrics = self._metrics_app
        if metrics is not None and scope["type"] == "http" and scope["path"] == self._metrics_path:
            await metrics(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _route_children(self, scope: Scope) -> _RouteChildren:
        # the first request of a (method, path), or any unmatched one
        if not self._declared:
            self._declare()
        method = scope["method"]
        if self._route_resolver is None:
            route = self._resolver.resolve(scope)
        else:
            route = self._route_resolver(scope) or UNMATCHED
        children = self._children.get((method, route))
        if children is None:
            children = self._new_children(method, route)
        if route == UNMATCHED:
            # never kept by path: a scan of random paths must not fill memory
            self._unmatched.labels(children.labels[0]).inc()
        elif self._route_resolver is None and len(self._by_path) < _MAX_CHILD_KEYS:
            self._by_path[(method, scope["path"])] = children
        return children

    def _declare(self) -> None:
        """Create each declared route's request series at zero (2xx, status 200).

        A service nobody has called yet then exports ``http_request_duration_seconds``
        (count 0) instead of nothing, so "the service exports no HTTP metrics"
        (``absent(...)``, ServiceMetricsAbsent) means a broken exporter or scrape,
        not an idle service. Runs once, at the lifespan startup or the first
        request (routes are complete by then), never on the hot path.
        """
        self._declared = True
        self._check_metrics_path(starting=False)
        if self._route_resolver is not None and not self.config.routes:
            return  # a custom resolver's labels cannot be known in advance
        try:
            pairs = declared_routes(self.app, self.config.routes)
        except Exception:  # an app we cannot walk: its series appear with its requests
            return
        self._declare_pairs(pairs)

    def _check_metrics_path(self, *, starting: bool) -> None:
        """Never shadow a path the app serves: refuse at start, give way to a route added
        later (the middleware answers its path before the app, so a silent overlap would
        hide the framework's own exporter)."""
        path = self._metrics_path
        if path is None or self._metrics_app is None:
            return
        if not self._resolver.known:
            if starting:
                _log.warning(
                    "aivitals answers %s in front of this ASGI app and cannot see the app's "
                    "own routes: if the app serves %s itself, pass metrics_path= another path "
                    "(or None); pass routes=[...] templates to have this checked",
                    path,
                    path,
                )
            return
        message = metrics_path_taken(path, self._resolver.serves(path), "metrics_app()")
        if message is None:
            return
        if starting:
            raise ConfigError(message)
        self._metrics_app = None
        self._special = self.config.exclude_paths
        _log.error("%s; aivitals does not serve %s", message, path)


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
    """Instrument an ASGI app; returns the app to serve (WSGI apps: ``instrument_wsgi``).

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
    from ._wsgi import looks_wsgi

    if looks_wsgi(app):
        raise ConfigError(
            f"instrument(app): {type(app).__name__} is a WSGI application (Flask, Django); "
            f"instrument it with aivitals.instrument.instrument_wsgi(app)"
        )
    add = getattr(app, "add_middleware", None)
    if callable(add) and hasattr(app, "user_middleware"):
        add(AivitalsMiddleware, config=config, registry=registry, **settings)
        setattr(app, _MARK, True)
        return app
    return AivitalsMiddleware(app, config=config, registry=registry, **settings)


_MARK = "_aivitals_instrumented"


def _declared_length(scope: Scope) -> int:
    """The request's ``Content-Length`` (0 when absent or not a number)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return max(0, int(value))
            except ValueError:
                return 0
    return 0
