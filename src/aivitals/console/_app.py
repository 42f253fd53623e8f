"""Routing of the console's URLs, shared by the agent's server and ``aivitals console``.

``/`` is the page, ``/console/<file>`` the static files, ``/console/api/<name>``
the JSON API. Every answer is built here as a ``Response``; the two servers
only write it out. Nothing here changes state.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from ..errors import AivitalsError, BackendError, BackendTimeout, ConfigError, QueryError
from ..tsdb import parse_api_time
from ._api import MAX_POINTS, instant_payload, meta_payload, range_payload, report_payload
from ._source import Source, chart_diagnosis
from ._static import load_static, resolve_static

__all__ = ["PREFIX", "Response", "respond"]

log = logging.getLogger("aivitals.console")

PREFIX = "/console/"
API = "/console/api/"
#: Scripts and styles from this origin only; data is never markup (the pages use
#: textContent), and this stops an injected script even if a page slipped.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
_SECURITY = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


def _finite(obj: Any) -> Any:
    """``obj`` with NaN and infinities as None: JSON has no NaN, and browsers refuse it."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _json(status: int, payload: Any, *, clean: bool = True) -> Response:
    data = _finite(payload) if clean else payload
    body = json.dumps(data, separators=(",", ":"), default=str, allow_nan=False)
    return Response(
        status,
        body.encode(),
        "application/json",
        {"Cache-Control": "no-store", **_SECURITY},
    )


def _error(status: int, kind: str, message: str) -> Response:
    return _json(status, {"status": "error", "errorType": kind, "error": message})


def _time(query: Mapping[str, list[str]], key: str, default: float | None) -> float | None:
    values = query.get(key)
    text = values[-1] if values else ""
    return default if text == "" else parse_api_time(key, text)


def _static(rel: str, headers: Mapping[str, str]) -> Response:
    path = resolve_static(rel)
    if path is None:
        return Response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
    item = load_static(path)
    base = {"ETag": item.etag, "Cache-Control": "no-cache", **_SECURITY}
    if headers.get("if-none-match") == item.etag:
        return Response(HTTPStatus.NOT_MODIFIED, b"", item.content_type, base)
    if item.gzipped is not None and "gzip" in headers.get("accept-encoding", ""):
        extra = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
        return Response(HTTPStatus.OK, item.gzipped, item.content_type, {**base, **extra})
    vary = {"Vary": "Accept-Encoding"} if item.gzipped is not None else {}
    return Response(HTTPStatus.OK, item.body, item.content_type, {**base, **vary})


def _api(source: Source, name: str, query: Mapping[str, list[str]]) -> Response:
    now = time.time()
    if name == "meta":
        return _json(HTTPStatus.OK, {"status": "success", "data": meta_payload(source)})
    if name == "range":
        end = _time(query, "end", now)
        start = _time(query, "start", None)
        assert end is not None
        if start is None:
            raise ConfigError("missing parameter 'start'")
        step_text = (query.get("step") or [""])[-1]
        try:
            step = float(step_text) if step_text else source.tick
        except ValueError:
            raise ConfigError(f"step: {step_text!r} is not a number of seconds") from None
        points_text = (query.get("points") or [""])[-1]
        if points_text and not points_text.isdigit():
            raise ConfigError(f"points: {points_text!r} is not a whole number")
        points = int(points_text) if points_text else MAX_POINTS
        data = range_payload(source, query.get("q") or [], start, end, step, max_points=points)
        # range values are rounded (finite or None) already; skip the second walk
        return _json(HTTPStatus.OK, {"status": "success", "data": data}, clean=False)
    if name == "instant":
        at = _time(query, "time", now)
        assert at is not None
        data = instant_payload(source, query.get("q") or [], at)
        return _json(HTTPStatus.OK, {"status": "success", "data": data})
    if name == "alerts":
        return _json(HTTPStatus.OK, {"status": "success", "data": source.alerts()})
    if name == "diagnosis":
        start, end = _time(query, "start", None), _time(query, "end", None)
        if (start is None) != (end is None):
            raise ConfigError("give both start and end for a window, or neither for the latest")
        data = chart_diagnosis(dict(source.diagnosis(start, end)))
        return _json(HTTPStatus.OK, {"status": "success", "data": data})
    if name == "report":
        end = _time(query, "end", now)
        assert end is not None
        return _json(HTTPStatus.OK, {"status": "success", "data": report_payload(source, end)})
    return _error(HTTPStatus.NOT_FOUND, "not_found", f"no console endpoint {name!r}")


def respond(
    source: Source | None,
    method: str,
    path: str,
    query_string: str,
    headers: Mapping[str, str],
) -> Response | None:
    """The console's answer to ``method path?query``, or None when the path is not its own.

    ``headers`` are the request's, with lower-case names.
    """
    if path != "/" and path != "/index.html" and not path.startswith(PREFIX):
        return None
    if method not in ("GET", "HEAD"):
        return _error(HTTPStatus.METHOD_NOT_ALLOWED, "bad_data", "the console is read-only")
    if path in ("/", "/index.html"):
        return _static("index.html", headers)
    if not path.startswith(API):
        return _static(path[len(PREFIX) :], headers)
    if source is None:
        return _error(HTTPStatus.NOT_FOUND, "not_found", "this server keeps no data (exporter)")
    query = parse_qs(query_string, keep_blank_values=True)
    try:
        return _api(source, path[len(API) :], query)
    except (ConfigError, QueryError) as exc:
        return _error(HTTPStatus.BAD_REQUEST, "bad_data", str(exc))
    except BackendTimeout as exc:
        return _error(HTTPStatus.SERVICE_UNAVAILABLE, "timeout", str(exc))
    except LookupError as exc:
        return _error(HTTPStatus.NOT_FOUND, "not_found", str(exc))
    except (BackendError, AivitalsError) as exc:
        return _error(HTTPStatus.BAD_GATEWAY, "execution", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # one bad request must not take the server thread down
        log.exception("console request %s failed", path)
        return _error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal", repr(exc))
