"""Webhook and Alertmanager notifiers: format, retries, backoff, bounds, never blocking."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from aivitals.alerts import (
    AlertEvent,
    AlertmanagerNotifier,
    RuleEngine,
    WebhookNotifier,
    load_rules,
    webhook_payload,
)
from aivitals.errors import ConfigError
from aivitals.tsdb import InstantSample, QueryResult
from tests._servers import alertmanager, free_port

from ._receiver import receiver

RULES = load_rules(
    """
groups:
  - name: g
    interval: 1s
    rules:
      - alert: Boom
        expr: boom > 0
        labels: {severity: P0, layer: model}
        annotations: {summary: "boom on {{ $labels.gpu }}: {{ $value }}"}
"""
)


class Switch:
    """A backend answering ``boom{gpu="0"} 1`` while on."""

    def __init__(self) -> None:
        self.on = True

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        if not self.on:
            return QueryResult("vector")
        return QueryResult("vector", vector=[InstantSample({"gpu": "0"}, 1.0, at or 0.0)])

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        raise NotImplementedError


def _event(name: str, state: str = "firing", **labels: str) -> AlertEvent:
    return AlertEvent(
        name,
        {"alertname": name, **labels},
        {"summary": f"{name} now"},
        state,  # type: ignore[arg-type]
        active_at=1_700_000_000.0,
        fired_at=1_700_000_060.0,
        resolved_at=1_700_000_120.0 if state == "resolved" else None,
        value=1.0,
    )


def test_webhook_payload_is_alertmanagers_version_4() -> None:
    body = webhook_payload(
        [_event("A", severity="P0", job="x"), _event("B", "resolved", severity="P0", job="y")],
        receiver="team",
        external_url="http://aivitals",
    )
    assert body["version"] == "4" and body["receiver"] == "team" and body["status"] == "firing"
    assert body["commonLabels"] == {"severity": "P0"}
    assert body["commonAnnotations"] == {}
    a, b = body["alerts"]
    assert a["status"] == "firing" and a["endsAt"] == "0001-01-01T00:00:00Z"
    assert a["startsAt"] == "2023-11-14T22:14:20.000Z"
    assert b["status"] == "resolved" and b["endsAt"] == "2023-11-14T22:15:20.000Z"
    assert len(a["fingerprint"]) == 16 and a["fingerprint"] != b["fingerprint"]
    for key in ("groupKey", "truncatedAlerts", "groupLabels", "externalURL"):
        assert key in body


def test_webhook_gets_the_firing_alert_once_then_its_resolution() -> None:
    registry = CollectorRegistry()
    with receiver() as rec:
        hook = WebhookNotifier(rec.url, receiver="hook", registry=registry)
        backend = Switch()
        engine = RuleEngine(backend, RULES, notifiers=[hook], resend_delay=1, registry=registry)
        for t in range(5):
            engine.evaluate(1000.0 + t * 2)
        backend.on = False
        engine.evaluate(1010.0)
        engine.evaluate(1012.0)
        assert hook.flush(10)
        hook.close()
        statuses = [b["status"] for b in rec.bodies]
        assert statuses == ["firing", "resolved"]
        first = rec.bodies[0]["alerts"][0]
        assert first["labels"] == {
            "alertname": "Boom",
            "gpu": "0",
            "severity": "P0",
            "layer": "model",
        }
        assert first["annotations"] == {"summary": "boom on 0: 1"}
    assert (
        registry.get_sample_value(
            "aivitals_notifications_total", {"receiver": "hook", "result": "sent"}
        )
        == 2.0
    )


def test_a_failing_webhook_is_retried_with_backoff_until_it_answers() -> None:
    registry = CollectorRegistry()
    with receiver() as rec:
        rec.codes = [500, 503]
        hook = WebhookNotifier(rec.url, backoff=0.05, max_retries=3, registry=registry)
        hook.notify([_event("A")])
        assert hook.flush(10)
        hook.close()
        assert rec.hits == 3 and len(rec.bodies) == 1
    assert hook.counts == {"retried": 2, "sent": 1}
    assert (
        registry.get_sample_value(
            "aivitals_notifications_total", {"receiver": "webhook", "result": "retried"}
        )
        == 2.0
    )


def test_a_webhook_that_refuses_with_4xx_is_not_retried() -> None:
    with receiver() as rec:
        rec.codes = [400]
        hook = WebhookNotifier(rec.url, backoff=0.05, registry=CollectorRegistry())
        hook.notify([_event("A")])
        assert hook.flush(10)
        hook.close()
        assert rec.hits == 1
    assert hook.counts == {"failed": 1}


def test_a_webhook_that_is_down_costs_evaluation_nothing_and_is_counted() -> None:
    url = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    hook = WebhookNotifier(url, backoff=0.02, max_retries=2, registry=CollectorRegistry())
    engine = RuleEngine(Switch(), RULES, notifiers=[hook], registry=CollectorRegistry())
    started = time.perf_counter()
    engine.evaluate(1000.0)
    assert time.perf_counter() - started < 0.5
    assert hook.flush(10)
    hook.close()
    assert hook.counts == {"retried": 2, "failed": 1}


def test_a_slow_webhook_fills_a_bounded_queue_and_the_rest_is_dropped() -> None:
    registry = CollectorRegistry()
    with receiver() as rec:
        rec.delay = 1.0
        hook = WebhookNotifier(rec.url, queue_size=2, timeout=5, registry=registry)
        started = time.perf_counter()
        for i in range(10):
            hook.notify([_event(f"A{i}")])
        assert time.perf_counter() - started < 0.5  # notify never waits for the receiver
        hook.close(timeout=0.1)
    dropped = registry.get_sample_value(
        "aivitals_notifications_total", {"receiver": "webhook", "result": "dropped"}
    )
    assert dropped is not None and dropped >= 7
    assert hook.counts["dropped"] == dropped


def test_notifier_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="url"):
        WebhookNotifier("ftp://x", registry=None)
    with pytest.raises(ConfigError, match="queue_size"):
        WebhookNotifier("http://127.0.0.1:1/", queue_size=0, registry=None)
    with pytest.raises(ConfigError, match="backoff"):
        AlertmanagerNotifier("http://127.0.0.1:1", backoff=-1, registry=None)
    with pytest.raises(ConfigError, match="repeat_interval"):
        WebhookNotifier("http://127.0.0.1:1/", repeat_interval=0, registry=None)


AM_CONFIG = """
route:
  receiver: hook
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


