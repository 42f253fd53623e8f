"""The WSGI middleware: the ASGI middleware's metrics, request id and log lines for Flask,
Django or any WSGI app.

Same metric families (built once per registry by ``family``), labels and
buckets, the same request id rules and the same lifecycle lines; only the
plumbing differs. ``wsgi.input`` is wrapped to count the body bytes the app
reads, ``start_response`` to see the status and add the id header, and the
response iterable to count the bytes sent and to end the request when the
server closes it: a streamed body is produced after the app has returned.

Route templates come from a Flask (Werkzeug) ``url_map`` found on the app or
under it (``/v1/items/<int:item_id>``), else from ``routes=`` templates or a
``route_resolver``; every other path is ``<unmatched>``, never the raw path.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextvars import Token
from time import perf_counter
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from ..errors import ConfigError
from ._config import InstrumentConfig
from ._context import REQUEST_STATE, RequestState
from ._exposition import metrics_wsgi_app
from ._fast import FOLD_AT, PENDING, fold_pending
from ._labels import CardinalityGuard
from ._logging import LIFECYCLE
from ._metrics import family, multiprocess_dir
from ._middleware import (
    _CLIENT_CLOSED,
    _DISCONNECT_ERRORS,
    _FAMILIES,
    _ID_CHARS,
    _MAX_CHILD_KEYS,
    _ids,
    _merged,
    _Record,
    _RouteChildren,
    _RouteTable,
)
from ._multiprocess import ensure_multiprocess
from ._routes import (
    MAX_DECLARED,
    TEMPLATE_METHODS,
    UNMATCHED,
    compile_template,
    metrics_path_taken,
)
from ._sinks import REQUEST_SINKS, notify

__all__ = ["AivitalsWSGIMiddleware", "instrument_wsgi", "looks_asgi", "looks_wsgi"]

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_log = logging.getLogger("aivitals.instrument")
_MARK = "_aivitals_instrumented"
_MAX_DEPTH = 16
#: methods a Flask rule carries that are not routes of their own
_IMPLIED_METHODS = frozenset({"HEAD", "OPTIONS"})


class _Input:
    """``wsgi.input`` as the app sees it: the server's stream, counting the bytes read."""

    __slots__ = ("ex", "stream")

    def __init__(self, stream: Any, ex: _WSGIExchange) -> None:
        self.stream = stream
        self.ex = ex

    def read(self, *size: Any) -> bytes:
        data: bytes = self.stream.read(*size)
        whole = not size or size[0] is None or size[0] < 0
        self.ex.got(len(data), whole or (not data and size[0] != 0))
        return data

    def readline(self, *size: Any) -> bytes:
        data: bytes = self.stream.readline(*size)
        self.ex.got(len(data), not data and (not size or size[0] != 0))
        return data

    def readlines(self, *hint: Any) -> list[bytes]:
        lines: list[bytes] = self.stream.readlines(*hint)
        self.ex.got(sum(map(len, lines)), not hint or not lines)
        return lines

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def close(self) -> None:
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()


