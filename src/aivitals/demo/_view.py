"""The live terminal view of ``aivitals demo``: golden signals, queue, GPU (sim), alerts."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = ["Snapshot", "read_snapshot", "render"]

_W = "8s"  # rate window: 8 scrapes of 1 s


@dataclass
class Snapshot:
    """The numbers on screen at one instant; NaN where the signal is absent."""

    at: float
    rps: float = math.nan
    p50: float = math.nan
    p99: float = math.nan
    error_ratio: float = math.nan
    refused_ratio: float = math.nan
    queue: float = math.nan
    workers_busy: float = math.nan
    workers_max: float = math.nan
    gpu_util: float = math.nan
    gpu_used: float = math.nan
    gpu_total: float = math.nan
    cache_hit_ratio: float = math.nan
    alerts: list[tuple[str, str, str]] = field(default_factory=list)


def _q(stack: Any, expr: str) -> float:
    try:
        values = [s.value for s in stack.query(expr)]
    except Exception:  # a query the store cannot answer shows as "-", not a crash
        return math.nan
    return float(sum(values)) if values else math.nan


def read_snapshot(stack: Any) -> Snapshot:
    route = 'route=~"/v1/.*"'
    rate = f"sum(rate(http_request_duration_seconds_count{{{route}}}[{_W}]))"
    hist = f"sum by (le) (rate(http_request_duration_seconds_bucket{{{route}}}[{_W}]))"
    snap = Snapshot(at=time.time())
    snap.rps = _q(stack, rate)
    snap.p50 = _q(stack, f"histogram_quantile(0.5, {hist})")
    snap.p99 = _q(stack, f"histogram_quantile(0.99, {hist})")
    errors = f'sum(rate(http_request_duration_seconds_count{{{route},status_class="5xx"}}[{_W}]))'
    refused = f'sum(rate(http_request_duration_seconds_count{{{route},status="429"}}[{_W}]))'
    snap.error_ratio = _q(stack, f"{errors} / {rate}")
    snap.refused_ratio = _q(stack, f"{refused} / {rate}")
    snap.queue = _q(stack, 'queue_length{queue="pool:model"}')
    snap.workers_busy = _q(stack, "worker_pool_active_workers")
    snap.workers_max = _q(stack, "worker_pool_max_workers")
    snap.gpu_util = _q(stack, 'gpu_utilization_ratio{backend="sim"}')
    snap.gpu_used = _q(stack, 'gpu_memory_used_bytes{backend="sim"}')
    snap.gpu_total = _q(stack, 'gpu_memory_total_bytes{backend="sim"}')
    hits = f'sum(rate(cache_requests_total{{result="hit"}}[{_W}]))'
    snap.cache_hit_ratio = _q(stack, f"{hits} / sum(rate(cache_requests_total[{_W}]))")
    if stack.engine is not None:
        snap.alerts = [
            (a.alertname, a.state, str(a.labels.get("severity", "")))
            for a in sorted(stack.engine.active(), key=lambda a: a.alertname)
        ]
    return snap


def _fmt(value: float, kind: str) -> str:
    if value != value:
        return "-"
    if kind == "ms":
        return f"{value * 1000:,.0f} ms"
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "gib":
        return f"{value / 2**30:,.1f} GiB"
    if kind == "rps":
        return f"{value:,.1f}/s"
    return f"{value:,.0f}"


def render(snap: Snapshot, *, title: str, status: str) -> Panel:
    golden = Table.grid(padding=(0, 3))
    for _ in range(4):
        golden.add_column()
    golden.add_row(
        Text("requests", style="bold"),
        _fmt(snap.rps, "rps"),
        Text("P50 / P99", style="bold"),
        f"{_fmt(snap.p50, 'ms')} / {_fmt(snap.p99, 'ms')}",
    )
    golden.add_row(
        Text("errors (5xx)", style="bold"),
        _fmt(snap.error_ratio, "pct"),
        Text("refused (429)", style="bold"),
        _fmt(snap.refused_ratio, "pct"),
    )
    golden.add_row(
        Text("queue", style="bold"),
        _fmt(snap.queue, "n"),
        Text("workers busy", style="bold"),
        f"{_fmt(snap.workers_busy, 'n')} of {_fmt(snap.workers_max, 'n')}",
    )
    golden.add_row(
        Text("GPU util (sim)", style="bold"),
        _fmt(snap.gpu_util, "pct"),
        Text("GPU memory (sim)", style="bold"),
        f"{_fmt(snap.gpu_used, 'gib')} of {_fmt(snap.gpu_total, 'gib')}",
    )
    golden.add_row(Text("cache hits", style="bold"), _fmt(snap.cache_hit_ratio, "pct"), "", "")
    alerts = Table(show_header=True, header_style="bold", expand=False, box=None)
    alerts.add_column("alert")
    alerts.add_column("state")
    alerts.add_column("severity")
    for name, state, severity in snap.alerts:
        style = "red" if state == "firing" else "yellow"
        alerts.add_row(Text(name, style=style), state, severity)
    if not snap.alerts:
        alerts.add_row(Text("none active", style="green"), "", "")
    body = Group(golden, Text(""), alerts, Text(""), Text(status, style="dim"))
    return Panel(body, title=title, border_style="cyan")
