"""The agent's read-only HTTP API on a small stdlib threaded server.

``/`` and ``/console/...`` (the web console of ``aivitals.console``, over this
agent's store, alerts and diagnosis), ``/metrics`` (text exposition),
``/api/v1/query``, ``/api/v1/query_range``,
``/api/v1/labels``, ``/api/v1/label/<name>/values``, ``/api/v1/series`` in the
Prometheus API's JSON, ``/api/v1/alerts``, ``/api/v1/rules`` and ``/api/v1/diagnosis``
from the providers other parts register (without a rule engine the first two answer
an empty document and a warning saying so), ``/-/ready`` and ``/-/healthy``. Nothing here
changes state; methods other than GET/POST (POST only for the query forms,
as Prometheus allows) are refused. With a web-config (``_webconfig``) every connection
is TLS and every path but the two health probes asks for basic auth.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from ..errors import BackendError, BackendTimeout, ConfigError, QueryError, StoreError
from ..tsdb import QueryResult, parse_api_time
from ._config import parse_duration
from ._exposition import CONTENT_TYPE, format_value
from ._webconfig import AUTH_EXEMPT, WebConfig

if TYPE_CHECKING:
    from ._agent import Agent

__all__ = ["result_json", "serve"]

log = logging.getLogger("aivitals.agent.http")
_POST_PATHS = ("/api/v1/query", "/api/v1/query_range", "/api/v1/series")
_MAX_FORM = 1 << 20  # a POSTed query form larger than 1 MiB is refused
_RULE_TYPES = {"alert": "alerting", "record": "recording"}


class _BadRequest(Exception):
    pass


def _point(ts: float, value: float) -> list[Any]:
    return [ts, format_value(value)]


def result_json(result: QueryResult) -> dict[str, Any]:
    """A ``QueryResult`` as the ``data`` of a Prometheus API answer."""
    if result.type == "vector":
        body: Any = [
            {"metric": dict(s.labels), "value": _point(s.timestamp, s.value)} for s in result.vector
        ]
    elif result.type == "matrix":
        body = [
            {"metric": dict(s.labels), "values": [_point(t, v) for t, v in s.points]}
            for s in result.matrix
        ]
    elif result.type == "scalar":
        body = _point(*result.scalar) if result.scalar else None
    else:
        body = list(result.string) if result.string else None
    return {"resultType": result.type, "result": body}


def _parse_time(key: str, text: str | None, default: float | None) -> float:
    if text is None or text == "":
        if default is None:
            raise _BadRequest(f"missing parameter {key!r}")
        return default
    try:
        return parse_api_time(key, text)
    except ConfigError as exc:
        raise _BadRequest(str(exc)) from None


def _alert_json(a: Any) -> Any:
    if isinstance(a, Mapping):
        return dict(a)
    active = getattr(a, "active_at", None)
    return {
        "labels": {"alertname": getattr(a, "alertname", ""), **dict(getattr(a, "labels", {}))},
        "annotations": dict(getattr(a, "annotations", {})),
        "state": getattr(a, "state", ""),
        "activeAt": None if active is None else datetime.fromtimestamp(active, UTC).isoformat(),
        "value": format_value(float(getattr(a, "value", math.nan))),
    }


def _provided(fn: Callable[[], Any] | None, what: str) -> Any:
    if fn is None:
        raise LookupError(f"no {what} provider is registered with this agent")
    data = fn()
    if hasattr(data, "to_json"):
        data = data.to_json()
    if isinstance(data, str | bytes):
        return json.loads(data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.asdict(data)
    return data


class _Handler(BaseHTTPRequestHandler):
    agent: Agent
    console_lock: threading.Lock
    console_sources: list[Any]
    web: WebConfig | None = None
    server_version = "aivitals-agent"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # --- plumbing ------------------------------------------------------------------
    def setup(self) -> None:
        ctx = None if self.web is None else self.web.context()
        if ctx is not None:
            # The handshake runs here, on this connection's thread, not in the accept
            # loop: a client that stalls it holds up only itself, and for 10 s at most.
            raw = self.request
            raw.settimeout(10.0)
            self.request = ctx.wrap_socket(raw, server_side=True)
            self.request.settimeout(None)
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if isinstance(self.request, ssl.SSLSocket):
                self.request.close()  # the wrapped socket owns the descriptor now

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _error(self, status: int, kind: str, message: str) -> None:
        self._json(status, {"status": "error", "errorType": kind, "error": message})

    def _params(self) -> dict[str, list[str]]:
        params = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        if self.command == "POST":
            declared = self.headers.get("Content-Length") or "0"
            if not declared.isdigit():
                raise _BadRequest(f"Content-Length {declared!r} is not a number")
            length = int(declared)
            if length > _MAX_FORM:
                raise _BadRequest(f"form body of {length} bytes is over the 1 MiB limit")
            form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
            for k, v in form.items():
                params.setdefault(k, []).extend(v)
        return params

    def parse_request(self) -> bool:
        ok = super().parse_request()
        listening = getattr(self.server, "socket", None)
        if ok and listening is not None and listening.fileno() < 0:
            # The agent stopped (its listening socket is closed) but this connection was
            # kept alive: answer 503 and close it, instead of serving on as if running.
            self.close_connection = True
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "unavailable", "the agent has stopped")
            return False
        if ok and self.web is not None and self.web.needs_auth:
            path = urlsplit(self.path).path
            if path not in AUTH_EXEMPT and not self.web.authorized(
                self.headers.get("Authorization")
            ):
                self.send_response(HTTPStatus.UNAUTHORIZED)
                self.send_header("WWW-Authenticate", 'Basic realm="aivitals"')
                # said, not only done: an unread POST body must not become the next
                # request, and a client told so does not reuse the connection
                self.send_header("Connection", "close")
                body = b"Unauthorized\n"
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return False
        return ok

    # --- verbs ---------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        if self._console(urlsplit(self.path).path):
            return
        if urlsplit(self.path).path not in (
            "/api/v1/query",
            "/api/v1/query_range",
            "/api/v1/series",
        ):
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "bad_data", "this API is read-only")
            return
        self._dispatch()

    def _refuse(self) -> None:
        if self._console(urlsplit(self.path).path):
            return  # the console answers its own paths (read-only: 405 with its reason)
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "bad_data", "this API is read-only")

    do_PUT = do_DELETE = do_PATCH = _refuse

    def _console(self, path: str) -> bool:
        """Serve the console's page, files and API when ``path`` is theirs; True if served."""
        if path != "/" and path != "/index.html" and not path.startswith("/console/"):
            return False
        from ..console import AgentSource, respond, write_response

        source = None
        if self.agent.has_store:
            with self.console_lock:  # one source per server: its caches are shared
                if not self.console_sources:
                    self.console_sources.append(AgentSource(self.agent))
                source = self.console_sources[0]
        parts = urlsplit(self.path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        r = respond(source, self.command, path, parts.query, headers)
        if r is None:
            return False
        write_response(self, r)
        return True

    def _dispatch(self) -> None:
        path = urlsplit(self.path).path
        if self._console(path):
            return
        try:
            route = self._route(path)
            if route is None:
                self._error(HTTPStatus.NOT_FOUND, "not_found", f"no such endpoint {path}")
                return
            route(self._params())
        except _BadRequest as exc:
            self._error(HTTPStatus.BAD_REQUEST, "bad_data", str(exc))
        except (QueryError, ConfigError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, "bad_data", str(exc))
        except BackendTimeout as exc:
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "timeout", str(exc))
        except LookupError as exc:
            self._error(HTTPStatus.NOT_FOUND, "not_found", str(exc))
        except (BackendError, StoreError) as exc:
            self._error(HTTPStatus.UNPROCESSABLE_ENTITY, "execution", str(exc))
        except Exception as exc:  # a bug in one request must not kill the server thread
            log.exception("agent HTTP request %s failed", self.path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal", repr(exc))

    def _route(self, path: str) -> Callable[[dict[str, list[str]]], None] | None:
        simple: dict[str, Callable[[dict[str, list[str]]], None]] = {
            "/metrics": self._metrics,
            "/-/ready": self._ready,
            "/-/healthy": self._healthy,
        }
        if path in simple:
            return simple[path]
        if not self.agent.has_store and path.startswith("/api/v1/"):
            return None  # exporter mode: no store, no query API
        api: dict[str, Callable[[dict[str, list[str]]], None]] = {
            "/api/v1/query": self._query,
            "/api/v1/query_range": self._query_range,
            "/api/v1/labels": self._labels,
            "/api/v1/series": self._series,
            "/api/v1/alerts": self._alerts,
            "/api/v1/rules": self._rules,
            "/api/v1/diagnosis": self._diagnosis,
        }
        if path in api:
            return api[path]
        if path.startswith("/api/v1/label/") and path.endswith("/values"):
            name = path[len("/api/v1/label/") : -len("/values")]
            return lambda params: self._label_values(name, params)
        return None

    # --- endpoints -----------------------------------------------------------------
    def _metrics(self, params: dict[str, list[str]]) -> None:
        self._send(HTTPStatus.OK, self.agent.metrics_text().encode(), CONTENT_TYPE)

    def _ready(self, params: dict[str, list[str]]) -> None:
        if self.agent.ready:
            self._send(HTTPStatus.OK, b"aivitals agent is ready.\n", "text/plain")
        else:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"not ready yet\n", "text/plain")

    def _healthy(self, params: dict[str, list[str]]) -> None:
        self._send(HTTPStatus.OK, b"aivitals agent is healthy.\n", "text/plain")

    @staticmethod
    def _one(params: dict[str, list[str]], key: str) -> str | None:
        values = params.get(key)
        return values[-1] if values else None

    def _query(self, params: dict[str, list[str]]) -> None:
        expr = self._one(params, "query")
        if not expr:
            raise _BadRequest("missing parameter 'query'")
        at = _parse_time("time", self._one(params, "time"), time.time())
        result = self.agent.store.query(expr, at)
        self._json(HTTPStatus.OK, {"status": "success", "data": result_json(result)})

    def _query_range(self, params: dict[str, list[str]]) -> None:
        expr = self._one(params, "query")
        if not expr:
            raise _BadRequest("missing parameter 'query'")
        start = _parse_time("start", self._one(params, "start"), None)
        end = _parse_time("end", self._one(params, "end"), None)
        step_text = self._one(params, "step")
        if not step_text:
            raise _BadRequest("missing parameter 'step'")
        try:
            step = parse_duration("step", step_text)
        except ConfigError as exc:
            raise _BadRequest(str(exc)) from None
        if end < start:
            raise _BadRequest("end is before start")
        if (end - start) / step > 11_000:  # Prometheus's own limit on points per series
            raise _BadRequest("exceeded maximum resolution of 11,000 points per timeseries")
        result = self.agent.store.query_range(expr, start, end, step)
        self._json(HTTPStatus.OK, {"status": "success", "data": result_json(result)})

    def _labels(self, params: dict[str, list[str]]) -> None:
        names: set[str] = set()
        for s in self.agent.store.query('{__name__=~".+"}').vector:
            names.update(s.labels)
        self._json(HTTPStatus.OK, {"status": "success", "data": sorted(names)})

    def _label_values(self, name: str, params: dict[str, list[str]]) -> None:
        values = self.agent.store.label_values(name)
        self._json(HTTPStatus.OK, {"status": "success", "data": sorted(values)})

    def _series(self, params: dict[str, list[str]]) -> None:
        matchers = params.get("match[]") or []
        if not matchers:
            raise _BadRequest("no match[] parameter provided")
        seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        for m in matchers:
            for s in self.agent.store.query(m).vector:
                seen.setdefault(tuple(sorted(s.labels.items())), dict(s.labels))
        self._json(HTTPStatus.OK, {"status": "success", "data": list(seen.values())})

    def _rules_off(self, data: dict[str, Any]) -> None:
        # Not a 404: an agent without rules is a valid state, and a client that lists
        # alerts should get none, with the reason, rather than an error.
        warning = self.agent.rules_off_reason
        self._json(HTTPStatus.OK, {"status": "success", "data": data, "warnings": [warning]})

    def _alerts(self, params: dict[str, list[str]]) -> None:
        if self.agent.alerts_provider is None:
            self._rules_off({"alerts": []})
            return
        data = _provided(self.agent.alerts_provider, "alerts")
        if not isinstance(data, Mapping):
            data = {"alerts": [_alert_json(a) for a in data]}
        self._json(HTTPStatus.OK, {"status": "success", "data": data})

    def _rules(self, params: dict[str, list[str]]) -> None:
        kind = self._one(params, "type")
        if kind not in (None, "", *_RULE_TYPES):
            raise _BadRequest(f"type={kind!r}: expected alert or record")
        if self.agent.rules_provider is None:
            self._rules_off({"groups": []})
            return
        data = _provided(self.agent.rules_provider, "rules")
        data = _filter_rules(
            data,
            kind=_RULE_TYPES.get(kind or ""),
            names=set(params.get("rule_name[]") or ()),
            groups=set(params.get("rule_group[]") or ()),
            exclude_alerts=(self._one(params, "exclude_alerts") or "").lower() == "true",
        )
        self._json(HTTPStatus.OK, {"status": "success", "data": data})

    def _diagnosis(self, params: dict[str, list[str]]) -> None:
        data = _provided(self.agent.diagnosis_provider, "diagnosis")
        self._json(HTTPStatus.OK, {"status": "success", "data": data})


