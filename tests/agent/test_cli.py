from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from aivitals.agent import Agent, _cli
from aivitals.alerts import default_pack
from aivitals.cli import cli, main
from tests._servers import free_port
from tests.alerts._receiver import receiver

from .conftest import wait_for

REPO = Path(__file__).resolve().parents[2]


def test_collectors_command_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "collectors",
            "--gpu",
            "sim",
            "--sim-gpu-dir",
            str(tmp_path),
            "--pid",
            str(os.getpid()),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = {r["collector"]: r for r in json.loads(result.output)["collectors"]}
    assert set(rows) >= {"host", "process", "gpu", "kernel"}
    assert rows["gpu"]["up"] is True and rows["gpu"]["samples"] > 5
    assert rows["host"]["samples"] > 10


def test_collectors_command_table_and_samples(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["collectors", "--gpu", "sim", "--sim-gpu-dir", str(tmp_path), "--samples"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("collector")
    assert 'gpu_memory_total_bytes{gpu="0",backend="sim"}' in result.output


def test_agent_refuses_remote_listen_without_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--listen", "0.0.0.0:9478", "--gpu", "none"])
    assert info.value.code == 1
    assert (
        "ConfigError: listen: '0.0.0.0:9478' is not a loopback address" in capsys.readouterr().err
    )


def test_agent_bad_interval(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--interval", "soon", "--gpu", "none"])
    assert info.value.code == 1
    assert "ConfigError: interval: 'soon' is not a duration" in capsys.readouterr().err


def test_agent_bad_netns(capsys: pytest.CaptureFixture[str]) -> None:
    # a relative path is neither an ip netns name nor a namespace file
    with pytest.raises(SystemExit) as info:
        main(["agent", "--netns", "proc/1/ns/net", "--gpu", "none", "--listen", "127.0.0.1:0"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "ConfigError: netns: 'proc/1/ns/net' is not a namespace name, glob or absolute" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--probe", "nourl"], "expected NAME=URL"),
        (["--probe", "a=http://127.0.0.1:1/", "--probe", "a=http://127.0.0.1:2/"], "twice"),
        (["--probe", "a=ftp://127.0.0.1/"], "is not an http(s) URL"),
        (
            ["--probe", "a=http://127.0.0.1:1/", "--probe-timeout", "5s"],
            "below the collector timeout",
        ),
    ],
)
def test_agent_bad_probe(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--gpu", "none", "--listen", "127.0.0.1:0", *argv])
    assert info.value.code in (1, 2)
    assert message in capsys.readouterr().err


@pytest.mark.integration
def test_agent_command_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "aivitals.cli",
        "agent",
        "--listen",
        f"127.0.0.1:{port}",
        "--gpu",
        "sim",
        "--sim-gpu-dir",
        str(tmp_path),
        "--interval",
        "200ms",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(url + "/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=30)
        text = httpx.get(url + "/metrics", timeout=5).text
        assert 'gpu_utilization_ratio{gpu="0",backend="sim"}' in text
        q = httpx.get(url + "/api/v1/query", params={"query": "host_memory_total_bytes"}).json()
        assert float(q["data"]["result"][0]["value"][1]) > 0
        # the shipped pack runs by default, and the sim GPU keeps GPUMetricsAbsent quiet
        rules = httpx.get(url + "/api/v1/rules", params={"type": "alert"}).json()["data"]
        names = {r["name"]: r for g in rules["groups"] for r in g["rules"]}
        assert names["GPUMetricsAbsent"]["state"] == "inactive"
        assert httpx.get(url + "/api/v1/alerts").json()["status"] == "success"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert b"aivitals agent on http://127.0.0.1:" in err
    fitted, _ = _cli.fit_retention(default_pack().groups, 3600.0)  # the default retention
    n = sum(len(g.rules) for g in fitted)
    assert f"rules: {n} in 6 groups from the shipped pack, every 15 s".encode() in err


HOST_RULES = """
groups:
  - name: mine
    rules:
      - record: host:load1:max
        expr: max(host_load1)
      - alert: HostLoadSeen
        expr: host:load1:max >= 0
        for: 0s
        labels: {severity: P2, layer: infrastructure}
        annotations: {summary: "load1 is {{ $value }}"}
"""
FAST = ["--listen", "127.0.0.1:0", "--gpu", "none", "--no-kernel-log", "--interval", "100ms"]


@dataclass
class _Run:
    code: int
    output: str
    started: bool


def _run_agent(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    check: Callable[[Agent], None],
) -> _Run:
    """``aivitals agent ARGV`` in this process: ``check`` runs against the started agent
    in place of the wait for a signal, then the command cleans up as on SIGTERM."""
    ran: list[Agent] = []

    def run(agent: Agent) -> None:
        agent.start()
        try:
            ran.append(agent)
            check(agent)
        finally:
            agent.stop()

    monkeypatch.setattr(_cli, "run_until_signal", run)
    code = 0
    try:
        main(["agent", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return _Run(code, captured.out + captured.err, bool(ran))


def _get(agent: Agent, path: str, **params: Any) -> Any:
    return httpx.get(agent.url + path, params=params, timeout=5).json()


def test_the_agent_fires_a_user_rule_on_collected_data_and_notifies_a_webhook(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rules = tmp_path / "mine.yml"
    rules.write_text(HOST_RULES)
    with receiver() as hook:

        def check(agent: Agent) -> None:
            def firing() -> bool:
                alerts = _get(agent, "/api/v1/alerts")["data"]["alerts"]
                return [a["state"] for a in alerts] == ["firing"]

            wait_for(firing, timeout=10)
            (alert,) = _get(agent, "/api/v1/alerts")["data"]["alerts"]
            # Prometheus's fields, on the host collector's real load1
            assert alert["labels"] == {
                "alertname": "HostLoadSeen",
                "severity": "P2",
                "layer": "infrastructure",
            }
            assert alert["annotations"]["summary"].startswith("load1 is ")
            assert alert["activeAt"].endswith("Z") and float(alert["value"]) >= 0
            (group,) = _get(agent, "/api/v1/rules")["data"]["groups"]
            assert (group["name"], group["file"], group["interval"]) == ("mine", str(rules), 0.2)
            record, alerting = group["rules"]
            assert record["type"] == "recording" and record["health"] == "ok"
            assert alerting["type"] == "alerting" and alerting["state"] == "firing"
            assert alerting["query"] == "host:load1:max >= 0" and alerting["duration"] == 0
            assert alerting["annotations"]["summary"] == "load1 is {{ $value }}"
            assert [a["labels"]["alertname"] for a in alerting["alerts"]] == ["HostLoadSeen"]
            assert hook.wait_for(lambda bodies: len(bodies) >= 1, timeout=10)
            # the engine's and notifier's counts are the agent's own series
            wait_for(lambda: "aivitals_notifications_total" in agent.metrics_text())

        result = _run_agent(
            monkeypatch,
            capsys,
            [*FAST, "--scrape-interval", "200ms", "--rules", str(rules), "--notify",
             f"webhook={hook.url}"],
            check,
        )  # fmt: skip
        assert result.code == 0, result.output
        (body,) = hook.bodies[:1]
        assert body["receiver"] == "webhook" and body["status"] == "firing"
        assert body["alerts"][0]["labels"]["alertname"] == "HostLoadSeen"
    assert "rules: 2 in 1 groups from " in result.output


def test_the_agent_runs_the_shipped_pack_by_default_at_its_scrape_interval(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def check(agent: Agent) -> None:
        def evaluated() -> bool:
            groups = _get(agent, "/api/v1/rules")["data"]["groups"]
            return all(g["lastEvaluation"] != "0001-01-01T00:00:00Z" for g in groups)

        wait_for(evaluated, timeout=10)
        groups = _get(agent, "/api/v1/rules")["data"]["groups"]
        assert {g["name"] for g in groups} >= {"aivitals-service", "aivitals-exporters"}
        assert {g["interval"] for g in groups} == {2.0}
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        # --gpu none: the agent declared no GPU, so no GPU metrics is not a blind spot
        assert rules["GPUMetricsAbsent"]["state"] == "inactive"
        assert rules["GPUMetricsAbsent"]["health"] == "ok"
        assert [r["name"] for r in rules.values() if r["health"] != "ok"] == []

    result = _run_agent(monkeypatch, capsys, [*FAST, "--scrape-interval", "2s"], check)
    assert result.code == 0, result.output
    # the default retention (1h) keeps the fast SLO burn only (fit_retention)
    fitted, _ = _cli.fit_retention(default_pack().groups, 3600.0)
    n = sum(len(g.rules) for g in fitted)
    assert f"rules: {n} in 6 groups from the shipped pack, every 2 s" in result.output
    assert "SLO alerts left out" not in result.output  # said only where --sla asks for them


def test_no_rules_serves_empty_documents_that_say_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def check(agent: Agent) -> None:
        for path, key in (("/api/v1/alerts", "alerts"), ("/api/v1/rules", "groups")):
            body = _get(agent, path)
            assert body["data"] == {key: []}
            assert body["warnings"] == ["rules are off: the agent runs with --no-rules"]
        listed = CliRunner().invoke(cli, ["alerts", "--agent", agent.url])
        assert listed.exit_code == 0, listed.output
        assert "active alerts: 0" in listed.output and "--no-rules" in listed.output

    result = _run_agent(monkeypatch, capsys, [*FAST, "--no-rules"], check)
    assert result.code == 0, result.output
    assert "rules:" not in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "groups: [{name: g, rules: [{alert: Broken, expr: 'sum(rate(x[5m])'}]}]",
            "rule 'Broken': invalid expression",
        ),
        ("groups:\n  - name: g\n    rules:\n      - alert: NoExpr\n", "rule 'NoExpr': expr is"),
        ("groups: [{name: g, rules: [{alert: A, expr: up, for: soon}]}]", "rule 'A': for="),
        ("groups: [[", "not valid YAML"),
    ],
)
def test_a_bad_rule_file_stops_the_agent_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    text: str,
    message: str,
) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(text)
    result = _run_agent(monkeypatch, capsys, [*FAST, "--rules", str(bad)], lambda agent: None)
    assert result.code == 1
    assert not result.started
    assert f"ConfigError: --rules {bad}: " in result.output and message in result.output


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rules", "/nonexistent/rules.yml"], "--rules /nonexistent/rules.yml: no such file"),
        (["--exporter", "--notify", "webhook=http://127.0.0.1:1/"], "--notify: the exporter"),
        (["--no-rules", "--rules", "x.yml"], "--rules: contradicts --no-rules"),
        (["--rules", "x.yml", "--param", "queue_limit=5"], "--param: sets the shipped pack's"),
        (["--notify", "http://127.0.0.1:9093"], "is not KIND=URL with KIND one of alertmanager"),
        (["--notify", "alertmanager=127.0.0.1:9093"], "is not an http(s) URL"),
        (["--param", "queue_limt=5"], "expected NAME=VALUE"),
        (["--scrape-interval", "30s"], "Widen the window with --param NAME=VALUE"),
    ],
)
def test_rule_options_that_cannot_work_are_refused(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    result = _run_agent(monkeypatch, capsys, [*FAST, *argv], lambda agent: None)
    assert result.code in (1, 2) and not result.started
    assert message in result.output
