"""aivitals rules export|check|test and aivitals alerts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from aivitals.alerts._promtest import shipped_test_files
from aivitals.cli import cli, main
from tests._servers import free_port, require_binary


def _run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_export_writes_the_pack_and_both_configs(tmp_path: Path) -> None:
    result = _run(
        "rules",
        "export",
        "--out",
        str(tmp_path),
        "--sla-seconds",
        "0.5",
        "--queue-limit",
        "50",
        "--param",
        "gpu_memory_ratio=0.8",
        "--service-target",
        "127.0.0.1:8001",
        "--webhook-url",
        "http://127.0.0.1:6000/x",
    )
    assert result.exit_code == 0, result.output
    rules = (tmp_path / "aivitals-rules.yml").read_text()
    # the summary counts what it wrote (read back from the file, not a number kept here)
    written = [r for g in yaml.safe_load(rules)["groups"] for r in g["rules"]]
    n_alerts = sum("alert" in r for r in written)
    assert f"{len(written)} rules ({n_alerts} alerts) in 6 groups" in result.output
    assert "queue_length > 50" in rules and "> 2 * 0.5" in rules and "> 0.8" in rules
    prom = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["aivitals-native.yml", "aivitals-rules.yml"]
    native = yaml.safe_load((tmp_path / "aivitals-native.yml").read_text())
    assert [g["name"] for g in native["groups"]] == ["aivitals-native-names"]
    assert prom["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:8001"]
    am = yaml.safe_load((tmp_path / "alertmanager.yml").read_text())
    assert am["receivers"][0]["webhook_configs"][0]["url"] == "http://127.0.0.1:6000/x"


def test_export_refuses_bad_parameters_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["rules", "export", "--out", str(tmp_path), "--param", "nope=1"])
    assert exit_.value.code == 1
    with pytest.raises(SystemExit):
        main(["rules", "export", "--out", str(tmp_path), "--param", "sla_seconds=fast"])
    with pytest.raises(SystemExit):
        main(["rules", "export", "--out", str(tmp_path), "--alertmanager", "http://x/y"])
    assert not (tmp_path / "aivitals-rules.yml").exists()


def test_check_accepts_the_pack_and_names_the_bad_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yml"
    _run("rules", "export", "--out", str(tmp_path))
    good.write_text((tmp_path / "aivitals-rules.yml").read_text())
    result = _run("rules", "check", str(good))
    assert result.exit_code == 0, result.output
    n_rules = sum(len(g["rules"]) for g in yaml.safe_load(good.read_text())["groups"])
    assert n_rules > 50 and f"6 groups, {n_rules} rules OK" in result.output
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n- name: g\n  rules:\n  - alert: Broken\n    expr: rate(x[5m]\n")
    with pytest.raises(SystemExit) as exit_:
        main(["rules", "check", str(bad)])
    assert exit_.value.code == 1
    assert "RuleError: rule 'Broken': invalid expression" in capsys.readouterr().err


@pytest.mark.integration
def test_rules_test_runs_the_promtool_unit_tests() -> None:
    require_binary("promtool")
    result = _run("rules", "test")
    assert result.exit_code == 0, result.output
    assert result.output.count("SUCCESS") == len(shipped_test_files()) == 7


@contextmanager
def fake_agent(data: dict[str, Any]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200 if self.path == "/api/v1/alerts" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_alerts_lists_active_and_recent_from_an_agent() -> None:
    alert = {
        "alertname": "QueueBacklog",
        "labels": {"alertname": "QueueBacklog", "queue": "q", "severity": "P0", "layer": "service"},
        "annotations": {"summary": "Queue q holds 30 requests"},
        "state": "firing",
        "active_at": 1.0,
        "fired_at": 61.0,
        "resolved_at": None,
        "value": 30,
    }
    data = {"alerts": [alert], "history": [{**alert, "state": "pending"}, alert]}
    with fake_agent(data) as url:
        result = _run("alerts", "--agent", url)
        assert result.exit_code == 0, result.output
        assert "active alerts: 1" in result.output
        assert "firing   P0  service        QueueBacklog" in result.output
        assert "Queue q holds 30 requests" in result.output
        assert "recent transitions: 2" in result.output
        raw = _run("alerts", "--agent", url, "--json")
        assert json.loads(raw.output)["alerts"][0]["alertname"] == "QueueBacklog"


def test_alerts_says_when_the_agent_is_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["alerts", "--agent", f"http://127.0.0.1:{free_port()}"])
    assert exit_.value.code == 1
    assert "BackendError: cannot reach" in capsys.readouterr().err


def test_rules_test_without_promtool_says_how_to_get_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["rules", "test", "--promtool", "/nonexistent/promtool"])
    assert exit_.value.code == 1
    assert "ConfigError: promtool not found" in capsys.readouterr().err