def _filter_rules(
    data: Mapping[str, Any],
    *,
    kind: str | None,
    names: set[str],
    groups: set[str],
    exclude_alerts: bool,
) -> dict[str, Any]:
    """``/api/v1/rules`` filtered as Prometheus does: by ``type``, ``rule_name[]`` and
    ``rule_group[]``, alerts left out on ``exclude_alerts``; a group left with no rule by
    a filter is left out."""
    filtered = bool(kind or names or groups)
    out = []
    for g in data.get("groups", []):
        if groups and g.get("name") not in groups:
            continue
        rules = [
            {k: v for k, v in r.items() if not (exclude_alerts and k == "alerts")}
            for r in g.get("rules", [])
            if (kind is None or r.get("type") == kind) and (not names or r.get("name") in names)
        ]
        if rules or not filtered:
            out.append({**g, "rules": rules})
    return {"groups": out}


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, address: Any) -> None:
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, ssl.SSLError | ConnectionError | TimeoutError):
            # a client that speaks plain HTTP to the TLS port, or drops the handshake:
            # its problem, logged once, not a traceback on the agent's stderr
            log.info("TLS connection from %s failed: %s", address, exc)
            return
        super().handle_error(request, address)


def serve(agent: Agent, host: str, port: int) -> ThreadingHTTPServer:
    """Start the API for ``agent`` on a daemon thread; the caller shuts it down.
    ``agent.config.web_config`` (a loaded :class:`WebConfig`) turns on TLS and basic auth."""
    handler = type(
        "AgentHandler",
        (_Handler,),
        {
            "agent": agent,
            "console_lock": threading.Lock(),
            "console_sources": [],
            "web": getattr(agent.config, "web_config", None),
        },
    )
    server = _Server((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="aivitals-http", daemon=True).start()
    return server
