"""``aivitals agent``: run the collectors, the store and the HTTP API until stopped.

``aivitals collectors`` lives here too: it lists and runs once the collector
set the agent would build from the same options (``build_collectors``), so it
belongs to the agent; ``collect`` never imports the agent.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

import click

from ..collect import BaseCollector, Collector
from ..errors import ConfigError
from ..signals import Sample
from ._agent import Agent
from ._build import build_collectors
from ._config import GPU_CHOICES, AgentConfig, ScrapeTarget, parse_duration
from ._exposition import render
from ._rules import (
    NotifyTarget,
    RulesCollector,
    SlaCollector,
    attach_rules,
    fit_retention,
    shipped_rules,
    user_rules,
)
from ._webconfig import load_web_config

if TYPE_CHECKING:
    from ..alerts import RuleGroup

__all__ = ["agent", "collectors"]


@click.command("agent")
@click.option("--listen", default="127.0.0.1:9478", show_default=True, help="host:port of the API.")
@click.option("--allow-remote", is_flag=True, help="Allow listening on a non-loopback address.")
@click.option(
    "--web-config",
    type=click.Path(dir_okay=False),
    envvar="AIVITALS_WEB_CONFIG",
    help="TLS and basic auth for every path, in Prometheus' web-config format "
    "(tls_server_config, basic_auth_users); read and checked at start.",
)
@click.option("--exporter", is_flag=True, help="Only collect and serve /metrics (no store).")
@click.option(
    "--scrape", "scrape", multiple=True, metavar="[JOB=]URL", help="A /metrics target (repeat)."
)
@click.option("--scrape-interval", default="15s", show_default=True, help="Period of scrapes.")
@click.option("--gpu", type=click.Choice(GPU_CHOICES), default="auto", show_default=True)
@click.option("--sim-gpu-dir", type=click.Path(file_okay=False), help="State dir of the sim GPU.")
@click.option("--pid", type=int, help="The served process, by pid.")
@click.option("--port", type=int, help="The served process, by the TCP port it listens on.")
@click.option(
    "--netns",
    multiple=True,
    metavar="NAME|GLOB|PATH",
    help="Also read the TCP counters and interfaces of this network namespace "
    "(an ip netns name, a glob over them, or /proc/PID/ns/net; root; repeat).",
)
@click.option("--interval", default="1s", show_default=True, help="Period of the collectors.")
@click.option("--retention", default="1h", show_default=True, help="How long the store keeps.")
@click.option("--no-kernel-log", is_flag=True, help="Do not read the kernel log.")
@click.option(
    "--probe",
    "probes",
    multiple=True,
    metavar="NAME=URL",
    help="Probe URL over HTTP each interval, as a caller would (repeat).",
)
@click.option(
    "--probe-timeout", help="Give up on a probe after this (default: 3/4 of the collector timeout)."
)
@click.option(
    "--kubelet-pods",
    envvar="AIVITALS_KUBELET_PODS",
    metavar="FILE|DIR|URL",
    help="Name the pods of GPU processes from the kubelet's /pods answer in a FILE, its log "
    "directory DIR (/var/log/pods) or its read-only port URL (http://127.0.0.1:10255/pods). "
    "Without it, a process in a pod gets its pod_uid label only.",
)
@click.option(
    "--rules",
    "rule_files",
    multiple=True,
    metavar="FILE",
    help="Evaluate this Prometheus rule file instead of the shipped pack (repeat). "
    "A file that does not load stops the agent before it starts.",
)
@click.option("--no-rules", is_flag=True, help="Evaluate no rules (the alert API answers empty).")
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="NAME=VALUE",
    help="A parameter of the shipped pack (docs/alerts.md, Parameters, lists them; repeat).",
)
@click.option(
    "--sla",
    metavar="DURATION",
    help="Request-time SLA of the scraped services (2s, 1500ms): exported as "
    "aivitals_service_sla_seconds, it turns on the pack's latency and error burn-rate "
    "alerts (docs/agent.md, SLA).",
)
@click.option(
    "--notify",
    "notify",
    multiple=True,
    metavar="KIND=URL",
    help="Send alerts to alertmanager=URL (its v2 API) or webhook=URL (Alertmanager's "
    "webhook body) (repeat).",
)
def agent(
    listen: str,
    allow_remote: bool,
    web_config: str | None,
    exporter: bool,
    scrape: tuple[str, ...],
    scrape_interval: str,
    gpu: str,
    sim_gpu_dir: str | None,
    pid: int | None,
    port: int | None,
    netns: tuple[str, ...],
    interval: str,
    retention: str,
    no_kernel_log: bool,
    probes: tuple[str, ...],
    probe_timeout: str | None,
    kubelet_pods: str | None,
    rule_files: tuple[str, ...],
    no_rules: bool,
    params: tuple[str, ...],
    sla: str | None,
    notify: tuple[str, ...],
) -> None:
    """Collect GPU, host, process and kernel signals; serve /metrics and a PromQL API;
    evaluate the alert rules (the shipped pack unless --rules or --no-rules).

    Listens on 127.0.0.1 unless --allow-remote; the API is read-only. Rules are
    evaluated every --scrape-interval; alerts are on /api/v1/alerts, rules on
    /api/v1/rules (aivitals alerts, aivitals alerts --rules).
    """
    from ..alerts import parse_param_pairs

    targets = [NotifyTarget.parse(n) for n in notify]
    rules_on = _rules_on(
        exporter=exporter, no_rules=no_rules, rule_files=rule_files, params=params, notify=notify
    )
    pack_params = parse_param_pairs(params)
    collector = RulesCollector() if rules_on else None
    targets_scraped = tuple(ScrapeTarget.parse(s) for s in scrape)
    sla_seconds = None if sla is None else parse_duration("sla", sla)
    sla_collector = (
        None
        if sla_seconds is None
        else SlaCollector([(t.job, t.instance) for t in targets_scraped], sla_seconds)
    )
    extra = tuple(c for c in (collector, sla_collector) if c is not None)
    config = AgentConfig(
        listen=listen,
        allow_remote=allow_remote,
        exporter=exporter,
        scrape=targets_scraped,
        scrape_interval=parse_duration("scrape-interval", scrape_interval),
        gpu=gpu,
        sim_gpu_dir=sim_gpu_dir,
        pid=pid,
        port=port,
        netns=netns,
        interval=parse_duration("interval", interval),
        retention=parse_duration("retention", retention),
        kernel_log=not no_kernel_log,
        probes=_probes(probes),
        probe_timeout=(
            None if probe_timeout is None else parse_duration("probe-timeout", probe_timeout)
        ),
        kubelet_pods=kubelet_pods or None,
        web_config=None if web_config is None else load_web_config(web_config),
        extra_collectors=extra,
        sla=sla_seconds,
    )
    if config.web_config is not None:
        web = config.web_config
        click.echo(
            f"web-config {web.path}: {web.scheme.upper()}, basic auth for "
            f"{len(web.users)} user(s) (health probes exempt)",
            err=True,
        )
    if rules_on:
        # loaded before anything starts: a bad file stops the agent here
        groups, files = (
            user_rules(rule_files)
            if rule_files
            else shipped_rules(config.scrape_interval, pack_params)
        )
        if not rule_files:
            groups, left_out = fit_retention(groups, config.retention)
            if left_out and sla_seconds is not None:
                click.echo(_retention_line(left_out, retention), err=True)
    the_agent = Agent(config)
    if sla_collector is not None:
        sla_collector.store = the_agent.store
    notifiers: Sequence[object] = ()
    if rules_on:
        _, notifiers = attach_rules(the_agent, groups, files, notify=targets, collector=collector)
        click.echo(_rules_line(groups, rule_files, targets, config.scrape_interval), err=True)
    elif no_rules:
        the_agent.rules_off_reason = "rules are off: the agent runs with --no-rules"
    if not config.exporter:
        the_agent.serve_diagnosis()  # /api/v1/diagnosis: its own store, with memory
    try:
        run_until_signal(the_agent)
    finally:
        for n in notifiers:
            flush, close = getattr(n, "flush", None), getattr(n, "close", None)
            if callable(flush):
                flush(2.0)  # what fired last gets its chance to leave
            if callable(close):
                close()


def _rules_line(
    groups: Sequence[RuleGroup],
    rule_files: Sequence[str],
    targets: Sequence[NotifyTarget],
    every: float,
) -> str:
    n_rules = sum(len(g.rules) for g in groups)
    source = ", ".join(rule_files) or "the shipped pack"
    sent = "; notify " + ", ".join(f"{t.kind}={t.url}" for t in targets) if targets else ""
    return f"rules: {n_rules} in {len(groups)} groups from {source}, every {every:g} s{sent}"


def _retention_line(left_out: Sequence[str], retention: str) -> str:
    return (
        f"SLO alerts left out at --retention {retention} (their windows are longer than "
        f"the store keeps): {', '.join(left_out)}; --retention 6h adds the slow burn, "
        "3d the ticket"
    )


def _rules_on(
    *,
    exporter: bool,
    no_rules: bool,
    rule_files: tuple[str, ...],
    params: tuple[str, ...],
    notify: tuple[str, ...],
) -> bool:
    """Whether the agent evaluates rules; ConfigError for options that contradict."""
    given = [
        flag
        for flag, values in (("--rules", rule_files), ("--param", params), ("--notify", notify))
        if values
    ]
    if exporter and given:
        raise ConfigError(
            f"{given[0]}: the exporter keeps no store to evaluate rules on; let Prometheus "
            "evaluate them (aivitals rules export)"
        )
    if no_rules and given:
        raise ConfigError(f"{given[0]}: contradicts --no-rules")
    if rule_files and params:
        raise ConfigError("--param: sets the shipped pack's parameters, not those of --rules")
    return not (exporter or no_rules)


def _probes(given: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in given:
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise click.BadParameter(f"{item!r}: expected NAME=URL", param_hint="--probe")
        if name in out:
            raise click.BadParameter(f"probe {name!r} given twice", param_hint="--probe")
        out[name] = url
    return out


def run_until_signal(the_agent: Agent) -> None:
    done = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    the_agent.start()
    try:
        names = ", ".join(c.name for c in the_agent.collectors)
        mode = "exporter" if the_agent.config.exporter else "agent"
        click.echo(f"aivitals {mode} on {the_agent.url} (collectors: {names})", err=True)
        while not done.wait(1.0):
            pass
    finally:
        the_agent.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


@dataclass(frozen=True, slots=True)
class _Row:
    collector: str
    up: bool
    duration_ms: float
    samples: int
    errors: dict[str, int]

    def line(self) -> str:
        errors = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items()))
        up = "yes" if self.up else "NO"
        return f"{self.collector:<10} {up:<4} {self.duration_ms:>8.2f} {self.samples:>8}  {errors}"


def _run_once(c: Collector) -> tuple[_Row, list[Sample]]:
    if isinstance(c, BaseCollector):
        result = c.run()
        row = _Row(c.name, result.ok, result.duration * 1000, len(result.samples), c.error_counts())
        return row, result.samples
    samples = [s for s in c.collect() if not s.name.startswith("aivitals_collector_")]
    return _Row(c.name, True, 0.0, len(samples), {}), samples


@click.command("collectors")
@click.option("--gpu", type=click.Choice(GPU_CHOICES), default="auto")
@click.option("--sim-gpu-dir", type=click.Path(file_okay=False), help="State dir of the sim GPU.")
@click.option("--pid", type=int, help="Include the process collector for this pid.")
@click.option("--port", type=int, help="Include the process collector for this listening port.")
@click.option("--samples", "show_samples", is_flag=True, help="Print every sample too.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def collectors(
    gpu: str,
    sim_gpu_dir: str | None,
    pid: int | None,
    port: int | None,
    show_samples: bool,
    as_json: bool,
) -> None:
    """List the collectors and run each once: up, time taken, samples, errors."""
    found = build_collectors(AgentConfig(gpu=gpu, sim_gpu_dir=sim_gpu_dir, pid=pid, port=port))
    rows: list[_Row] = []
    all_samples: list[Sample] = []
    for c in found:
        row, samples = _run_once(c)
        rows.append(row)
        all_samples += samples
        close = getattr(c, "close", None)
        if callable(close):
            close()
    if as_json:
        click.echo(json.dumps({"collectors": [dataclasses.asdict(r) for r in rows]}, indent=2))
        return
    click.echo(f"{'collector':<10} {'up':<4} {'ms':>8} {'samples':>8}  errors")
    for r in rows:
        click.echo(r.line())
    if gpu == "auto" and not any(r.collector == "gpu" for r in rows):
        click.echo(
            "(no GPU found: NVML did not load, nvidia-smi is absent; --gpu sim simulates one)"
        )
    if show_samples:
        click.echo(render(all_samples), nl=False)