class _WSGIExchange(_Record):
    """One WSGI request: its record, the wrapped ``start_response``, and the response iterable.

    The server iterates this object and closes it; the request ends when the
    iterable is exhausted (the last byte handed to the server, as the ASGI
    middleware ends it at the last ``send``), at the app's exception, or at a
    close that comes before the end (the client went away).
    """

    declared = 0
    chunks = 0
    closed = False
    ended = False
    token: Token[RequestState | None] | None = None
    exception: BaseException | None = None
    #: the exception was the app's (counted in http_server_errors_total), not a disconnect
    server_error = False
    iterator: Iterator[bytes] | None = None
    result: Iterable[bytes] = ()

    def __init__(
        self,
        owner: AivitalsWSGIMiddleware,
        request_id: str,
        children: _RouteChildren,
        start: float,
        start_response: StartResponse,
        logging_on: bool,
    ) -> None:
        self.owner = owner
        self.request_id = request_id
        self.route = children.labels[1]
        self.children = children
        self.start = start
        self.inner_start_response = start_response
        self.logging_on = logging_on
        self.abort_on_disconnect = owner._abort_on_disconnect
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

    # ---- the request body -----------------------------------------------------------------
    def got(self, n: int, eof: bool) -> None:
        self.body_bytes += n
        if eof or (self.declared and self.body_bytes >= self.declared):
            self.body_done = True
            if self.logging_on and not self.received_logged:
                self.log_received()

    # ---- the response ---------------------------------------------------------------------
    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Any:
        try:
            self.status = int(status[:3])
        except ValueError:
            self.status = 0
        if self.logging_on and not self.received_logged:
            self.log_received()
        self.inner_write = self.inner_start_response(
            status, [*headers, (self.owner._header_name, self.request_id)], exc_info
        )
        return self.write

    def write(self, data: bytes) -> None:
        # the legacy write() callable: bytes sent outside the iterable still count
        self.sent(data)
        self.inner_write(data)

    def sent(self, chunk: bytes) -> None:
        if chunk:
            if not self.chunks:
                self.first_byte = perf_counter()
            self.chunks += 1
            self.response_bytes += len(chunk)

    def __iter__(self) -> _WSGIExchange:
        return self

    def __next__(self) -> bytes:
        iterator = self.iterator
        if iterator is None:
            iterator = self.iterator = iter(self.result)
        try:
            chunk = next(iterator)
        except StopIteration:
            self.response_done = True
            self.end()
            raise
        except BaseException as exc:
            self.failed(exc)
            self.end()
            raise
        self.sent(chunk)
        return chunk

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.ended and not self.response_done and self.exception is None:
            # the server stopped before the end: the client went away mid-response.
            # Said first, so abort hooks reach work that outlives the iterable's close.
            self.client_gone()
        try:
            close = getattr(self.result, "close", None)
            if close is not None:
                close()
        except BaseException as exc:
            self.failed(exc)
            raise
        finally:
            self.end()
            self.unbind()

    def unbind(self) -> None:
        """Take the request's state off the thread (bound from the call to the close)."""
        token = self.token
        if token is not None:
            self.token = None
            try:
                REQUEST_STATE.reset(token)
            except (ValueError, RuntimeError):
                pass  # closed in another context than it began in: nothing of ours is bound here

    def end(self) -> None:
        """The request is over: the last byte went to the server, or it failed, or was cut."""
        if not self.ended:
            self.ended = True
            self.owner._finish(self)

    # ---- failures -------------------------------------------------------------------------
    def failed(self, exc: BaseException) -> None:
        if self.exception is not None:
            return
        self.exception = exc
        if self.disconnected or _is_disconnect(exc):
            self.client_gone()  # the app failed because the client left
            self.error_code = self.error_code or "CLIENT_DISCONNECT"
        else:
            self.server_error = True
            self.status = self.status or 500
            self.error_code = self.error_code or "INTERNAL"


def _is_disconnect(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError) or type(exc).__name__ in _DISCONNECT_ERRORS


