"""The live terminal view of ``aivitals demo``: golden signals, queue, GPU, cache, alerts.

Every number comes from the agent's store (what the service and the
collectors reported) except the client row, which is the load generator's
own count of what it sent and got back: a client that sends nothing, or a
service that answers nothing, shows there. The GPU row is labelled with the
``backend`` label of the data (``nvml`` on a GPU machine, ``sim`` for the
simulated device).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ._cache import KINDS

__all__ = ["ClientCounts", "History", "Snapshot", "read_snapshot", "render", "sparkline"]

_W = "8s"  # rate window: 8 scrapes of 1 s
_BARS = "▁▂▃▄▅▆▇█"


@dataclass
class ClientCounts:
    """One load stream's own counters (``aivitals.load.LoadCounters``) at one instant."""

    name: str
    sent: int = 0
    answered: int = 0
    errors: int = 0
    timeouts: int = 0

    @property
    def in_flight(self) -> int:
        return max(0, self.sent - self.answered - self.errors - self.timeouts)


@dataclass
class Snapshot:
    """The numbers on screen at one instant; NaN where the signal is absent."""

    at: float
    rps: float = math.nan
    p50: float = math.nan
    p95: float = math.nan
    p99: float = math.nan
    ttft_p50: float = math.nan
    tpot_p50: float = math.nan
    tokens_per_s: float = math.nan
    error_ratio: float = math.nan
    refused_ratio: float = math.nan
    queue: float = math.nan
    queue_wait_p99: float = math.nan
    workers_busy: float = math.nan
    workers_max: float = math.nan
    gpu_backend: str = "-"
    gpu_util: float = math.nan
    gpu_used: float = math.nan
    gpu_total: float = math.nan
    cache_hit_ratio: float = math.nan
    #: per kind of answer (the ``cache`` label): completions and embeddings hit very differently
    cache_hits_by_kind: dict[str, float] = field(default_factory=dict)
    alerts: list[tuple[str, str, str]] = field(default_factory=list)
    clients: list[ClientCounts] = field(default_factory=list)


def _q(stack: Any, expr: str) -> float:
    try:
        values = [s.value for s in stack.query(expr)]
    except Exception:  # a query the store cannot answer shows as "-", not a crash
        return math.nan
    return float(sum(values)) if values else math.nan


def _backend(stack: Any) -> str:
    """The ``backend`` label of the GPU series (several: joined), "-" when there is none."""
    try:
        found = {str(s.labels.get("backend", "?")) for s in stack.query("gpu_utilization_ratio")}
    except Exception:
        return "-"
    return "+".join(sorted(found)) if found else "-"


def _quantile(q: float, metric: str, selector: str = "") -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{selector}[{_W}])))"


def read_snapshot(stack: Any, clients: Iterable[ClientCounts] = ()) -> Snapshot:
    route = '{route=~"/v1/.*"}'
    rate = f"sum(rate(http_request_duration_seconds_count{route}[{_W}]))"
    snap = Snapshot(at=time.time(), clients=list(clients))
    snap.rps = _q(stack, rate)
    snap.p50 = _q(stack, _quantile(0.5, "http_request_duration_seconds", route))
    snap.p95 = _q(stack, _quantile(0.95, "http_request_duration_seconds", route))
    snap.p99 = _q(stack, _quantile(0.99, "http_request_duration_seconds", route))
    snap.ttft_p50 = _q(stack, _quantile(0.5, "model_time_to_first_token_seconds"))
    snap.tpot_p50 = _q(stack, _quantile(0.5, "model_time_per_output_token_seconds"))
    snap.tokens_per_s = _q(stack, f"sum(rate(model_output_tokens_sum[{_W}]))")
    count = 'http_request_duration_seconds_count{route=~"/v1/.*",'
    errors = f'sum(rate({count}status_class="5xx"}}[{_W}]))'
    refused = f'sum(rate({count}status="429"}}[{_W}]))'
    snap.error_ratio = _q(stack, f"({errors} or vector(0)) / {rate}")
    snap.refused_ratio = _q(stack, f"({refused} or vector(0)) / {rate}")
    snap.queue = _q(stack, 'queue_length{queue="pool:model"}')
    snap.queue_wait_p99 = _q(stack, _quantile(0.99, "queue_wait_seconds", '{queue="pool:model"}'))
    snap.workers_busy = _q(stack, 'worker_pool_active_workers{pool="model"}')
    snap.workers_max = _q(stack, 'worker_pool_max_workers{pool="model"}')
    snap.gpu_backend = _backend(stack)
    snap.gpu_util = _q(stack, "max(gpu_utilization_ratio)")
    snap.gpu_used = _q(stack, "gpu_memory_used_bytes")
    snap.gpu_total = _q(stack, "gpu_memory_total_bytes")
    hits = f'sum(rate(cache_requests_total{{result="hit"}}[{_W}]))'
    snap.cache_hit_ratio = _q(stack, f"{hits} / sum(rate(cache_requests_total[{_W}]))")
    for kind in KINDS:
        sel = f'cache_requests_total{{cache="{kind}"'
        snap.cache_hits_by_kind[kind] = _q(
            stack, f'sum(rate({sel},result="hit"}}[{_W}])) / sum(rate({sel}}}[{_W}]))'
        )
    if stack.engine is not None:
        snap.alerts = [
            (a.alertname, a.state, str(a.labels.get("severity", "")))
            for a in sorted(stack.engine.active(), key=lambda a: a.alertname)
        ]
    return snap


