"""``aivitals diagnose``, ``aivitals snapshot`` and ``aivitals report daily``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import httpx

from ..errors import AivitalsError, BackendError, ConfigError
from ..tsdb import (
    DEFAULT_AGENT,
    Backend,
    PrometheusBackend,
    RemoteConnection,
    Store,
    parse_duration,
    parse_time,
    remote_options,
)
from ._engine import diagnose as run_diagnosis
from ._memory import LOOKS, look_back
from ._model import Diagnosis, Event
from ._report import daily_report

__all__ = ["diagnose", "report", "snapshot"]

FORMATS = ("terminal", "markdown", "json", "html")


def _source(
    agent: str | None,
    prometheus: str | None,
    snapshot: str | None,
    victoriametrics: str | None = None,
    timeout: float = 10.0,
    connection: RemoteConnection | None = None,
) -> Backend:
    chosen = [x for x in (agent, prometheus, snapshot, victoriametrics) if x]
    if len(chosen) > 1:
        raise ConfigError("choose one of --agent, --prometheus, --victoriametrics, --snapshot")
    if snapshot:
        if not Path(snapshot).is_file():
            raise ConfigError(f"--snapshot: no such file: {snapshot!r}")
        return Store.load(snapshot)
    # VictoriaMetrics answers the Prometheus query API (MetricsQL is a superset of PromQL):
    # an expression it refuses is listed as unseen, like any failed query
    url = prometheus or victoriametrics or agent or DEFAULT_AGENT
    return PrometheusBackend(url, timeout=timeout, connection=connection)


def _agent_alerts(backend: Backend) -> list[Any]:
    """The agent's alert events as objects with the AlertEvent fields (best effort)."""
    if not isinstance(backend, PrometheusBackend):
        return []
    try:
        r = backend.get("/api/v1/alerts")
        r.raise_for_status()
        data = r.json()
    except (AivitalsError, httpx.HTTPError, ValueError):
        return []
    items = data.get("data", data) if isinstance(data, dict) else data
    if isinstance(items, dict):
        items = items.get("alerts", [])
    out = []
    for a in items if isinstance(items, list) else []:
        if isinstance(a, dict) and a.get("active_at") is not None:
            out.append(
                Event(
                    float(a.get("fired_at") or a["active_at"]),
                    "alert",
                    f"{a.get('alertname', '?')} {a.get('state', '')}",
                    {str(k): str(v) for k, v in (a.get("labels") or {}).items()},
                )
            )
    return out


def _emit(text: str, out: str | None) -> None:
    if out:
        Path(out).write_text(text)
        click.echo(f"written to {out}", err=True)
    else:
        click.echo(text)


@click.command("diagnose")
@click.option("--agent", metavar="URL", help=f"An aivitals agent [default {DEFAULT_AGENT}].")
@click.option("--prometheus", metavar="URL", help="A Prometheus server (or anything with its API).")
@click.option("--victoriametrics", metavar="URL", help="A VictoriaMetrics (single-node) server.")
@click.option("--snapshot", metavar="FILE", help="A snapshot file (aivitals snapshot).")
@click.option("--window", default="30m", show_default=True, help="How far back to look.")
@click.option(
    "--by",
    "location",
    default="node",
    show_default=True,
    help="The label that names where (a fleet's node); 'none' never splits.",
)
@click.option("--timeout", default="10s", show_default=True, help="Per query, remote backends.")
@click.option(
    "--budget",
    default="60s",
    show_default=True,
    help="Time for all queries; what is not asked by then is listed as unseen.",
)
@click.option(
    "--at",
    "at",
    default="now",
    show_default=True,
    help="End of the window: epoch seconds, now, now-5m.",
)
@click.option("--step", default=None, help="Resolution of the range queries (default window/600).")
@click.option(
    "--hold",
    default="2m",
    show_default=True,
    help="Hold the finding that led over this period before the window's end "
    "(looks 4 more times across it, as a live agent would have; 0 looks once).",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="terminal", show_default=True)
@click.option("--out", metavar="FILE", help="Write the report to FILE instead of stdout.")
@remote_options
def diagnose(
    agent: str | None,
    prometheus: str | None,
    victoriametrics: str | None,
    snapshot: str | None,
    window: str,
    location: str,
    timeout: str,
    budget: str,
    at: str,
    step: str | None,
    hold: str,
    fmt: str,
    out: str | None,
    connection: RemoteConnection,
) -> None:
    """Name the failing layer and root cause, with evidence, a timeline and next commands."""
    held = parse_duration("--hold", hold)
    if held < 0:
        raise ConfigError(f"--hold must be 0 or positive, got {hold!r}")
    win = parse_duration("--window", window)
    if win <= 0:
        raise ConfigError(f"--window must be positive, got {window!r}")
    end = parse_time("--at", at, time.time())
    per_query = parse_duration("--timeout", timeout)
    total = parse_duration("--budget", budget)
    if per_query <= 0 or total <= 0:
        raise ConfigError("--timeout and --budget must be positive")
    backend = _source(agent, prometheus, snapshot, victoriametrics, per_query, connection)
    if snapshot and at == "now":
        end = _snapshot_end(backend, end)
    remote = prometheus or victoriametrics or snapshot
    events = _agent_alerts(backend) if not remote else []
    looks = 1 + (LOOKS if held > 0 else 0)

    def at_time(t: float) -> Diagnosis:
        return run_diagnosis(
            backend,
            end=t,
            window=win,
            step=parse_duration("--step", step) if step else None,
            events=events,
            location=None if location.lower() == "none" else location,
            budget=total / looks,  # --budget bounds all the looks together
            dialect="metricsql" if victoriametrics else "promql",
        )

    d = look_back(at_time, end, held)
    text = {
        "terminal": d.to_terminal,
        "markdown": d.to_markdown,
        "json": d.to_json,
        "html": d.to_html,
    }[fmt]()
    _emit(text, out)


