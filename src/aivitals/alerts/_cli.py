"""CLI: ``aivitals rules export|check|test`` and ``aivitals alerts``."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import click

from ..errors import BackendAuthError, BackendError
from ..tsdb import PrometheusBackend, RemoteConnection, remote_options
from ._export import ExportTargets, export_pack
from ._params import parse_param_pairs
from ._promtest import run_promtool_tests
from ._recording import NATIVE_RULE_FILE, native_rule_group
from ._rules import default_pack, load_rules

__all__ = ["alerts", "rules"]


@click.group("rules")
def rules() -> None:
    """Export, check and test the alert rule pack."""


@rules.command("export")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--sla-seconds", type=float, help="Model inference SLA (P99); alert at 2x.")
@click.option("--queue-limit", type=float, help="queue_length above this for 1m is P0.")
@click.option("--baseline-window", help="Baseline window of the composite rule (e.g. 15m).")
@click.option("--scrape-interval", help="Scrape interval written into prometheus.yml.")
@click.option("--evaluation-interval", help="Rule evaluation interval.")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="Any pack parameter.")
@click.option("--service-target", "service_targets", multiple=True, metavar="HOST:PORT")
@click.option("--agent-target", "agent_targets", multiple=True, metavar="HOST:PORT")
@click.option("--alertmanager", default="127.0.0.1:9093", show_default=True, metavar="HOST:PORT")
@click.option("--webhook-url", default="http://127.0.0.1:5001/alerts", show_default=True)
def export(
    out: Path,
    sla_seconds: float | None,
    queue_limit: float | None,
    baseline_window: str | None,
    scrape_interval: str | None,
    evaluation_interval: str | None,
    params: tuple[str, ...],
    service_targets: tuple[str, ...],
    agent_targets: tuple[str, ...],
    alertmanager: str,
    webhook_url: str,
) -> None:
    """Write the rendered rule pack, the native-name recording rules (vLLM, SGLang, DCGM,
    node_exporter series under aivitals' names), a prometheus.yml and an alertmanager.yml
    into OUT."""
    chosen = parse_param_pairs(params)
    named = {
        "sla_seconds": sla_seconds,
        "queue_limit": queue_limit,
        "baseline_window": baseline_window,
        "scrape_interval": scrape_interval,
        "evaluation_interval": evaluation_interval,
    }
    chosen.update({k: v for k, v in named.items() if v is not None})
    pack = default_pack(**chosen)
    targets = ExportTargets(
        service_targets=service_targets or ("127.0.0.1:8000",),
        agent_targets=agent_targets or ("127.0.0.1:9478",),
        alertmanager=alertmanager,
        webhook_url=webhook_url,
    )
    for path in export_pack(pack, out, targets):
        click.echo(f"wrote {path}")
    n_alerts = len(pack.alert_names)
    n_rules = sum(len(g.rules) for g in pack.groups)
    click.echo(f"{n_rules} rules ({n_alerts} alerts) in {len(pack.groups)} groups")
    n_native = len(native_rule_group(pack.params.evaluation_interval)["rules"])
    click.echo(f"{n_native} recording rules for engine-native names in {NATIVE_RULE_FILE}")


@rules.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
def check(files: tuple[Path, ...]) -> None:
    """Validate rule FILES: expressions, templates, durations (and promtool when installed)."""
    promtool = shutil.which("promtool")
    for path in files:
        groups = load_rules(path)
        n = sum(len(g.rules) for g in groups)
        click.echo(f"{path}: {len(groups)} groups, {n} rules OK")
    if promtool is None:
        click.echo("promtool not installed: checked by aivitals only")
        return
    proc = subprocess.run(
        [promtool, "check", "rules", *map(str, files)], capture_output=True, text=True, check=False
    )
    click.echo(proc.stdout.strip() or proc.stderr.strip())
    if proc.returncode != 0:
        raise click.exceptions.Exit(1)


@rules.command("test")
@click.option("--promtool", "promtool", default=None, help="Path of promtool (default: on PATH).")
def test(promtool: str | None) -> None:
    """Run the shipped promtool unit tests against the pack with its default parameters."""
    result = run_promtool_tests(default_pack().text, promtool=promtool)
    click.echo(result.output.rstrip())
    if not result.ok:
        raise click.exceptions.Exit(1)


def _fetch(base: str, path: str, connection: RemoteConnection) -> tuple[Any, list[str]]:
    """The ``data`` of a Prometheus API answer, and its ``warnings``."""
    with PrometheusBackend(base, connection=connection) as server:
        try:
            response = server.get(path)
        except BackendAuthError:
            raise
        except BackendError as exc:
            raise BackendError(f"cannot reach {base}{path}: {exc.__cause__ or exc}") from exc
    if response.status_code != 200:
        raise BackendError(f"{base}{path} answered HTTP {response.status_code}")
    body = response.json()
    if not isinstance(body, dict):
        return body, []
    return body.get("data", body), [str(w) for w in body.get("warnings") or []]


def _ago(ts: Any, now: float) -> str:
    if not isinstance(ts, int | float):
        return "-"
    seconds = max(0, int(now - ts))
    return f"{seconds // 60}m{seconds % 60:02d}s ago"


def _line(a: dict[str, Any], now: float) -> str:
    labels = a.get("labels") or {}
    name = a.get("alertname") or labels.get("alertname", "?")
    shown = ", ".join(
        f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity", "layer")
    )
    summary = (a.get("annotations") or {}).get("summary", "")
    state = a.get("state", "?")
    since = a.get("fired_at") or a.get("active_at") or a.get("resolved_at")
    return (
        f"{state:<8} {labels.get('severity', '-'):<3} {labels.get('layer', '-'):<14} {name:<24} "
        f"{_ago(since, now):>12}  {shown}  {summary}"
    )


def _from_prometheus(data: Any) -> dict[str, Any]:
    """Prometheus' /api/v1/alerts shape into ours (activeAt as RFC 3339 stays a string)."""
    out = []
    for a in data.get("alerts", []):
        out.append(
            {**a, "alertname": a.get("labels", {}).get("alertname"), "state": a.get("state")}
        )
    return {"alerts": out, "history": []}


def _seconds(value: Any) -> str:
    return f"{value:g}s" if isinstance(value, int | float) else "-"


def _rule_line(r: dict[str, Any]) -> str:
    alerting = r.get("type") == "alerting"
    state = r.get("state", "?") if alerting else "-"
    kind = "alert" if alerting else "record"
    extra = (
        f"for {_seconds(r.get('duration'))}, {len(r.get('alerts') or [])} active"
        if alerting
        else ""
    )
    error = r.get("lastError") or ""
    return f"{state:<8} {r.get('health', '?'):<7} {kind:<6} {r.get('name', '?'):<34} {extra}" + (
        f"  error: {error}" if error else ""
    )


def _print_rules(data: Any) -> None:
    groups = data.get("groups", []) if isinstance(data, dict) else []
    n = sum(len(g.get("rules", [])) for g in groups)
    click.echo(f"rules: {n} in {len(groups)} groups")
    for g in groups:
        click.echo(
            f"  {g.get('name', '?')}  every {_seconds(g.get('interval'))}  {g.get('file', '')}"
        )
        for r in g.get("rules", []):
            click.echo("    " + _rule_line(r))


@click.command("alerts")
@click.option("--agent", "agent", default="http://127.0.0.1:9478", show_default=True)
@click.option("--prometheus", "prometheus", default=None, help="Ask a Prometheus instead.")
@click.option(
    "--rules", "show_rules", is_flag=True, help="List the rules: state, health, last error."
)
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
@click.option("--recent", default=20, show_default=True, help="How many recent transitions.")
@remote_options
def alerts(
    agent: str,
    prometheus: str | None,
    show_rules: bool,
    as_json: bool,
    recent: int,
    connection: RemoteConnection,
) -> None:
    """List active alerts and recent transitions (or, with --rules, the rules) from an
    agent or a Prometheus."""
    path = "/api/v1/rules" if show_rules else "/api/v1/alerts"
    data, warnings = _fetch(prometheus or agent, path, connection)
    if prometheus and not show_rules:
        data = _from_prometheus(data)
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    for w in warnings:
        click.echo(f"note: {w}")
    if show_rules:
        _print_rules(data)
        return
    now = time.time()
    active = data.get("alerts", [])
    click.echo(f"active alerts: {len(active)}")
    for a in active:
        click.echo("  " + _line(a, now))
    history = data.get("history", [])[-recent:] if recent > 0 else []
    if history:
        click.echo(f"recent transitions: {len(history)}")
        for a in reversed(history):
            click.echo("  " + _line(a, now))
