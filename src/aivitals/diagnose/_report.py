"""The daily health report (DOMAIN.md section 9), collected from a Backend, never typed by hand.

- peak queue length of the day, marked red above 50;
- the top three endpoints by 504 count;
- GPU utilization standard deviation per GPU in percent points, marked yellow
  above 30 (unbalanced batching);
- the day's alerts.

**Usage**::

    report = daily_report(backend, end=time.time())
    print(report.to_markdown())
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from ..errors import AivitalsError
from ..tsdb import Backend
from ._model import Unseen

__all__ = ["DailyReport", "daily_report"]

DAY = 86400.0


@dataclass(frozen=True, slots=True)
class DailyReport:
    start: float
    end: float
    peak_queue: float | None
    peak_queue_red: bool
    top_504: list[tuple[str, float]]
    gpu_util_stddev: dict[str, float]
    gpu_util_yellow: list[str]
    alerts: list[dict[str, Any]]
    unseen: list[Unseen] = field(default_factory=list)
    queue_red_above: float = 50.0
    stddev_yellow_above: float = 30.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)

    def to_markdown(self) -> str:
        day = datetime.fromtimestamp(self.start, UTC).strftime("%Y-%m-%d %H:%M")
        lines = [f"# Daily health report, 24 h from {day} UTC", ""]
        pq = "not seen" if self.peak_queue is None else f"{self.peak_queue:g}"
        flag = " **RED**" if self.peak_queue_red else ""
        lines += [f"- Peak queue length: {pq}{flag} (red above {self.queue_red_above:g})"]
        lines += ["- Top endpoints by 504 count:"]
        lines += [f"  - {route}: {count:g}" for route, count in self.top_504] or ["  - none"]
        lines += [
            "- GPU utilization standard deviation (percent points, yellow above "
            f"{self.stddev_yellow_above:g}):"
        ]
        for gpu, sd in self.gpu_util_stddev.items():
            mark = " **YELLOW**" if gpu in self.gpu_util_yellow else ""
            lines.append(f"  - GPU {gpu}: {sd:.1f}{mark}")
        if not self.gpu_util_stddev:
            lines.append("  - not seen")
        lines += ["- Alerts of the day:"]
        lines += [
            f"  - {a.get('alertname')} {a.get('labels', {})} since {a.get('since')}"
            for a in self.alerts
        ] or ["  - none"]
        if self.unseen:
            lines += ["", "Could not see:"] + [f"- {u.what}: {u.why}" for u in self.unseen]
        return "\n".join(lines) + "\n"

    def to_html(self) -> str:
        body = html.escape(self.to_markdown())
        body = body.replace("**RED**", "<b style='color:#c00'>RED</b>")
        body = body.replace("**YELLOW**", "<b style='color:#b8860b'>YELLOW</b>")
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>aivitals daily "
            f"report</title></head><body><pre>{body}</pre></body></html>"
        )


def daily_report(
    backend: Backend,
    *,
    end: float,
    alerts: list[dict[str, Any]] | None = None,
    queue_red_above: float = 50.0,
    stddev_yellow_above: float = 30.0,
    step: float = 60.0,
) -> DailyReport:
    start = end - DAY
    unseen: list[Unseen] = []

    def rng(expr: str) -> list[tuple[dict[str, str], np.ndarray]]:
        try:
            res = backend.query_range(expr, start, end, step)
        except AivitalsError as exc:
            unseen.append(Unseen(expr, f"query failed: {type(exc).__name__}: {exc}"))
            return []
        return [
            (dict(s.labels), np.array([v for _, v in s.points], dtype=float)) for s in res.matrix
        ]

    queue = rng("sum(queue_length)")
    peak = max((float(np.nanmax(v)) for _, v in queue if v.size), default=None)
    if peak is None:
        unseen.append(Unseen("queue_length", "no series in the day"))
    top = _top_504(backend, end, unseen)
    util = rng("gpu_utilization_ratio")
    stddev: dict[str, float] = {}
    for labels, v in util:
        ok = v[np.isfinite(v)]
        if ok.size > 1:
            stddev[labels.get("gpu", "?")] = float(np.std(ok * 100.0))
    if not util:
        unseen.append(Unseen("gpu_utilization_ratio", "no series in the day"))
    day_alerts = alerts if alerts is not None else _alerts_series(rng)
    return DailyReport(
        start=start,
        end=end,
        peak_queue=peak,
        peak_queue_red=peak is not None and peak > queue_red_above,
        top_504=top,
        gpu_util_stddev=stddev,
        gpu_util_yellow=[g for g, sd in stddev.items() if sd > stddev_yellow_above],
        alerts=day_alerts,
        unseen=unseen,
        queue_red_above=queue_red_above,
        stddev_yellow_above=stddev_yellow_above,
    )


def _top_504(backend: Backend, end: float, unseen: list[Unseen]) -> list[tuple[str, float]]:
    expr = 'sum by (route) (increase(http_request_duration_seconds_count{status="504"}[1d]))'
    try:
        res = backend.query(expr, end)
    except AivitalsError as exc:
        unseen.append(Unseen(expr, f"query failed: {type(exc).__name__}: {exc}"))
        return []
    rows = [
        (s.labels.get("route", "?"), s.value)
        for s in res.vector
        if math.isfinite(s.value) and s.value > 0
    ]
    return sorted(rows, key=lambda r: -r[1])[:3]


def _alerts_series(rng: Any) -> list[dict[str, Any]]:
    """Firing alerts from Prometheus's ``ALERTS`` series (when the backend has them)."""
    out = []
    for labels, v in rng('ALERTS{alertstate="firing"}'):
        name = labels.pop("alertname", "?")
        labels.pop("alertstate", None)
        out.append(
            {
                "alertname": name,
                "labels": labels,
                "since": "firing during the day",
                "samples": int(np.isfinite(v).sum()),
            }
        )
    return out
