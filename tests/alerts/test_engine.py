"""The embedded engine's Prometheus semantics, on the embedded store and on a scripted backend."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from aivitals.alerts import AlertEvent, RuleEngine, default_pack, load_rules
from aivitals.alerts._engine import api_alert
from aivitals.errors import BackendError, QueryError
from aivitals.tsdb import InstantSample, QueryResult, Store

RULES = """
groups:
  - name: g
    rules:
      - record: job:x:sum
        expr: sum by (job) (x)
      - alert: XHigh
        expr: job:x:sum > 10
        for: 1m
        labels: {severity: P1, layer: service, team: "{{ $labels.job }}-team"}
        annotations:
          summary: "x of {{ $labels.job }} is {{ $value }}"
          description: '{{ printf "%.1f" $value }} / {{ $value | humanizePercentage }}'
      - alert: XHeld
        expr: job:x:sum > 10
        keep_firing_for: 45s
        labels: {severity: P2, layer: service}
"""


def _store(values: Sequence[float | None], step: float = 15.0) -> Store:
    store = Store(retention=1e9)
    for i, v in enumerate(values):
        if v is not None:
            store.append("x", {"job": "svc"}, v, i * step)
    return store


def _run(engine: RuleEngine, until: float, step: float = 15.0) -> dict[float, list[AlertEvent]]:
    return {i * step: engine.evaluate(i * step) for i in range(int(until / step) + 1)}


def _states(events: list[AlertEvent], name: str) -> list[str]:
    return [e.state for e in events if e.alertname == name]


def test_pending_then_firing_after_for_then_resolved() -> None:
    # x is 20 from 1m to 3m45s, then 0
    store = _store([1] * 4 + [20] * 12 + [0] * 8)
    engine = RuleEngine(store, load_rules(RULES), registry=CollectorRegistry())
    by_time = _run(engine, 345)
    assert _states(by_time[45], "XHigh") == []
    assert _states(by_time[60], "XHigh") == ["pending"]
    assert _states(by_time[105], "XHigh") == ["pending"]
    assert _states(by_time[120], "XHigh") == ["firing"]
    assert _states(by_time[240], "XHigh") == ["resolved"]
    assert _states(by_time[255], "XHigh") == []
    fired = next(e for e in by_time[120] if e.alertname == "XHigh")
    assert fired.active_at == 60 and fired.fired_at == 120 and fired.value == 20
    assert fired.labels == {
        "alertname": "XHigh",
        "job": "svc",
        "severity": "P1",
        "layer": "service",
        "team": "svc-team",
    }
    assert fired.annotations == {"summary": "x of svc is 20", "description": "20.0 / 2000%"}
    assert [(e.state, e.at) for e in engine.history() if e.alertname == "XHigh"] == [
        ("pending", 60),
        ("firing", 120),
        ("resolved", 240),
    ]
    assert [e.state for e in engine.history(start=100, end=200)] == ["firing"]


def test_for_zero_fires_in_the_same_evaluation_and_keep_firing_for_holds_it() -> None:
    # true at 1m and 1m15s only; keep_firing_for 45s holds it until 2m15s (45s after 1m30s)
    store = _store([0] * 4 + [20, 20] + [0] * 10)
    engine = RuleEngine(store, load_rules(RULES), registry=CollectorRegistry())
    by_time = _run(engine, 225)
    assert _states(by_time[60], "XHeld") == ["firing"]
    for t in (90, 105, 120):
        assert _states(by_time[t], "XHeld") == ["firing"], t
    assert _states(by_time[135], "XHeld") == ["resolved"]
    # the pending XHigh alert (for 1m) is dropped without ever firing
    assert _states(by_time[90], "XHigh") == []
    assert not [e for e in engine.history() if e.alertname == "XHigh" and e.state != "pending"]


def test_a_pending_alert_that_flaps_starts_its_for_again() -> None:
    store = _store([20, 20, 20, 0, 20, 20, 20, 20, 20])
    engine = RuleEngine(store, load_rules(RULES), registry=CollectorRegistry())
    by_time = _run(engine, 120)
    assert _states(by_time[45], "XHigh") == []
    assert _states(by_time[105], "XHigh") == ["pending"]
    assert _states(by_time[120], "XHigh") == ["firing"]
    firing = next(e for e in engine.firing() if e.alertname == "XHigh")
    assert firing.active_at == 60 and firing.fired_at == 120


def test_recording_rules_write_back_and_alerts_series_end_with_staleness() -> None:
    store = _store([20] * 10 + [0] * 4)
    engine = RuleEngine(store, load_rules(RULES), registry=CollectorRegistry())
    _run(engine, 195)
    assert store.query("job:x:sum", 60).values() == [20.0]
    alerts = store.query('ALERTS{alertname="XHigh"}', 120)
    assert [dict(s.labels)["alertstate"] for s in alerts.vector] == ["firing"]
    assert store.query('ALERTS_FOR_STATE{alertname="XHigh"}', 120).values() == [0.0]
    # resolved at 2m30s: the staleness marker ends the series at once, not 5 minutes later
    assert store.query('ALERTS{alertname="XHigh"}', 150).vector == []
    assert store.query('ALERTS{alertname="XHigh"}', 135).values() == [1.0]


def test_series_that_do_not_exist_raise_nothing_and_absent_rules_fire() -> None:
    store = Store(retention=1e9)
    store.append("up", {"job": "svc", "instance": "a"}, 1, 0)
    engine = RuleEngine(store, default_pack(), registry=CollectorRegistry())
    for i in range(9):
        engine.evaluate(i * 15.0)
    firing = {e.alertname for e in engine.firing()}
    assert firing == {"ServiceMetricsAbsent", "GPUMetricsAbsent", "HostMetricsAbsent"}
    assert all(h.error is None for h in engine.health()), [h for h in engine.health() if h.error]


def test_counter_reset_is_not_a_burst_of_oom_kills() -> None:
    # host_oom_kills_total restarts from 0 (agent restart): increase() handles the reset
    store = Store(retention=1e9)
    for i, v in enumerate([5] * 10 + [0] * 30):
        store.append("host_oom_kills_total", {"instance": "n"}, v, i * 15.0)
    engine = RuleEngine(store, default_pack(), registry=CollectorRegistry())
    for i in range(40):
        engine.evaluate(i * 15.0)
    assert not [e for e in engine.history() if e.alertname == "HostOOMKill"]


def test_a_gap_in_the_data_resolves_after_the_lookback_and_not_before() -> None:
    # the queue is long, then the exporter goes silent for 10 minutes (no samples at all)
    store = Store(retention=1e9)
    for i in range(12):
        store.append("queue_length", {"queue": "q"}, 50, i * 15.0)
    engine = RuleEngine(store, default_pack(), registry=CollectorRegistry())
    states = {}
    for i in range(50):
        events = engine.evaluate(i * 15.0)
        states[i * 15.0] = _states(events, "QueueBacklog")
    assert states[60.0] == ["firing"]
    # the last sample (2m45s) is still the value for 5 minutes of lookback
    assert states[450.0] == ["firing"]
    assert states[480.0] == ["resolved"]


class Scripted:
    """A Backend whose answers are scripted per expression; it can fail on demand."""

    def __init__(self, answer: Callable[[str, float], list[InstantSample]]) -> None:
        self.answer = answer
        self.fail: Exception | None = None

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        if self.fail is not None:
            raise self.fail
        return QueryResult("vector", vector=self.answer(expr, at or 0.0))

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        raise NotImplementedError


def _always(value: float, **labels: str) -> Scripted:
    return Scripted(lambda expr, at: [InstantSample(labels, value, at)])


def test_a_failing_backend_keeps_alert_state_and_reports_rule_health() -> None:
    backend = _always(20.0, job="svc")
    engine = RuleEngine(backend, load_rules(RULES), registry=CollectorRegistry())
    engine.evaluate(0)
    engine.evaluate(60)
    assert [e.alertname for e in engine.firing()] == ["XHeld", "XHigh"]
    backend.fail = BackendError("connection refused")
    events = engine.evaluate(75)
    assert {e.state for e in events} == {"firing"}  # nothing resolved on a failed query
    assert all(h.error and "connection refused" in h.error for h in engine.health())
    backend.fail = QueryError("bad", expr="x")
    engine.evaluate(90)
    backend.fail = None
    engine.evaluate(105)
    assert all(h.error is None for h in engine.health())
    assert len(engine.firing()) == 2


def test_labels_that_collide_after_templating_are_a_rule_error_not_a_crash() -> None:
    rules = load_rules(
        """