class AivitalsWSGIMiddleware(_RouteTable):
    """Instruments a WSGI app: metrics, request id, lifecycle logs, and ``/metrics``.

    The same ``InstrumentConfig`` as the ASGI middleware; a ``route_resolver``
    receives the WSGI environ. Use ``instrument_wsgi(app)``, which wraps a
    Flask app's ``wsgi_app`` in place.

    **Usage**::

        app.wsgi_app = AivitalsWSGIMiddleware(app.wsgi_app)     # Flask, by hand
        application = AivitalsWSGIMiddleware(get_wsgi_application(), routes=[...])  # Django
    """

    def __init__(
        self,
        app: WSGIApp,
        *,
        config: InstrumentConfig | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        guard: CardinalityGuard | None = None,
        **settings: Any,
    ) -> None:
        _check_wsgi(app, "AivitalsWSGIMiddleware")
        self.app = app
        self.config = config if config is not None else InstrumentConfig(**settings)
        if config is not None and settings:
            self.config = _merged(config, settings)
        cfg = self.config
        ensure_multiprocess()  # several gunicorn workers: shared files before any metric
        self._families = {name: family(name, registry) for name in _FAMILIES}
        self._unmatched = family("http_unmatched_requests_total", registry)
        self._errors = family("http_server_errors_total", registry)
        self._guard = guard or CardinalityGuard(max_values=cfg.max_route_values, registry=registry)
        self._routes = WSGIRoutes(app, templates=cfg.routes)
        self._children: dict[tuple[str, str], _RouteChildren] = {}
        #: (method, PATH_INFO) -> children, for paths a route matched (see the ASGI middleware)
        self._by_path: dict[tuple[str, str], _RouteChildren] = {}
        self._metrics_path = cfg.metrics_path
        self._metrics_app = metrics_wsgi_app(registry=registry) if cfg.metrics_path else None
        self._header_key = "HTTP_" + cfg.request_id_header.upper().replace("-", "_")
        self._header_name = cfg.request_id_header
        self._route_resolver = cfg.route_resolver
        self._lifecycle_logs = cfg.lifecycle_logs
        self._abort_on_disconnect = cfg.abort_on_disconnect
        self._special = cfg.exclude_paths | ({cfg.metrics_path} if cfg.metrics_path else set())
        self._id_ok = re.compile(f"{_ID_CHARS.decode()}{{1,{cfg.max_request_id_length}}}\\Z")
        self._declared = False
        self._check_metrics_path(starting=True)
        _count_flask_exceptions(self._routes.owner)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in self._special:
            return self._not_instrumented(environ, start_response, path)
        start = perf_counter()
        rid = environ.get(self._header_key)
        if rid is None or not self._id_ok.match(rid):
            rid = _ids.prefix + str(next(_ids.counter))  # _ids.new(), inlined
        method = environ.get("REQUEST_METHOD", "GET")
        children = self._by_path.get((method, path))
        if children is None:
            children = self._route_children(environ, method, path)
        if children.lean:
            PENDING.append(children.in_flight)  # started; see _fast.fold_pending
        else:
            children.in_flight.inc()
        ex = _WSGIExchange(
            self,
            rid,
            children,
            start,
            start_response,
            self._lifecycle_logs and LIFECYCLE.isEnabledFor(20),
        )
        length = environ.get("CONTENT_LENGTH")
        if (length and length != "0") or "HTTP_TRANSFER_ENCODING" in environ:
            ex.declared = _length(length)
            environ["wsgi.input"] = _Input(environ["wsgi.input"], ex)
        elif ex.logging_on:
            ex.body_done = True  # nothing to receive: received at once
            ex.log_received()
        # Bound until the server closes the response, not only for this call: a
        # streamed body runs the app's code while the server iterates it, and its
        # model calls and log lines belong to the request.
        ex.token = REQUEST_STATE.set(ex)
        try:
            ex.result = self.app(environ, ex.start_response)
        except BaseException as exc:
            # record, then re-raise: the server answers 500 or closes, as without us
            ex.failed(exc)
            ex.end()
            ex.unbind()
            raise
        return ex

    def _finish(self, ex: _WSGIExchange) -> None:
        seconds = perf_counter() - ex.start
        children = ex.children
        exc = ex.exception
        if exc is not None and ex.server_error:
            name = self._guard.fold("http_server_errors_total", "exception", type(exc).__name__)
            self._errors.labels(*children.labels, name).inc()
        status = ex.status or _CLIENT_CLOSED
        duration = children.durations.get(status)
        if duration is None:
            duration = self._duration_child(children, status)
        body = ex.body_bytes
        if not ex.body_done and ex.declared > body:
            body = ex.declared  # answered without reading it all: the client sent it anyway
        if children.lean:
            PENDING.append((children.lean, duration, seconds, body, ex.response_bytes))
            if len(PENDING) >= FOLD_AT:
                fold_pending()
        else:
            children.in_flight.dec()
            duration.observe(seconds)
            children.body.observe(body)
            children.response.observe(ex.response_bytes)
        if ex.chunks > 1:  # a streamed response: time to its first chunk
            children.ttfb.observe(ex.first_byte - ex.start)
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

    def _not_instrumented(
        self, environ: Environ, start_response: StartResponse, path: str
    ) -> Iterable[bytes]:
        # excluded paths, and the exposition itself
        if not self._declared:
            self._declare(environ)
        metrics = self._metrics_app
        if metrics is not None and path == self._metrics_path:
            return metrics(environ, start_response)
        return self.app(environ, start_response)

    def _route_children(self, environ: Environ, method: str, path: str) -> _RouteChildren:
        # the first request of a (method, path), or any unmatched one
        if not self._declared:
            self._declare(environ)
        if self._route_resolver is None:
            route = self._routes.resolve(environ, method, path) or UNMATCHED
        else:
            route = self._route_resolver(environ) or UNMATCHED
        children = self._children.get((method, route))
        if children is None:
            children = self._new_children(method, route)
        if route == UNMATCHED:
            # never kept by path: a scan of random paths must not fill memory
            self._unmatched.labels(children.labels[0]).inc()
        elif self._route_resolver is None and len(self._by_path) < _MAX_CHILD_KEYS:
            self._by_path[(method, path)] = children
        return children

    def _declare(self, environ: Environ) -> None:
        """At the first request: the checks routes added late need, and the series at zero.

        As the ASGI middleware does at the lifespan startup: every declared
        route's ``http_request_duration_seconds`` series exists (count 0) before
        its first request. WSGI has no startup event; the first request, the
        first scrape included, comes after the app's routes are complete.
        """
        self._declared = True
        if environ.get("wsgi.multiprocess") and not multiprocess_dir():
            _log.error(
                "several processes serve this app (wsgi.multiprocess) but "
                "PROMETHEUS_MULTIPROC_DIR is not set: each scrape shows one worker's "
                "metrics; set it to an empty directory before the server starts"
            )
        self._check_metrics_path(starting=False)
        if self._route_resolver is not None and not self.config.routes:
            return  # a custom resolver's labels cannot be known in advance
        try:
            pairs = self._routes.declared()
        except Exception:  # an app we cannot walk: its series appear with its requests
            return
        self._declare_pairs(pairs)

    def _check_metrics_path(self, *, starting: bool) -> None:
        """Never shadow a path the app serves: refuse at start, give way to a route added later."""
        path = self._metrics_path
        if path is None or self._metrics_app is None:
            return
        if not self._routes.known:
            if starting:
                _log.warning(
                    "aivitals answers %s in front of this WSGI app and cannot see the app's "
                    "own routes: if the app serves %s itself, pass metrics_path= another path "
                    "(or None); pass routes=[...] templates to have this checked and the "
                    "route labels filled",
                    path,
                    path,
                )
            return
        message = metrics_path_taken(path, self._routes.serves(path), "metrics_wsgi_app()")
        if message is None:
            return
        if starting:
            raise ConfigError(message)
        # a route added after instrument_wsgi(): the app's route wins, and it is said loudly
        self._metrics_app = None
        self._special = self.config.exclude_paths
        _log.error("%s; aivitals does not serve %s", message, path)


