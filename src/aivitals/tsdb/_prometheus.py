"""``PrometheusBackend``: the ``Backend`` protocol over the Prometheus HTTP API.

Works with Prometheus and anything that speaks its query API (VictoriaMetrics,
Thanos, Mimir). httpx errors are mapped here, at the boundary: a timeout is
``BackendTimeout``, a 400/422 answer (``bad_data``, ``execution``) is
``QueryError``, anything else ``BackendError``. ``queries`` and
``bytes_received`` count what was asked and fetched (the diagnosis reports
them), ``warnings`` in an answer (a partial result) come back in the
``QueryResult``.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import httpx
import numpy as np

from ..errors import BackendError, BackendTimeout, ConfigError, QueryError
from ._types import InstantSample, QueryResult, RangeSeries

__all__ = ["PrometheusBackend"]


class PrometheusBackend:
    """Query a Prometheus-compatible server.

    ::

        prom = PrometheusBackend("http://127.0.0.1:9090")
        prom.query("up").values()
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"url must start with http:// or https://, got {url!r}")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._client = httpx.Client(timeout=timeout)
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
        data, warnings = self._get("/api/v1/query", {"query": expr, "time": _fmt(t)}, expr)
        return _result(data, warnings)

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        params = {"query": expr, "start": _fmt(start), "end": _fmt(end), "step": _fmt(step)}
        return _result(*self._get("/api/v1/query_range", params, expr))

    def query_range_arrays(
        self, expr: str, start: float, end: float, step: float
    ) -> tuple[list[tuple[dict[str, str], np.ndarray, np.ndarray]], tuple[str, ...]]:
        """``query_range`` as ``(labels, times, values)`` numpy arrays per series, and the
        answer's warnings: no Python tuple per point (a fleet's answers hold millions)."""
        params = {"query": expr, "start": _fmt(start), "end": _fmt(end), "step": _fmt(step)}
        data, warnings = self._get("/api/v1/query_range", params, expr)
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

    def _get(
        self, path: str, params: dict[str, str], expr: str
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        with self._lock:
            self.queries += 1
        try:
            resp = self._client.get(self.url + path, params=params)
            with self._lock:
                self.bytes_received += len(resp.content)
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"{self.url}: no answer within {self.timeout}s") from exc
        except httpx.HTTPError as exc:
            raise BackendError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise BackendError(f"{self.url}: HTTP {resp.status_code}, not a Prometheus answer")
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