class History:
    """The last ``seconds`` of a few snapshot fields, for the sparklines."""

    FIELDS = ("rps", "p99", "queue", "gpu_util", "cache_hit_ratio")

    def __init__(self, seconds: float = 180.0) -> None:
        self.seconds = seconds
        self._points: deque[Snapshot] = deque()

    def add(self, snap: Snapshot) -> None:
        self._points.append(snap)
        while self._points and snap.at - self._points[0].at > self.seconds:
            self._points.popleft()

    def values(self, name: str) -> list[float]:
        return [float(getattr(p, name)) for p in self._points]


def sparkline(values: list[float], width: int = 30) -> str:
    """``values`` averaged into ``width`` buckets and drawn with block characters."""
    if not values:
        return ""
    buckets: list[float] = []
    n = len(values)
    for i in range(min(width, n)):
        part = [v for v in values[i * n // min(width, n) : (i + 1) * n // min(width, n)] if v == v]
        buckets.append(sum(part) / len(part) if part else math.nan)
    seen = [b for b in buckets if b == b]
    if not seen:
        return " " * len(buckets)
    lo, hi = min(seen), max(seen)
    span = hi - lo
    out = []
    for b in buckets:
        if b != b:
            out.append(" ")
        elif span <= 0:
            out.append(_BARS[0] if hi == 0 else _BARS[3])
        else:
            out.append(_BARS[min(len(_BARS) - 1, int((b - lo) / span * len(_BARS)))])
    return "".join(out)


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


def _label(text: str) -> Text:
    return Text(text, style="bold")


def render(
    snap: Snapshot, *, title: str, status: str, history: History | None = None, header: str = ""
) -> Panel:
    golden = Table.grid(padding=(0, 3))
    for _ in range(4):
        golden.add_column()
    golden.add_row(
        _label("requests"),
        _fmt(snap.rps, "rps"),
        _label("P50 / P95 / P99"),
        f"{_fmt(snap.p50, 'ms')} / {_fmt(snap.p95, 'ms')} / {_fmt(snap.p99, 'ms')}",
    )
    golden.add_row(
        _label("TTFT P50 (model)"),
        _fmt(snap.ttft_p50, "ms"),
        _label("per output token P50"),
        _fmt(snap.tpot_p50, "ms"),
    )
    golden.add_row(
        _label("tokens out"),
        _fmt(snap.tokens_per_s, "rps"),
        _label("errors (5xx) / refused (429)"),
        f"{_fmt(snap.error_ratio, 'pct')} / {_fmt(snap.refused_ratio, 'pct')}",
    )
    golden.add_row(
        _label("queue / wait P99"),
        f"{_fmt(snap.queue, 'n')} / {_fmt(snap.queue_wait_p99, 'ms')}",
        _label("workers busy"),
        f"{_fmt(snap.workers_busy, 'n')} of {_fmt(snap.workers_max, 'n')}",
    )
    golden.add_row(
        _label(f"GPU util ({snap.gpu_backend})"),
        _fmt(snap.gpu_util, "pct"),
        _label(f"GPU memory ({snap.gpu_backend})"),
        f"{_fmt(snap.gpu_used, 'gib')} of {_fmt(snap.gpu_total, 'gib')}",
    )
    golden.add_row(_label("cache hits"), _fmt(snap.cache_hit_ratio, "pct"), "", "")
    by_kind = list(snap.cache_hits_by_kind.items())
    for i in range(0, len(by_kind), 2):
        row = [
            x
            for kind, ratio in by_kind[i : i + 2]
            for x in (_label(f"  {kind}"), _fmt(ratio, "pct"))
        ]
        golden.add_row(*row, *([""] * (4 - len(row))))
    clients = Table(show_header=True, header_style="bold", box=None, expand=False)
    for col in ("load generator", "sent", "answered", "errors", "timeouts", "in flight"):
        clients.add_column(col, justify="left" if col == "load generator" else "right")
    for c in snap.clients:
        style = "red" if c.errors or c.timeouts else ""
        clients.add_row(
            c.name,
            f"{c.sent:,}",
            f"{c.answered:,}",
            Text(f"{c.errors:,}", style=style),
            Text(f"{c.timeouts:,}", style=style),
            f"{c.in_flight:,}",
        )
    parts: list[Any] = []
    if header:
        parts += [Text(header, style="dim"), Text("")]
    parts += [golden, Text("")]
    if snap.clients:
        parts += [clients, Text("")]
    if history is not None:
        spark = Table.grid(padding=(0, 2))
        spark.add_column()
        spark.add_column()
        minutes = history.seconds / 60
        for name, label in (
            ("rps", "requests/s"),
            ("p99", "P99"),
            ("queue", "queue"),
            ("gpu_util", f"GPU util ({snap.gpu_backend})"),
            ("cache_hit_ratio", "cache hits"),
        ):
            spark.add_row(Text(label, style="bold"), Text(sparkline(history.values(name))))
        parts += [Text(f"last {minutes:g} minutes", style="dim"), spark, Text("")]
    alerts = Table(show_header=True, header_style="bold", expand=False, box=None)
    alerts.add_column("alert")
    alerts.add_column("state")
    alerts.add_column("severity")
    for name, state, severity in snap.alerts:
        style = "red" if state == "firing" else "yellow"
        alerts.add_row(Text(name, style=style), state, severity)
    if not snap.alerts:
        alerts.add_row(Text("none active", style="green"), "", "")
    parts += [alerts, Text(""), Text(status, style="dim")]
    return Panel(Group(*parts), title=title, border_style="cyan")
