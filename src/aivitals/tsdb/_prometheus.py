"""``PrometheusBackend``: the ``Backend`` protocol over the Prometheus HTTP API.

Works with Prometheus and anything that speaks its query API (VictoriaMetrics,
Thanos, Mimir), behind credentials, TLS and tenant headers as a
``RemoteConnection`` describes them. httpx errors are mapped here, at the
boundary: a timeout is ``BackendTimeout``; a 401 or 403 answer, or a TLS
handshake that fails, is ``BackendAuthError`` (never retried: every other query
would meet the same); a 400/422 answer (``bad_data``, ``execution``) is
``QueryError``; anything else ``BackendError``. ``queries`` and
``bytes_received`` count what was asked and fetched (the diagnosis reports
them), ``warnings`` in an answer (a partial result) come back in the
``QueryResult``.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np

from ..errors import BackendAuthError, BackendError, BackendTimeout, ConfigError, QueryError
from ._remote import POST_ABOVE, RemoteConnection, refused_message, tls_failure, tls_message
from ._types import InstantSample, QueryResult, RangeSeries

__all__ = ["PrometheusBackend"]


class PrometheusBackend:
    """Query a Prometheus-compatible server.

    ::

        prom = PrometheusBackend("http://127.0.0.1:9090")
        prom.query("up").vector

        conn = RemoteConnection(basic_auth_user="ops", basic_auth_password_file=Path("pw"),
                                ca_file=Path("ca.pem"))
        prom = PrometheusBackend("https://prom.internal:9090", connection=conn)

    The files ``connection`` names are read here: one that is missing or
    unreadable is a ``ConfigError`` naming it, before any query. ``transport``
    replaces the network (tests).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        connection: RemoteConnection | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"url must start with http:// or https://, got {url!r}")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.connection = connection or RemoteConnection()
        self._client = self.connection.client(timeout, transport=transport)
        self._lock = threading.Lock()
        #: Queries sent and answer bytes received since creation (thread-safe counters).
        self.queries = 0
        self.bytes_received = 0

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PrometheusBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        t = time.time() if at is None else at
        data, warnings = self._api("/api/v1/query", {"query": expr, "time": _fmt(t)}, expr)
        return _result(data, warnings)

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        params = {"query": expr, "start": _fmt(start), "end": _fmt(end), "step": _fmt(step)}
        return _result(*self._api("/api/v1/query_range", params, expr))

    def query_range_arrays(
        self, expr: str, start: float, end: float, step: float
    ) -> tuple[list[tuple[dict[str, str], np.ndarray, np.ndarray]], tuple[str, ...]]:
        """``query_range`` as ``(labels, times, values)`` numpy arrays per series, and the
        answer's warnings: no Python tuple per point (a fleet's answers hold millions)."""
        params = {"query": expr, "start": _fmt(start), "end": _fmt(end), "step": _fmt(step)}
        data, warnings = self._api("/api/v1/query_range", params, expr)
        if data.get("resultType") != "matrix":
            raise BackendError(f"expected a matrix, got {data.get('resultType')!r}")
        out = []
        try:
            for r in data.get("result") or []:
                pts = r["values"]
                times = np.fromiter((p[0] for p in pts), dtype=np.float64, count=len(pts))
                values = np.array([p[1] for p in pts], dtype=np.float64)
                out.append((dict(r["metric"]), times, values))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"malformed matrix result: {exc}") from exc
        return out, warnings

    def get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        """GET another path of the server's API (``/api/v1/alerts``, ``/api/v1/rules``,
        label values) with this backend's credentials, TLS and headers. A failure to
        connect, a failed TLS handshake and a 401/403 are raised as for a query; any
        other status is the caller's to read."""
        return self._send("GET", path, params)

    def _send(self, method: str, path: str, params: dict[str, str] | None) -> httpx.Response:
        url = self.url + path
        try:
            if method == "POST":
                resp = self._client.post(url, data=params)
            else:
                resp = self._client.get(url, params=params)
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"{self.url}: no answer within {self.timeout}s") from exc
        except httpx.HTTPError as exc:
            tls = tls_failure(exc)
            if tls is not None:
                raise BackendAuthError(tls_message(self.connection, self._peer, tls)) from exc
            raise BackendError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        with self._lock:
            self.bytes_received += len(resp.content)
        if resp.status_code in (401, 403):
            text = refused_message(self.connection, self.url, resp.status_code, resp.text)
            raise BackendAuthError(text)
        return resp

    @property
    def _peer(self) -> str:
        u = httpx.URL(self.url)
        return f"{u.host}:{u.port or (443 if u.scheme == 'https' else 80)}"

    def _method(self, params: dict[str, str]) -> str:
        method = self.connection.method
        if method == "auto":
            return "POST" if len(urlencode(params)) > POST_ABOVE else "GET"
        return method

    def _api(
        self, path: str, params: dict[str, str], expr: str
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        with self._lock:
            self.queries += 1
        resp = self._send(self._method(params), path, params)
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            hint = _plain_to_tls(resp)
            raise BackendError(
                f"{self.url}: HTTP {resp.status_code}, not a Prometheus answer{hint}"
            )
        if body.get("status") != "success":
            kind, msg = body.get("errorType", "?"), body.get("error", "")
            # Prometheus: 400 bad_data, 422 execution; VictoriaMetrics: 422 with its own kinds.
            if resp.status_code in (400, 422) and kind != "timeout":
                raise QueryError(str(msg), expr=expr)
            if kind == "timeout" or (resp.status_code == 503 and "timeout" in str(msg)):
                raise BackendTimeout(f"{self.url}: {msg}")
            raise BackendError(f"{self.url}: HTTP {resp.status_code} {kind}: {msg}")
        data = body.get("data")
        if not isinstance(data, dict):
            raise BackendError(f"{self.url}: answer without data")
        raw_warnings = body.get("warnings") or ()
        warnings = tuple(str(w) for w in raw_warnings) if isinstance(raw_warnings, list) else ()
        return data, warnings


def _plain_to_tls(resp: httpx.Response) -> str:
    # Go's TLS server answers a plain HTTP request with this 400
    if resp.status_code == 400 and "HTTPS server" in resp.text:
        return " (it serves https://: use an https:// URL)"
    return ""


def _fmt(t: float) -> str:
    return f"{t:.3f}"


def _result(data: dict[str, Any], warnings: tuple[str, ...] = ()) -> QueryResult:
    kind = data.get("resultType")
    res: Any = data.get("result")
    try:
        if kind == "vector":
            return QueryResult(
                "vector",
                vector=[
                    InstantSample(dict(r["metric"]), float(r["value"][1]), float(r["value"][0]))
                    for r in res
                ],
                warnings=warnings,
            )
        if kind == "matrix":
            return QueryResult(
                "matrix",
                matrix=[
                    RangeSeries(dict(r["metric"]), [(float(t), float(v)) for t, v in r["values"]])
                    for r in res
                ],
                warnings=warnings,
            )
        if kind == "scalar":
            return QueryResult("scalar", scalar=(float(res[0]), float(res[1])), warnings=warnings)
        if kind == "string":
            return QueryResult("string", string=(float(res[0]), str(res[1])), warnings=warnings)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BackendError(f"malformed {kind} result: {exc}") from exc
    raise BackendError(f"unknown result type {kind!r}")