class WSGIRoutes:
    """Route templates for a WSGI app: its Flask/Werkzeug ``url_map``, or ``routes=`` templates."""

    def __init__(self, app: Any, *, templates: Iterable[str] = ()) -> None:
        self.templates = [(t, compile_template(t)) for t in templates]
        self.owner = _find_url_map_owner(app)
        self.url_map: Any = None if self.templates else getattr(self.owner, "url_map", None)

    @property
    def known(self) -> bool:
        """Whether the app's routes can be seen at all."""
        return bool(self.templates) or self.url_map is not None

    def resolve(self, environ: Environ, method: str, path: str) -> str | None:
        if self.url_map is not None:
            try:
                adapter = self.url_map.bind_to_environ(environ)
            except Exception:
                return None
            return _rule(adapter, path, method, redirect=False)
        for template, pattern in self.templates:
            if pattern.match(path):
                return template
        return None

    def serves(self, path: str) -> str | None:
        """The route that answers ``path`` (any method), or None."""
        if self.url_map is not None:
            try:
                adapter = self.url_map.bind("localhost", subdomain=self.url_map.default_subdomain)
            except Exception:
                return None
            return _rule(adapter, path, "GET", redirect=True)
        return self.resolve({}, "GET", path)

    def declared(self) -> list[tuple[str, str]]:
        """(method, template) pairs, HEAD and OPTIONS left out; at most ``MAX_DECLARED``."""
        out: list[tuple[str, str]] = []
        if self.templates:
            out = [(m, t) for t, _ in self.templates for m in TEMPLATE_METHODS]
        elif self.url_map is not None:
            for rule in self.url_map.iter_rules():
                methods = sorted(set(rule.methods or ()) - _IMPLIED_METHODS)
                out.extend((str(m), str(rule.rule)) for m in methods)
        return list(dict.fromkeys(out))[:MAX_DECLARED]


def _rule(adapter: Any, path: str, method: str, *, redirect: bool) -> str | None:
    """The Werkzeug rule string matching ``path``, or None (no Werkzeug import needed)."""
    try:
        rule, _ = adapter.match(path, method=method, return_rule=True)
        return str(rule.rule)
    except Exception as exc:
        valid = getattr(exc, "valid_methods", None)
        if valid:  # MethodNotAllowed: the path is a route's, under other methods
            try:
                rule, _ = adapter.match(path, method=sorted(valid)[0], return_rule=True)
                return str(rule.rule)
            except Exception:
                return None
        new_url = getattr(exc, "new_url", None)
        if redirect and new_url:  # the app answers it with a redirect (a slash added)
            return f"{path} -> {new_url}"
        return None