@pytest.mark.integration
def test_the_engine_pushes_to_a_real_alertmanager_which_routes_to_the_webhook() -> None:
    registry = CollectorRegistry()
    with receiver() as rec, alertmanager(AM_CONFIG.format(url=rec.url)) as am:
        pusher = AlertmanagerNotifier(am.url, registry=registry)
        backend = Switch()
        engine = RuleEngine(backend, RULES, notifiers=[pusher], resend_delay=1, registry=registry)
        engine.evaluate(time.time())
        assert pusher.flush(10)
        listed = httpx.get(am.url + "/api/v2/alerts", timeout=5).json()
        assert [a["labels"]["alertname"] for a in listed] == ["Boom"]
        assert listed[0]["status"]["state"] == "active"
        assert rec.wait_for(lambda bodies: any(b["status"] == "firing" for b in bodies))
        backend.on = False
        engine.evaluate(time.time())
        assert pusher.flush(10)
        assert rec.wait_for(lambda bodies: any(b["status"] == "resolved" for b in bodies))
        firing = next(b for b in rec.bodies if b["status"] == "firing")
        assert firing["alerts"][0]["labels"]["gpu"] == "0"
        assert firing["alerts"][0]["annotations"]["summary"] == "boom on 0: 1"
        pusher.close()
    assert pusher.counts["sent"] == 2


@pytest.mark.integration
def test_an_alertmanager_that_is_down_is_retried_and_counted() -> None:
    pusher = AlertmanagerNotifier(
        f"http://127.0.0.1:{free_port()}", backoff=0.02, max_retries=1, registry=None
    )
    engine = RuleEngine(Switch(), RULES, notifiers=[pusher], registry=CollectorRegistry())
    engine.evaluate(time.time())
    assert pusher.flush(10)
    pusher.close()
    assert pusher.counts == {"retried": 1, "failed": 1}
