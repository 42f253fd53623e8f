"""The console's read-only JSON API, the same over an in-process agent or a remote server.

``/console/api/range`` evaluates several PromQL expressions over one window
and answers them on one shared time grid (columns, ``null`` where a series
has no point), so the browser hands the arrays to the chart as they come.
The grid's step is chosen here: the asked step raised until a series has at
most ``MAX_POINTS`` points (or the fewer the page asks for), so a day at 1 s
never leaves the server as 86,400 points a series. A ``$W`` in an expression
becomes the rate window for that step: 4 scrape intervals or 2 steps,
whichever is longer (``rate()`` needs at least 4 samples).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from ..errors import AivitalsError, ConfigError
from ._source import Source

__all__ = [
    "MAX_POINTS",
    "MAX_QUERIES",
    "MAX_SERIES",
    "choose_step",
    "instant_payload",
    "meta_payload",
    "range_payload",
    "report_payload",
]

#: Points per series at most: a chart is rarely wider than this many pixels.
MAX_POINTS = 1500
#: Series per expression at most; the rest are counted, not sent.
MAX_SERIES = 60
#: Expressions per request at most (one panel's worth).
MAX_QUERIES = 12
#: The widest window the console asks for (8 days: a week plus margin).
MAX_RANGE = 8 * 86400.0
_NICE = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def choose_step(start: float, end: float, step: float, max_points: int = MAX_POINTS) -> float:
    """``step`` raised to a round value so ``[start, end]`` has at most ``max_points`` points.

    >>> choose_step(0, 3600, 1)          # an hour at 1 s: 5 s points
    5.0
    >>> choose_step(0, 86400, 1)         # a day at 1 s is cut to 1-minute points
    60.0
    >>> choose_step(0, 300, 5)
    5.0
    """
    if not (math.isfinite(start) and math.isfinite(end) and math.isfinite(step)):
        raise ConfigError("start, end and step must be finite numbers")
    if step <= 0:
        raise ConfigError(f"step must be > 0, got {step!r}")
    if end < start:
        raise ConfigError("end is before start")
    if end - start > MAX_RANGE:
        raise ConfigError(f"range of {end - start:.0f} s is over the {MAX_RANGE:.0f} s limit")
    need = (end - start) / max(1, max_points - 1)
    if step >= need:
        return float(step)
    for nice in _NICE:
        if nice >= need and nice >= step:
            return float(nice)
    return float(math.ceil(need))


def _round(v: float) -> float | None:
    if not math.isfinite(v):
        return None
    # 6 significant digits: what a chart or a tooltip shows, half the JSON of a repr
    return float(f"{v:.6g}")


def rate_window(tick: float, step: float) -> str:
    """The ``$W`` of a query at ``step``: a whole number of seconds.

    >>> rate_window(1.0, 5.0), rate_window(15.0, 5.0)
    ('10s', '60s')
    """
    return f"{math.ceil(max(4.0 * tick, 2.0 * step))}s"


def range_payload(
    source: Source,
    queries: Sequence[str],
    start: float,
    end: float,
    step: float,
    *,
    max_points: int = MAX_POINTS,
) -> dict[str, Any]:
    """Evaluate ``queries`` on ``[start, end]`` at a step of at least ``step``, on one grid."""
    if not queries:
        raise ConfigError("missing parameter 'q' (a PromQL expression)")
    if len(queries) > MAX_QUERIES:
        raise ConfigError(f"{len(queries)} expressions in one request; at most {MAX_QUERIES}")
    max_points = max(10, min(MAX_POINTS, max_points))
    step = choose_step(start, end, step, max_points)
    window = rate_window(source.tick, step)
    # Align the grid to the step so successive live updates land on the same instants.
    g0 = math.floor(start / step) * step
    # the last point at or just past ``end``: the newest data always has a point
    n = math.ceil((end - g0) / step - 1e-9) + 1
    grid = [g0 + i * step for i in range(n)]
    results: list[dict[str, Any]] = []
    for expr in queries:
        if not expr.strip():
            results.append({"query": expr, "error": "empty expression", "series": []})
            continue
        try:
            res = source.backend.query_range(expr.replace("$W", window), g0, grid[-1], step)
        except AivitalsError as exc:
            results.append({"query": expr, "error": f"{type(exc).__name__}: {exc}", "series": []})
            continue
        series = []
        for s in list(res.matrix)[:MAX_SERIES]:
            col: list[float | None] = [None] * n
            for t, v in s.points:
                i = round((t - g0) / step)
                if 0 <= i < n:
                    col[i] = _round(v)
            series.append({"metric": dict(s.labels), "values": col})
        item: dict[str, Any] = {"query": expr, "series": series}
        if len(res.matrix) > MAX_SERIES:
            item["truncated"] = len(res.matrix)
        results.append(item)
    return {
        "start": g0,
        "end": grid[-1],
        "step": step,
        "rate_window": window,
        "times": grid,
        "results": results,
    }


def instant_payload(source: Source, queries: Sequence[str], at: float) -> dict[str, Any]:
    """Instant values of ``queries`` at ``at`` (the fleet grid)."""
    if not queries:
        raise ConfigError("missing parameter 'q' (a PromQL expression)")
    if len(queries) > MAX_QUERIES:
        raise ConfigError(f"{len(queries)} expressions in one request; at most {MAX_QUERIES}")
    results: list[dict[str, Any]] = []
    for expr in queries:
        try:
            res = source.backend.query(expr, at)
        except AivitalsError as exc:
            results.append({"query": expr, "error": f"{type(exc).__name__}: {exc}", "series": []})
            continue
        rows = [{"metric": dict(s.labels), "value": _round(s.value)} for s in res.vector]
        results.append({"query": expr, "series": rows[: MAX_SERIES * 4]})
    return {"time": at, "results": results}


#: chart id -> the alert whose threshold is drawn on it
CHART_RULES: dict[str, tuple[str, ...]] = {
    "inference_p99": ("InferenceLatencyHigh",),
    "queue_length": ("QueueBacklog",),
    "queue_wait": ("QueueWaitHigh",),
    "http_504_429": ("HTTP504RateHigh", "HTTP429RateHigh"),
    "workers_busy": ("WorkerPoolSaturated",),
    "gpu_memory": ("GPUMemoryHigh",),
    "gpu_util": ("GPUUtilizationHigh", "GPUUtilizationLow"),
    "host_cpu": ("HostCPUSaturated",),
    "probe": ("ProbeLatencyHigh",),
}


def meta_payload(source: Source) -> dict[str, Any]:
    """What the pages need once: the backend, the tick, limits and the thresholds to draw."""
    rules = source.rules()
    thresholds: dict[str, list[dict[str, Any]]] = {}
    for chart, names in CHART_RULES.items():
        for name in names:
            r = rules.get(name)
            if r is not None and r.get("value") is not None:
                thresholds.setdefault(chart, []).append(
                    {"alert": name, "op": r["op"], "value": r["value"], "severity": r["severity"]}
                )
    try:  # which GPU backends report: "sim" is shown as such on every page
        found = source.backend.query("count by (backend) (gpu_info)", time.time()).vector
        gpu_backends = sorted({s.labels.get("backend", "?") for s in found})
    except AivitalsError:
        gpu_backends = []
    return {
        "backend": {"kind": source.kind, "url": source.url},
        "gpu_backends": gpu_backends,
        "tick": source.tick,
        "max_points": MAX_POINTS,
        "server_time": time.time(),
        "thresholds": thresholds,
    }


def report_payload(source: Source, end: float) -> dict[str, Any]:
    """``aivitals report daily`` over the source, as JSON for the report page."""
    from ..diagnose import DAY, daily_report

    alerts: list[dict[str, Any]] | None = None
    try:
        data = source.alerts()
        every = [*data["alerts"], *data["history"]]
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for a in every:
            at = a["fired_at"] or a["active_at"]
            if a["state"] != "firing" or at is None or at < end - DAY:
                continue
            key = (a["alertname"], repr(sorted(a["labels"].items())))
            seen.setdefault(key, {"alertname": a["alertname"], "labels": a["labels"], "since": at})
        alerts = list(seen.values())
    except (AivitalsError, LookupError):
        alerts = None  # the report falls back to the ALERTS series
    report = daily_report(source.backend, end=end, alerts=alerts)
    out = asdict(report)
    out["unseen"] = [{"what": u.what, "why": u.why} for u in report.unseen]
    return out


def parse_params(query: Mapping[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None
