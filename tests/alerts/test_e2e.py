"""End to end on real parts: exported pack -> Prometheus -> Alertmanager -> webhook.

A tiny exporter in the test serves GPU metrics; mid-test a GPU reports Xid 79.
A real Prometheus (scrape and evaluation every 1s) loads the exported rule pack
and prometheus.yml, fires GPUXidError and sends it to a real Alertmanager
started with the exported alertmanager.yml, which delivers it to a webhook
receiver in the test. Then `aivitals alerts --prometheus` lists it, and the
samples Prometheus scraped, replayed into the embedded store and evaluated by the
engine at Prometheus' own evaluation times, give the same pending and firing
alerts as Prometheus' ALERTS series, group by group.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from aivitals.alerts import ExportTargets, RuleEngine, RulePack, default_pack, export_pack
from aivitals.cli import cli
from aivitals.tsdb import Store
from tests._servers import alertmanager, free_port, prometheus

from ._receiver import receiver

# Besides the GPU, a few series that make every group of the pack record or alert from
# the start (so each group's evaluation times can be read back from Prometheus).
HEALTHY = """# TYPE gpu_memory_used_bytes gauge
gpu_memory_used_bytes{gpu="0",backend="sim"} 1e9
# TYPE gpu_memory_total_bytes gauge
gpu_memory_total_bytes{gpu="0",backend="sim"} 8e10
# TYPE http_request_duration_seconds_count counter
http_request_duration_seconds_count{route="/v1/embed",status_class="2xx",status="200"} 10
# TYPE queue_length gauge
queue_length{queue="inference"} 30
# TYPE kernel_oom_kills_total counter
kernel_oom_kills_total{process="python"} 1
"""
XID = """# TYPE gpu_xid_errors_total counter
gpu_xid_errors_total{gpu="0",backend="sim",xid="79",meaning="GPU has fallen off the bus"} 1
"""


@contextmanager
def exporter() -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"text": HEALTHY}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = state["text"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state["target"] = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _fast_alertmanager(text: str) -> str:
    doc = yaml.safe_load(text)
    for route in [doc["route"], *doc["route"].get("routes", [])]:
        route["group_wait"] = "1s"
        route["group_interval"] = "1s"
    return yaml.safe_dump(doc)


def _wait(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.integration
@pytest.mark.slow
def test_an_xid_reaches_the_webhook_through_prometheus_and_alertmanager(tmp_path: Path) -> None:
    pack = default_pack(scrape_interval="1s", evaluation_interval="1s")
    with receiver() as hook, exporter() as exp:
        targets = ExportTargets(
            service_targets=(f"127.0.0.1:{free_port()}",),  # no service: only the agent job
            agent_targets=(exp["target"],),
            webhook_url=hook.url,
        )
        export_pack(pack, tmp_path, targets)
        am_config = _fast_alertmanager((tmp_path / "alertmanager.yml").read_text())
        with alertmanager(am_config) as am:
            prom_doc = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
            prom_doc.pop("rule_files")
            prom_doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [
                f"127.0.0.1:{am.port}"
            ]
            with prometheus(
                yaml.safe_dump(prom_doc), rule_files=[tmp_path / "aivitals-rules.yml"]
            ) as prom:
                query = prom.url + "/api/v1/query"

                def scraped() -> bool:
                    r = httpx.get(query, params={"query": 'up{job="aivitals-agent"} == 1'})
                    return bool(r.json()["data"]["result"])

                _wait(scraped, 30, "the first scrape of the exporter")
                time.sleep(2)  # a few healthy evaluations first

                def xid_alerts(bodies: list[Any]) -> list[Any]:
                    return [
                        a
                        for b in bodies
                        if b["status"] == "firing"
                        for a in b["alerts"]
                        if a["labels"]["alertname"] == "GPUXidError"
                    ]

                assert not xid_alerts(hook.bodies)
                exp["text"] = HEALTHY + XID
                _wait(
                    lambda: hook.wait_for(lambda bodies: bool(xid_alerts(bodies)), 0.1),
                    45,
                    "the webhook to receive the Xid alert",
                )
                alert = xid_alerts(hook.bodies)[0]
                assert alert["labels"]["xid"] == "79"
                assert alert["labels"]["severity"] == "P0" and alert["labels"]["layer"] == "model"
                assert alert["labels"]["job"] == "aivitals-agent"
                assert "Xid 79 (GPU has fallen off the bus)" in alert["annotations"]["description"]
                assert alert["annotations"]["runbook"].startswith("dmesg -T | grep -i xid")
                result = CliRunner().invoke(cli, ["alerts", "--prometheus", prom.url])
                assert result.exit_code == 0, result.output
                assert "GPUXidError" in result.output and "firing" in result.output
                # Compare once enough evaluations are comparable (>= 20 over >= 3 groups).
                # A mismatch fails at once; only the amount of evidence is waited for: on a
                # loaded 2-core machine 2 s can give only 14 over 2 groups.
                deadline = time.monotonic() + 40
                while True:
                    time.sleep(2)
                    compared, skipped = _compare_live_alerts_with_the_engine(prom.url, pack)
                    if len(compared) >= 3 and sum(compared.values()) >= 20:
                        break
                    assert time.monotonic() < deadline, (compared, skipped)


def _matrix(url: str, selector: str, at: float) -> list[dict[str, Any]]:
    r = httpx.get(url + "/api/v1/query", params={"query": f"{selector}[10m]", "time": str(at)})
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def _ms(t: Any) -> int:
    return round(float(t) * 1000)


def _compare_live_alerts_with_the_engine(
    url: str, pack: RulePack
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """The raw samples Prometheus scraped, replayed into the embedded store at Prometheus'
    own evaluation times, give the same pending and firing alerts as its ALERTS series.

    Returns the evaluations compared per group and those left out per group and reason."""
    end = time.time()
    raw = _matrix(url, '{__name__=~".+", __name__!~"ALERTS.*|.*:.*"}', end)
    store = Store(retention=1e9)
    scrapes: set[int] = set()
    for series in raw:
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        for t, v in series["values"]:
            store.append(name, labels, float(v), _ms(t) / 1000)
            scrapes.add(_ms(t))
    group_of = {r.name: g.name for g in pack.groups for r in g.rules}
    seen: dict[str, set[int]] = {g.name: set() for g in pack.groups}
    prom_alerts: dict[tuple[str, int], set[tuple[tuple[str, str], ...]]] = {}
    for series in _matrix(url, '{__name__=~"ALERTS|.*:.*"}', end):
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        group = group_of[labels["alertname"] if name == "ALERTS" else name]
        for t, _ in series["values"]:
            seen[group].add(_ms(t))
            if name == "ALERTS":
                key = tuple(sorted(labels.items()))
                prom_alerts.setdefault((group, _ms(t)), set()).add(key)
    # Each group runs on its own fixed 1s cadence; Prometheus' first evaluations may have
    # left no sample, so the cadence is extended back to the first scrape.
    evals: list[tuple[int, str]] = []
    silent = [group for group, times in seen.items() if not times]
    for group, times in seen.items():
        if times:
            last = max(times)
            evals += [(t, group) for t in range(last, min(scrapes) - 1000, -1000)]
    engine = RuleEngine(store, pack, registry=CollectorRegistry())
    # A group whose every rule reads a series nothing exported here (the SLO group without
    # an SLA series) leaves no trace in Prometheus: the engine must find nothing either.
    for group in silent:
        assert [e for e in engine.evaluate_group(group, end) if e.state != "resolved"] == []
        records = [r.record for g in pack.groups if g.name == group for r in g.recording_rules]
        assert records and not any(store.query(r, end).values() for r in records), group
    assert len(silent) < len(seen) // 2, f"most groups left no trace: {silent}"
    compared: dict[str, int] = {}
    skipped: dict[str, dict[str, int]] = {}
    for t, group in sorted(evals):
        events = engine.evaluate_group(group, t / 1000)
        # A scrape that started just before an evaluation may not have been appended when
        # Prometheus ran it; such evaluations saw different data and are not compared.
        reason = (
            "scrape just before"
            if any(0 <= t - s <= 50 for s in scrapes)
            else "before the group's first output"
            if t < min(seen[group])
            else None
        )
        if reason:
            counts = skipped.setdefault(group, {})
            counts[reason] = counts.get(reason, 0) + 1
            continue
        ours = {
            tuple(sorted({**e.labels, "alertstate": e.state}.items()))
            for e in events
            if e.state != "resolved"
        }
        assert ours == prom_alerts.get((group, t), set()), (group, t)
        compared[group] = compared.get(group, 0) + 1
    return compared, skipped