def _snapshot_end(backend: Backend, default: float) -> float:
    """A snapshot's "now" is its newest sample, not the wall clock."""
    stats = backend.stats() if isinstance(backend, Store) else {}
    newest = stats.get("newest_timestamp")
    return float(newest) if newest else default


@click.command("snapshot")
@click.option("--agent", metavar="URL", help="An aivitals agent.")
@click.option("--prometheus", metavar="URL", help="A Prometheus or VictoriaMetrics server.")
@click.option("--out", metavar="FILE", required=True, help="Snapshot file to write.")
@click.option("--window", default="30m", show_default=True, help="How far back to save.")
@click.option("--at", "at", default="now", show_default=True, help="End of the window.")
@click.option("--step", default="1s", show_default=True, help="Resolution of the saved samples.")
@remote_options
def snapshot(
    agent: str | None,
    prometheus: str | None,
    out: str,
    window: str,
    at: str,
    step: str,
    connection: RemoteConnection,
) -> None:
    """Save a window of every series to a file, for a later diagnosis or a bug report."""
    if bool(agent) == bool(prometheus):
        raise ConfigError("choose exactly one of --agent, --prometheus")
    url = str(agent or prometheus)
    win = parse_duration("--window", window)
    end = parse_time("--at", at, time.time())
    res = parse_duration("--step", step)
    store = pull(url, end - win, end, res, connection=connection)
    n = store.save(out, start=end - win, end=end)
    click.echo(f"saved {n} samples of {store.series_count} series to {out}", err=True)


def pull(
    url: str,
    start: float,
    end: float,
    step: float,
    *,
    connection: RemoteConnection | None = None,
) -> Store:
    """Every series of a Prometheus-API server (agent, Prometheus, VictoriaMetrics) into a Store."""
    backend = PrometheusBackend(url, connection=connection)
    names = _metric_names(backend)
    store = Store(retention=max(3600.0, end - start + 600.0))
    # Prometheus refuses more than 11,000 points per series: fetch in chunks.
    chunk = step * 10_000
    for name in names:
        t = start
        while t <= end:
            stop = min(end, t + chunk)
            result = backend.query_range(f'{{__name__="{name}"}}', t, stop, step)
            for series in result.matrix:
                labels = {k: v for k, v in series.labels.items() if k != "__name__"}
                for ts, value in series.points:
                    try:
                        store.append(name, labels, value, ts)
                    except Exception:
                        continue
            t = stop + step
    return store


def _metric_names(backend: PrometheusBackend) -> list[str]:
    try:
        r = backend.get("/api/v1/label/__name__/values")
        r.raise_for_status()
        data = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise BackendError(f"cannot list metric names at {backend.url}: {exc}") from exc
    return [str(n) for n in data.get("data", [])]


@click.group("report")
def report() -> None:
    """Reports built from the collected signals."""


@report.command("daily")
@click.option("--agent", metavar="URL", help=f"An aivitals agent [default {DEFAULT_AGENT}].")
@click.option("--prometheus", metavar="URL", help="A Prometheus or VictoriaMetrics server.")
@click.option("--snapshot", metavar="FILE", help="A snapshot file.")
@click.option("--at", "at", default="now", show_default=True, help="End of the 24 h.")
@click.option("--queue-red", default=50.0, show_default=True, help="Peak queue marked red above.")
@click.option(
    "--stddev-yellow",
    default=30.0,
    show_default=True,
    help="GPU utilization stddev (percent points) marked yellow above.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("markdown", "json", "html")),
    default="markdown",
    show_default=True,
)
@click.option("--out", metavar="FILE", help="Write the report to FILE.")
@remote_options
def daily(
    agent: str | None,
    prometheus: str | None,
    snapshot: str | None,
    at: str,
    queue_red: float,
    stddev_yellow: float,
    fmt: str,
    out: str | None,
    connection: RemoteConnection,
) -> None:
    """Peak queue length, top endpoints by 504s, GPU utilization stddev, the day's alerts."""
    backend = _source(agent, prometheus, snapshot, connection=connection)
    end = parse_time("--at", at, time.time())
    if snapshot and at == "now":
        end = _snapshot_end(backend, end)
    alerts = None
    if not (prometheus or snapshot):
        alerts = [
            {"alertname": e.text.split(" ")[0], "labels": dict(e.fields), "since": e.time}
            for e in _agent_alerts(backend)
            if e.time >= end - 86400
        ]
    r = daily_report(
        backend,
        end=end,
        alerts=alerts,
        queue_red_above=queue_red,
        stddev_yellow_above=stddev_yellow,
    )
    _emit({"markdown": r.to_markdown, "json": r.to_json, "html": r.to_html}[fmt](), out)