groups:
  - name: g
    rules:
      - alert: Collide
        expr: x
        labels: {job: same}
"""
    )
    backend = Scripted(
        lambda e, at: [InstantSample({"job": "a"}, 1, at), InstantSample({"job": "b"}, 1, at)]
    )
    engine = RuleEngine(backend, rules, registry=CollectorRegistry())
    assert engine.evaluate(0) == []
    (health,) = engine.health()
    assert health.error is not None and "same labelset" in health.error


def test_scalar_results_alert_with_empty_labels() -> None:
    rules = load_rules("groups:\n- name: g\n  rules:\n  - alert: S\n    expr: vector(1) > 0\n")

    class ScalarBackend(Scripted):
        def query(self, expr: str, at: float | None = None) -> QueryResult:
            return QueryResult("scalar", scalar=(at or 0.0, 3.0))

    engine = RuleEngine(ScalarBackend(lambda e, a: []), rules, registry=CollectorRegistry())
    (event,) = engine.evaluate(0)
    assert event.labels == {"alertname": "S"} and event.value == 3.0


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[AlertEvent]] = []
        self.fail = fail

    def notify(self, alerts: Sequence[AlertEvent]) -> None:
        if self.fail:
            raise RuntimeError("receiver bug")
        self.batches.append(list(alerts))


def test_notifiers_get_firing_alerts_then_resends_then_the_resolution() -> None:
    backend = _always(20.0, job="svc")
    rec, broken = Recorder(), Recorder(fail=True)
    engine = RuleEngine(
        backend,
        load_rules(RULES),
        notifiers=[broken, rec],
        resend_delay=60,
        registry=CollectorRegistry(),
    )
    for t in range(0, 180, 15):
        engine.evaluate(float(t))
    sent = [(b[0].alertname, b[0].state, t) for b in rec.batches for t in [b[0].active_at]]
    assert sent  # the broken notifier did not stop the others
    held = [e for b in rec.batches for e in b if e.alertname == "XHeld"]
    # sent when it fired (0s), again once resend_delay passed (75s), and again (150s)
    assert len(held) == 3
    assert all(e.valid_until is not None and e.valid_until > e.active_at for e in held)
    backend.answer = lambda expr, at: []
    engine.evaluate(180.0)
    engine.evaluate(240.0)
    resolved = [e for b in rec.batches for e in b if e.state == "resolved"]
    assert {e.alertname for e in resolved} == {"XHigh", "XHeld"}


def test_firing_gauge_and_snapshot_for_the_agent() -> None:
    registry = CollectorRegistry()
    backend = _always(20.0, job="svc")
    engine = RuleEngine(backend, load_rules(RULES), registry=registry)
    engine.evaluate(0)
    value = registry.get_sample_value(
        "aivitals_alerts_firing", {"alertname": "XHeld", "severity": "P2", "layer": "service"}
    )
    assert value == 1.0
    backend.answer = lambda expr, at: []
    engine.evaluate(100)  # held by keep_firing_for until 145
    engine.evaluate(150)
    assert (
        registry.get_sample_value(
            "aivitals_alerts_firing", {"alertname": "XHeld", "severity": "P2", "layer": "service"}
        )
        == 0.0
    )
    snap = engine.snapshot()
    assert snap["alerts"] == []
    held = [h["state"] for h in snap["history"] if h["alertname"] == "XHeld"]  # type: ignore[attr-defined,index]
    assert held == ["pending", "firing", "resolved"]
    assert registry.get_sample_value("aivitals_rule_evaluation_seconds", {"group": "g"}) is not None


def test_attach_runs_each_group_on_the_agents_clock() -> None:
    class FakeAgent:
        def __init__(self) -> None:
            self.jobs: dict[str, tuple[float, Callable[[float], None]]] = {}
            self.provider: Callable[[], object] | None = None

        def add_periodic(self, name: str, interval: float, fn: Callable[[float], None]) -> None:
            self.jobs[name] = (interval, fn)

        def set_alerts_provider(self, fn: Callable[[], object]) -> None:
            self.provider = fn

    agent = FakeAgent()
    engine = RuleEngine(_always(20.0, job="svc"), default_pack(), registry=CollectorRegistry())
    engine.attach(agent)
    assert set(agent.jobs) == {f"rules:{g.name}" for g in engine.groups}
    assert {interval for interval, _ in agent.jobs.values()} == {15.0}
    agent.jobs["rules:aivitals-service"][1](1000.0)
    assert agent.provider is not None  # an agent without set_rules_provider still works
    assert any(a["alertname"] == "QueueBacklog" for a in agent.provider()["alerts"])  # type: ignore[index]


def test_rules_json_has_prometheus_fields_states_and_health() -> None:
    store = _store([1] * 4 + [20] * 12)
    engine = RuleEngine(
        store, load_rules(RULES), registry=CollectorRegistry(), files={"g": "/etc/x.yml"}
    )
    (never,) = engine.rules_json()["groups"]  # type: ignore[attr-defined]
    assert never["lastEvaluation"] == "0001-01-01T00:00:00Z"
    assert {r["health"] for r in never["rules"]} == {"unknown"}
    _run(engine, 90)  # XHigh pending since 60 s
    (group,) = engine.rules_json()["groups"]  # type: ignore[attr-defined]
    assert (group["name"], group["file"], group["interval"], group["limit"]) == (
        "g",
        "/etc/x.yml",
        15.0,
        0,
    )
    assert group["lastEvaluation"] == "1970-01-01T00:01:30Z"
    record, high, held = group["rules"]
    assert record == {
        "name": "job:x:sum",
        "query": "sum by (job) (x)",
        "labels": {},
        "health": "ok",
        "lastError": "",
        "evaluationTime": record["evaluationTime"],
        "lastEvaluation": "1970-01-01T00:01:30Z",
        "type": "recording",
    }
    assert (high["type"], high["state"], high["duration"], high["keepFiringFor"]) == (
        "alerting",
        "pending",
        60.0,
        0.0,
    )
    assert high["labels"]["team"] == "{{ $labels.job }}-team"  # the rule's, not rendered
    (alert,) = high["alerts"]
    assert alert["labels"]["team"] == "svc-team" and alert["state"] == "pending"
    assert (alert["activeAt"], alert["value"]) == ("1970-01-01T00:01:00Z", "2e+01")
    assert (held["state"], held["keepFiringFor"]) == ("firing", 45.0)  # no for: fires at once


def test_a_failing_rule_reports_err_and_its_error() -> None:
    def answer(expr: str, at: float) -> list[InstantSample]:
        raise QueryError("bad data")

    engine = RuleEngine(Scripted(answer), load_rules(RULES), registry=CollectorRegistry())
    engine.evaluate(0)
    (group,) = engine.rules_json()["groups"]  # type: ignore[attr-defined]
    assert {(r["health"], r["lastError"]) for r in group["rules"]} == {("err", "bad data")}


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.93, "9.3e-01"), (1.0, "1e+00"), (-1234.5, "-1.2345e+03"), (0.0, "0e+00"),
     (math.nan, "NaN"), (math.inf, "+Inf"), (1e-7, "1e-07")],
)  # fmt: skip
def test_alert_values_are_written_as_prometheus_writes_them(value: float, text: str) -> None:
    event = AlertEvent("A", {"alertname": "A"}, {}, "firing", 0.0, 0.0, None, value)
    assert api_alert(event)["value"] == text


def test_unknown_group_is_an_error() -> None:
    engine = RuleEngine(_always(1.0), load_rules(RULES), registry=CollectorRegistry())
    with pytest.raises(Exception, match="no rule group"):
        engine.evaluate_group("nope", 0)


def test_nan_values_are_reported_as_null() -> None:
    event = AlertEvent("A", {}, {}, "firing", 0.0, 0.0, None, math.nan)
    assert event.to_dict()["value"] is None


def test_a_backend_bug_is_contained_to_its_rule() -> None:
    def answer(expr: str, at: float) -> list[InstantSample]:
        if "job:x:sum > 10" in expr:
            raise IndexError("evaluator bug")
        return [InstantSample({"job": "svc"}, 20.0, at)]

    engine = RuleEngine(Scripted(answer), load_rules(RULES), registry=CollectorRegistry())
    assert engine.evaluate(0) == []  # both alerts read the failing expression
    errors = {h.rule: h.error for h in engine.health()}
    assert errors["XHigh"] == "evaluator bug" and errors["job:x:sum"] is None


def test_a_group_limit_drops_the_rules_alerts_like_prometheus() -> None:
    rules = load_rules(
        "groups:\n- name: g\n  limit: 1\n  rules:\n  - alert: Many\n    expr: x > 0\n"
    )
    backend = Scripted(
        lambda e, at: [InstantSample({"i": "1"}, 1, at), InstantSample({"i": "2"}, 1, at)]
    )
    engine = RuleEngine(backend, rules, registry=CollectorRegistry())
    assert engine.evaluate(0) == []
    (health,) = engine.health()
    assert health.error == "exceeded limit of 1 with 2 alerts"


def test_a_recorded_series_the_rule_no_longer_returns_ends_with_staleness() -> None:
    # x is 20 (a P99 over enough requests), then the source stops matching: a rule with a
    # guard (``and ... >= min``) returns nothing; its recorded series must end at once,
    # not hold its last value for the 5-minute lookback and keep the alert firing
    rules = """
groups:
  - name: g
    rules:
      - record: job:x:guarded
        expr: sum by (job) (x) and on (job) (sum by (job) (n) >= 100)
      - alert: XHigh
        expr: job:x:guarded > 10
        labels: {severity: P0, layer: service}
"""
    store = Store(retention=1e9)
    for i in range(20):
        store.append("x", {"job": "svc"}, 20, i * 15.0)
        store.append("n", {"job": "svc"}, 500 if i < 8 else 5, i * 15.0)
    engine = RuleEngine(store, load_rules(rules), registry=CollectorRegistry())
    by_time = _run(engine, 285)
    assert _states(by_time[0], "XHigh") == ["firing"]
    assert store.query("job:x:guarded", 105).values() == [20.0]
    assert store.query("job:x:guarded", 120).vector == []  # stale at the first empty answer
    assert _states(by_time[120], "XHigh") == ["resolved"]
    assert not engine.firing()
