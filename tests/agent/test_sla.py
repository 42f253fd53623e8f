"""``aivitals agent --sla``: the SLA series per scraped service, the bucket bound it is
measured at, and the SLO rules fitted to the store's retention."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from aivitals.agent import Agent, AgentConfig, ScrapeTarget
from aivitals.agent._cli import parse_duration
from aivitals.agent._rules import (
    SLA_METRIC,
    SlaCollector,
    attach_rules,
    fit_retention,
    shipped_rules,
    sla_bound,
)
from aivitals.cli import main
from aivitals.errors import ConfigError
from aivitals.tsdb import Store

from .conftest import wait_for

TARGET = "http://127.0.0.1:9/metrics"
_SLO_RECORDS = ("job_le:slo_http_over_sla:ratio_rate", "job:slo_http_5xx:ratio_rate")


@pytest.mark.parametrize(("text", "seconds"), [("2s", 2.0), ("1500ms", 1.5), ("1m", 60.0)])
def test_the_sla_takes_a_duration(text: str, seconds: float) -> None:
    assert parse_duration("sla", text) == seconds
    assert AgentConfig(scrape=[ScrapeTarget.parse(TARGET)], sla=seconds).sla == seconds


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--sla", "soon", "--scrape", TARGET], "ConfigError: sla: 'soon' is not a duration"),
        (["--sla", "2 s", "--scrape", TARGET], "ConfigError: sla: '2 s' is not a duration"),
        (["--sla", "0s", "--scrape", TARGET], "ConfigError: sla: must be > 0"),
        (["--sla", "2s"], "sla: applies to the services the agent scrapes, and none is given"),
    ],
)
def test_a_bad_sla_stops_the_agent_before_it_starts(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["agent", "--gpu", "none", "--listen", "127.0.0.1:0", *argv])
    assert info.value.code == 1
    assert says in capsys.readouterr().err


def test_an_sla_in_the_config_must_be_a_positive_number() -> None:
    scrape = [ScrapeTarget.parse(TARGET)]
    with pytest.raises(ConfigError, match="sla: must be a finite number of seconds > 0"):
        AgentConfig(scrape=scrape, sla=float("inf"))
    with pytest.raises(ConfigError, match="sla: must be a number of seconds"):
        AgentConfig(scrape=scrape, sla="2s")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sla", "bounds", "le", "exact"),
    [
        (2.0, ["0.5", "1.0", "2.0", "+Inf"], "2.0", True),  # Python's client
        (2.0, ["0.5", "1", "2", "+Inf"], "2", True),  # Go's: the target's own text
        (1.8, ["1.0", "2.5", "5.0", "+Inf"], "2.5", False),  # the nearest above, looser
        (90.0, ["1.0", "60.0", "+Inf"], "90.0", False),  # nothing finite above
    ],
)
def test_the_sla_is_measured_at_a_bucket_bound(
    sla: float, bounds: list[str], le: str, exact: bool
) -> None:
    assert sla_bound(sla, bounds) == (le, exact)


def _store_with_histogram(bounds: list[str], *, job: str = "svc", instance: str = "h:1") -> Store:
    store = Store(retention=3600)
    now = time.time()
    for le in bounds:
        store.append(
            "http_request_duration_seconds_bucket",
            {"job": job, "instance": instance, "route": "/v1", "le": le},
            10.0,
            now,
        )
    return store


def test_the_collector_exports_the_sla_per_target_at_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    collector = SlaCollector([("svc", "h:1"), ("other", "h:2")], 1.8)
    assert list(collector.collect()) == []  # no store yet: the agent is being built
    collector.store = _store_with_histogram(["1", "2.5", "+Inf"])
    with caplog.at_level(logging.WARNING, logger="aivitals.agent"):
        first = list(collector.collect())
        second = list(collector.collect())
    # the target without a histogram has no latency to measure: no series
    assert [(s.name, s.labels, s.value) for s in first] == [
        (SLA_METRIC, {"job": "svc", "instance": "h:1", "bound": "2.5"}, 1.8)
    ]
    assert first == second
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 1  # once per target and bound, not every interval
    assert "(bounds: 1, 2.5, +Inf); measuring at le=2.5, the nearest bound above" in told[0]


def test_no_bound_at_or_above_the_sla_is_said(caplog: pytest.LogCaptureFixture) -> None:
    collector = SlaCollector([("svc", "h:1")], 90.0)
    collector.store = _store_with_histogram(["1.0", "+Inf"])
    with caplog.at_level(logging.WARNING, logger="aivitals.agent"):
        (sample,) = collector.collect()
    assert sample.labels["bound"] == "90.0"  # SLABucketMissing fires on it
    assert "none is at or above it" in caplog.records[0].getMessage()


def test_slo_alerts_longer_than_the_retention_are_left_out() -> None:
    groups, _ = shipped_rules(15.0)
    names = {r.name for g in groups for r in g.rules}
    fitted, left_out = fit_retention(groups, 3600.0)
    assert left_out == [
        "LatencySLOBurnSlow",
        "LatencySLOBurnTicket",
        "ErrorSLOBurnSlow",
        "ErrorSLOBurnTicket",
    ]
    kept = {r.name for g in fitted for r in g.rules}
    # the fast burn and its recordings stay; the 6h and 3d recordings go with their alerts
    assert {"LatencySLOBurnFast", "ErrorSLOBurnFast", "HTTPLatencyAboveBaseline"} <= kept
    assert not any(n.endswith(("rate6h", "rate3d")) for n in kept)
    # other groups' long windows are not the SLO's: DiskWillFill's 6h regression stays
    recorded = {f"{name}{w}" for name in _SLO_RECORDS for w in ("6h", "3d")}
    assert "DiskWillFill" in kept and names - kept == {*left_out, *recorded}
    assert fit_retention(groups, 6 * 3600.0)[1] == ["LatencySLOBurnTicket", "ErrorSLOBurnTicket"]
    assert fit_retention(groups, 3 * 86400.0)[1] == []


class _Service(http.server.BaseHTTPRequestHandler):
    """A foreign service's /metrics (Go-style bounds): 20 requests per scrape, half of
    them slower than 2 s and one in ten a 5xx."""

    scrapes = 0

    def do_GET(self) -> None:
        type(self).scrapes += 1
        n = 20 * type(self).scrapes
        body = "".join(
            [
                "# TYPE http_request_duration_seconds histogram\n",
                f'http_request_duration_seconds_bucket{{le="1"}} {n // 2}\n',
                f'http_request_duration_seconds_bucket{{le="2"}} {n // 2}\n',
                f'http_request_duration_seconds_bucket{{le="+Inf"}} {n}\n',
                f"http_request_duration_seconds_sum {n}\n",
                f"http_request_duration_seconds_count {n}\n",
            ]
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _service() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_foreign_service_slower_than_its_sla_pages_through_the_agent() -> None:
    # The whole path at compressed windows: the scrape, the SLA series at the target's
    # own bound text ("2"), the recording rules, the fast-burn page.
    windows = {
        "slo_fast_short_window": "1s",
        "slo_slow_short_window": "2s",
        "slo_fast_window": "3s",
        "slo_slow_window": "4s",
        "slo_ticket_window": "5s",
    }
    with _service() as url:
        target = ScrapeTarget.parse(f"svc={url}")
        sla = SlaCollector([(target.job, target.instance)], 2.0)
        config = AgentConfig(
            listen="127.0.0.1:0",
            interval=0.2,
            scrape=[target],
            scrape_interval=0.2,
            gpu="none",
            kernel_log=False,
            sla=2.0,
        )
        agent = Agent(config, collectors=[sla])
        sla.store = agent.store
        groups, files = shipped_rules(0.2, windows)
        slo = [g for g in groups if g.name == "aivitals-slo"]
        engine, _ = attach_rules(agent, slo, files)
        with agent:

            def paged() -> bool:
                return any(
                    e.alertname == "LatencySLOBurnFast" and e.state == "firing"
                    for e in engine.history()
                )

            wait_for(paged, timeout=15)
        fired = {e.alertname: e for e in engine.history() if e.state == "firing"}
    assert fired["LatencySLOBurnFast"].labels["le"] == "2"
    assert fired["LatencySLOBurnFast"].labels["severity"] == "P0"
    assert "SLABucketMissing" not in fired
