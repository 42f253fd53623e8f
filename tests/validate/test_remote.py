"""validate --target --prometheus/--alertmanager: the user's own alerts as validate's engine.

Refusals and transitions against scripted HTTP servers; the rules API and the alerts of
a real Prometheus (with the shipped pack loaded) and a real Alertmanager, end to end.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from aivitals.alerts import default_pack
from aivitals.errors import ConfigError
from aivitals.load import RequestTemplate
from aivitals.tsdb import PrometheusBackend
from aivitals.validate import ValidateConfig
from aivitals.validate._cli import validate
from aivitals.validate._external import ExternalOptions
from aivitals.validate._remote import RemoteAlerts, parse_rules_api
from tests._servers import alertmanager, free_port, prometheus

T0 = 1_796_625_000.0  # the epoch second the scripted times below start at
TEMPLATE = RequestTemplate("POST", "/ok", {"text": "{{prompt}}"}, source="the test's")


class _Scripted(BaseHTTPRequestHandler):
    """Answers each GET path with the JSON (or text) the test put in ``server.answers``."""

    def do_GET(self) -> None:
        answers: dict[str, Any] = self.server.answers  # type: ignore[attr-defined]
        path = self.path.split("?")[0]
        body = answers.get(path)
        token = answers.get("token")  # set: every path wants it as a bearer token
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            status, raw = 401, b"Unauthorized"
        elif body is None:
            status, raw = 404, b"404 page not found"
        elif isinstance(body, str):
            status, raw = 200, body.encode()
        else:
            status, raw = 200, json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[tuple[str, dict[str, Any]]]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    srv.answers = {}  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", srv.answers  # type: ignore[attr-defined]
    srv.shutdown()
    srv.server_close()


def _rules(*alerts: tuple[str, float], bad_group: bool = False) -> dict[str, Any]:
    rules = [
        {"type": "alerting", "name": name, "query": "vector(1) > 0", "duration": for_,
         "labels": {"severity": "P1"}, "annotations": {"summary": "x"}}
        for name, for_ in alerts
    ] + [{"type": "recording", "name": "job:up:sum", "query": "sum(up)"}]  # fmt: skip
    groups = [{"name": "g", "interval": 15, "rules": rules}]
    if bad_group:
        groups.append(
            {
                "name": "theirs",
                "rules": [{"type": "alerting", "name": "Odd", "query": "up ==", "duration": 0}],
            }
        )
    return {"status": "success", "data": {"groups": groups}}


def _alert(name: str, state: str, active_at: str = "2026-12-07T06:30:00.5Z") -> dict[str, Any]:
    return {
        "labels": {"alertname": name, "severity": "P1", "instance": "svc:1"},
        "annotations": {"summary": "x"},
        "state": state,
        "activeAt": active_at,
        "value": "1e+00",
    }


def _alerts(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": {"alerts": list(alerts)}}


def test_the_rules_api_is_parsed_as_a_rule_file_and_a_bad_group_is_named() -> None:
    groups, skipped = parse_rules_api(_rules(("HostCPUSaturated", 300.0), bad_group=True))
    [g] = groups
    [rule] = g.alerting_rules
    assert (rule.alert, rule.for_, g.interval) == ("HostCPUSaturated", 300.0, 15.0)
    assert [r.record for r in g.recording_rules] == ["job:up:sum"]
    assert len(skipped) == 1 and skipped[0].startswith("theirs: ")


def test_not_prometheus_is_refused_with_what_it_answered(scripted: Any) -> None:
    url, answers = scripted
    answers["/api/v1/rules"] = "<html>Grafana</html>"
    with pytest.raises(ConfigError, match=r"not a Prometheus API .*HTTP 200: '<html>Grafana"):
        RemoteAlerts(PrometheusBackend(url)).check()
    answers.clear()
    with pytest.raises(ConfigError, match=r"not a Prometheus API .*HTTP 404"):
        RemoteAlerts(PrometheusBackend(url)).check()


def test_a_prometheus_without_aivitals_rules_is_refused_with_the_fix(scripted: Any) -> None:
    url, answers = scripted
    answers["/api/v1/rules"] = _rules(("TheirOwnAlert", 60.0))
    with pytest.raises(ConfigError, match=r"none of aivitals' .* `aivitals rules export"):
        RemoteAlerts(PrometheusBackend(url)).check()


def test_a_prometheus_that_does_not_scrape_the_target_is_refused(scripted: Any) -> None:
    url, answers = scripted
    answers["/api/v1/rules"] = _rules(("HostCPUSaturated", 300.0))
    answers["/api/v1/query"] = {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {"instance": "db:9100"}}]},
    }
    remote = RemoteAlerts(PrometheusBackend(url))
    with pytest.raises(ConfigError, match=r"does not scrape the target .*port 8300.*db:9100"):
        remote.check(target_port=8300)
    remote.check(target_port=9100)  # the port it does scrape


def test_an_alertmanager_url_that_is_not_one_is_refused(scripted: Any) -> None:
    url, answers = scripted
    answers["/api/v1/rules"] = _rules(("HostCPUSaturated", 300.0))
    answers["/api/v2/status"] = {"status": "ok"}
    with pytest.raises(ConfigError, match="not an Alertmanager"):
        RemoteAlerts(PrometheusBackend(url), url).check()


def test_transitions_are_recorded_with_the_servers_times(scripted: Any) -> None:
    url, answers = scripted
    answers["/api/v1/rules"] = _rules(("HostCPUSaturated", 30.0), ("KVCacheHigh", 0.0))
    remote = RemoteAlerts(PrometheusBackend(url))
    remote.check()
    answers["/api/v1/alerts"] = _alerts(_alert("HostCPUSaturated", "pending"))
    remote.poll(now=T0 + 10)
    answers["/api/v1/alerts"]["data"]["alerts"] = [_alert("HostCPUSaturated", "firing")]
    remote.poll(now=T0 + 40)
    remote.poll(now=T0 + 45)  # nothing changed: nothing recorded
    answers["/api/v1/alerts"]["data"]["alerts"] = []
    remote.poll(now=T0 + 60)
    got = [(e.alertname, e.state, round(e.at - T0, 1)) for e in remote.history()]
    assert got == [
        ("HostCPUSaturated", "pending", 0.5),  # its activeAt, not the poll's time
        ("HostCPUSaturated", "firing", 30.5),  # activeAt + for
        ("HostCPUSaturated", "resolved", 60.0),
    ]
    assert remote.history(start=T0 + 20)[0].state == "firing"
    assert remote.active() == [] and remote.firing() == []


def test_a_failed_poll_resolves_nothing_and_is_counted(scripted: Any) -> None:
    url, answers = scripted
    answers["/api/v1/rules"] = _rules(("HostCPUSaturated", 0.0))
    remote = RemoteAlerts(PrometheusBackend(url))
    remote.check()
    answers["/api/v1/alerts"] = _alerts(_alert("HostCPUSaturated", "firing"))
    remote.poll(now=T0 + 5)
    del answers["/api/v1/alerts"]  # the server now answers 404
    remote.poll(now=T0 + 10)
    assert [e.state for e in remote.history()] == ["pending", "firing"]  # seen firing first
    assert [e.alertname for e in remote.firing()] == ["HostCPUSaturated"]
    assert remote.failed_polls == 1 and "404" in str(remote.last_error)


def test_with_alertmanager_an_alert_fires_when_alertmanager_holds_it(scripted: Any) -> None:
    url, answers = scripted
    answers["/api/v1/rules"] = _rules(("HostCPUSaturated", 0.0))
    answers["/api/v2/status"] = {"versionInfo": {"version": "0.25.0"}}
    remote = RemoteAlerts(PrometheusBackend(url), url)
    remote.check()
    answers["/api/v1/alerts"] = _alerts(_alert("HostCPUSaturated", "firing"))
    answers["/api/v2/alerts"] = []
    remote.poll(now=T0 + 5)  # Prometheus fires it; the pipeline does not hold it yet
    assert [e.state for e in remote.history()] == ["pending"]
    # Prometheus' external labels ride along to Alertmanager: still the same alert
    labels = {**_alert("HostCPUSaturated", "firing")["labels"], "cluster": "eu-1"}
    answers["/api/v2/alerts"] = [{"labels": labels, "startsAt": "2026-12-07T06:30:03Z"}]
    remote.poll(now=T0 + 8)
    assert [(e.state, e.at - T0) for e in remote.history()] == [("pending", 0.5), ("firing", 3.0)]


def test_the_connection_flags_reach_prometheus_and_alertmanager(
    scripted: Any, tmp_path: Path
) -> None:
    """One token for both URLs (a monitoring stack behind one gateway); without it the
    refusal names the flag to give, before any fault."""
    from aivitals.tsdb import RemoteConnection

    url, answers = scripted
    answers["/api/v1/rules"] = _rules(("HostCPUSaturated", 0.0))
    answers["/api/v2/status"] = {"versionInfo": {"version": "0.25.0"}}
    answers["/api/v1/alerts"] = _alerts(_alert("HostCPUSaturated", "firing"))
    held = _alert("HostCPUSaturated", "firing")["labels"]
    answers["/api/v2/alerts"] = [{"labels": held, "startsAt": "2026-12-07T06:30:03Z"}]
    answers["token"] = "s3cret"
    with pytest.raises(ConfigError, match=r"401.*--bearer-token-file"):
        RemoteAlerts(PrometheusBackend(url), url).check()
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    conn = RemoteConnection(bearer_token_file=token)
    remote = RemoteAlerts(PrometheusBackend(url, connection=conn), url, connection=conn)
    remote.check()
    remote.poll(now=T0 + 5)
    assert [e.state for e in remote.history()] == ["pending", "firing"]
    remote.stop()
    # a Prometheus that takes the token and an Alertmanager that does not: named as such
    alone = RemoteAlerts(PrometheusBackend(url, connection=conn), url)
    with pytest.raises(ConfigError, match=r"--alertmanager .*401 Unauthorized"):
        alone.check()
    # the CLI's options carry the connection to the target's settings
    options = ExternalOptions(
        url="http://127.0.0.1:1", request=TEMPLATE, prometheus=url, connection=conn
    )
    assert options.connection.bearer_token_file == token
    with pytest.raises(ConfigError, match="give --prometheus"):
        ExternalOptions(url="http://127.0.0.1:1", request=TEMPLATE, connection=conn)


def test_the_cli_refuses_remote_monitoring_it_cannot_use(tmp_path: Path) -> None:
    runner = CliRunner()
    report = tmp_path / "r.json"
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"path": "/ok", "body": {"text": "{{prompt}}"}}))
    dead = f"http://127.0.0.1:{free_port()}"
    cases = [
        (["--prometheus", "http://p:9090"], "only with --target"),
        (["--target", dead, "--request", str(request), "--alertmanager", "http://a:9093"],
         "give --prometheus too"),
        (["--target", dead, "--request", str(request), "--prometheus", "p:9090"],
         "expected an http:// or https:// URL"),
        (["--target", dead, "--request", str(request), "--prometheus", "http://p:9090",
          "--quick"], "run without --quick"),
        (["--target", dead, "--request", str(request), "--bearer-token-file", str(request)],
         "are for --prometheus and --alertmanager"),
        (["--header", "X-Scope-OrgID: a"], "are for --prometheus and --alertmanager"),
    ]  # fmt: skip
    for args, message in cases:
        result = runner.invoke(validate, [*args, "--report", str(report)])
        assert isinstance(result.exception, ConfigError), (args, result.output)
        assert message in str(result.exception), (args, str(result.exception))
        assert not report.exists()


class _Service(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(b'{"ok": true}')

    def do_GET(self) -> None:
        self._answer(b"up 1\n")

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_target_check_refuses_a_prometheus_that_does_not_scrape_it(scripted: Any) -> None:
    """Before the run lock and any fault, as every other refusal of --target."""
    from aivitals.validate._external import ExternalTarget

    url, answers = scripted
    answers["/api/v1/rules"] = _rules(("HostCPUSaturated", 300.0))
    answers["/api/v1/query"] = {"status": "success", "data": {"result": []}}
    svc = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=svc.serve_forever, daemon=True).start()
    try:
        options = ExternalOptions(
            url=f"http://127.0.0.1:{svc.server_address[1]}", request=TEMPLATE, prometheus=url
        )
        target = ExternalTarget(options)
        with pytest.raises(ConfigError, match="does not scrape the target"):
            target.check()
        answers["/api/v1/query"]["data"]["result"] = [
            {"metric": {"instance": f"localhost:{svc.server_address[1]}"}}
        ]
        target.check()
        described = target.describe()["alerts_from"]
        assert described["prometheus"] == url and described["alerting_rules"] == 1
    finally:
        svc.shutdown()
        svc.server_close()


def test_a_full_run_may_read_a_prometheus() -> None:
    options = ExternalOptions(
        url="http://127.0.0.1:9", request=TEMPLATE, prometheus="http://127.0.0.1:9090"
    )
    assert ValidateConfig(quick=False, target=options).target is options


# -- live: a real Prometheus with the shipped pack, and a real Alertmanager -----------------
class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        raw = b"demo_ok 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.integration
def test_a_real_prometheus_and_alertmanager_end_to_end(tmp_path: Path) -> None:
    target = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    port = int(target.server_address[1])
    pack = default_pack().write(tmp_path)
    extra = tmp_path / "drill.yml"
    extra.write_text(
        "groups:\n- name: drill\n  interval: 1s\n  rules:\n"
        "  - alert: DrillAlwaysFiring\n    expr: demo_ok > 0\n    for: 2s\n"
        "    labels: {severity: P3}\n"
    )
    try:
        with alertmanager(
            "route: {receiver: none, group_wait: 1s}\nreceivers: [{name: none}]\n"
        ) as am:
            config = (
                "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                f"alerting: {{alertmanagers: [{{static_configs: [{{targets: "
                f"['127.0.0.1:{am.port}']}}]}}]}}\n"
                f"scrape_configs: [{{job_name: svc, static_configs: [{{targets: "
                f"['127.0.0.1:{port}']}}]}}]\n"
            )
            with prometheus(config, rule_files=[pack, extra]) as prom:
                remote = RemoteAlerts(PrometheusBackend(prom.url), am.url, interval=0.5)
                with httpx.Client() as client:  # its first scrape, as a running one has had
                    deadline = time.monotonic() + 30
                    while (
                        time.monotonic() < deadline
                        and not client.get(
                            f"{prom.url}/api/v1/query", params={"query": "up"}
                        ).json()["data"]["result"]
                    ):
                        time.sleep(0.2)
                remote.check(target_port=port)
                # the whole shipped pack round-trips through Prometheus' rules API
                assert remote.skipped_groups == []
                ours = {r.alert for g in remote.groups for r in g.alerting_rules}
                assert set(default_pack().alert_names) <= ours
                remote.start()
                try:
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline and not any(
                        e.alertname == "DrillAlwaysFiring" for e in remote.firing()
                    ):
                        time.sleep(0.5)
                finally:
                    remote.stop()
                drill = [e for e in remote.history() if e.alertname == "DrillAlwaysFiring"]
                assert [e.state for e in drill] == ["pending", "firing"], remote.describe()
                pending, firing = drill
                # held its for: 2s before Prometheus fired it and Alertmanager took it
                assert firing.at - pending.at >= 2.0 - 0.01
                assert firing.labels["severity"] == "P3" and firing.labels["job"] == "svc"
                with httpx.Client() as client:
                    assert client.get(f"{am.url}/api/v2/alerts").json()  # it really holds it
    finally:
        target.shutdown()
        target.server_close()