def _find_url_map_owner(app: Any) -> Any:
    """The object with a ``url_map`` (a Flask app) at or under ``app``, through middleware."""
    for _ in range(_MAX_DEPTH):
        if app is None:
            return None
        if callable(getattr(getattr(app, "url_map", None), "bind_to_environ", None)):
            return app
        # a bound ``flask_app.wsgi_app``, or a middleware holding the next app as ``.app``
        app = getattr(app, "__self__", None) or getattr(app, "app", None)
    return None


def _count_flask_exceptions(owner: Any) -> None:
    """Count a Flask handler's exception, which Flask turns into a 500 itself.

    The middleware sits outside Flask's error handling, so it sees the 500
    response, not the exception; Flask's ``got_request_exception`` signal
    names it. Connected once per app, only when Flask is already loaded.
    """
    flask = sys.modules.get("flask")
    if flask is None or not isinstance(owner, flask.Flask):
        return
    flask.got_request_exception.connect(_on_flask_exception, sender=owner, weak=False)


def _on_flask_exception(sender: Any, exception: BaseException | None = None, **_: Any) -> None:
    state = REQUEST_STATE.get()
    if isinstance(state, _WSGIExchange) and exception is not None:
        state.failed(exception)  # counted in http_server_errors_total when the request ends


def _length(value: str | None) -> int:
    try:
        return max(0, int(value or 0))
    except ValueError:
        return 0


def looks_asgi(app: Any) -> bool:
    """Whether ``app`` is an ASGI app: an ``async def`` callable, or a Starlette-like app."""
    if inspect.iscoroutinefunction(app):
        return True
    # the class's __call__, not callable(): an instance's call is async only there
    call = getattr(type(app), "__call__", None)  # noqa: B004
    if not inspect.isfunction(app) and inspect.iscoroutinefunction(call):
        return True
    return callable(getattr(app, "add_middleware", None)) and hasattr(app, "router")


def looks_wsgi(app: Any) -> bool:
    """Whether ``app`` is plainly WSGI: a ``wsgi_app`` (Flask), or ``(environ, start_response)``."""
    if not callable(app) or looks_asgi(app):
        return False
    if callable(getattr(app, "wsgi_app", None)):
        return True
    try:
        names = list(inspect.signature(app).parameters)
    except (TypeError, ValueError):
        return False
    return names[:2] == ["environ", "start_response"]


def _check_wsgi(app: Any, where: str) -> None:
    """``ConfigError`` for anything that cannot be a WSGI app, naming what to do instead."""
    if not callable(app):
        raise ConfigError(
            f"{where}: expected a WSGI application (a callable taking environ and "
            f"start_response), got {type(app).__name__} {app!r:.80}"
        )
    if looks_asgi(app):
        raise ConfigError(
            f"{where}: {type(app).__name__} is an ASGI application; instrument it with "
            f"aivitals.instrument(app) instead"
        )
    try:
        inspect.signature(app).bind(None, None)
    except TypeError:
        raise ConfigError(
            f"{where}: {app!r:.80} does not take (environ, start_response), so it is not a "
            f"WSGI application"
        ) from None
    except ValueError:
        pass  # a builtin without a signature: take it at its word


def instrument_wsgi(
    app: Any,
    *,
    config: InstrumentConfig | None = None,
    registry: CollectorRegistry | None = REGISTRY,
    **settings: Any,
) -> Any:
    """Instrument a WSGI app (Flask, Django, any); returns the app to serve.

    A Flask app gets the middleware around its own ``wsgi_app`` and is
    returned as is (``app.run()``, ``flask run``, the test client and
    ``gunicorn module:app`` keep working); any other WSGI app is returned
    wrapped. The settings are ``InstrumentConfig``'s, as for ``instrument``.
    Under gunicorn with several workers, multiprocess exposition is set up
    by itself (see ``ensure_multiprocess``).

    **Usage**::

        app = Flask(__name__)
        aivitals.instrument.instrument_wsgi(app)
        application = instrument_wsgi(get_wsgi_application(), routes=["/v1/items/{id}"])
    """
    _check_wsgi(app, "instrument_wsgi")
    if isinstance(app, AivitalsWSGIMiddleware) or getattr(app, _MARK, False):
        return app  # instrumenting twice would count every request twice
    inner = getattr(app, "wsgi_app", None)
    if callable(inner):
        if isinstance(inner, AivitalsWSGIMiddleware):
            return app
        app.wsgi_app = AivitalsWSGIMiddleware(inner, config=config, registry=registry, **settings)
        setattr(app, _MARK, True)
        return app
    return AivitalsWSGIMiddleware(app, config=config, registry=registry, **settings)
