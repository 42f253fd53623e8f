"""Findings with memory: a finding that led keeps leading until its evidence is gone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from aivitals.diagnose import (
    Diagnosis,
    EvidenceResult,
    Finding,
    FindingMemory,
    Shape,
    Unseen,
    diagnose,
    hold_for,
    look_back,
)
from aivitals.errors import BackendError, ConfigError
from aivitals.tsdb import QueryResult
from aivitals.validate import load_recordings

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "benchmarks" / "recordings"


def _finding(sig: str, conf: float, expr: str = "up > 0", node: str | None = None) -> Finding:
    layer = "service" if sig.startswith("anomaly_") else "model"
    return Finding(
        signature=sig,
        layer=layer,
        title=sig,
        confidence=conf,
        evidence=[EvidenceResult("required", "it holds", expr, held=True, seen=True)],
        first_deviation=None,
        commands=(),
        stop_loss=(),
        where={"node": node} if node else {},
        scope="node" if node else "local",
    )


def _look(
    t: float, *findings: Finding, unseen: tuple[Unseen, ...] = (), location: str | None = None
) -> Diagnosis:
    return Diagnosis(
        Shape.HEALTHY if not findings else Shape.INTERMITTENT_SPIKES,
        t - 60.0,
        t,
        1.0,
        list(findings),
        (),
        list(unseen),
        location=location,
    )


def _tops(ds: list[Diagnosis]) -> list[str]:
    return [d.findings[0].signature if d.findings else "-" for d in ds]


def test_a_generic_anomaly_does_not_displace_the_held_finding_within_the_hold() -> None:
    m = FindingMemory(hold=16.0)
    leak = _finding("gpu_memory_leak", 0.78)
    looks = [
        m.update(_look(100.0, leak)),
        m.update(_look(103.0, _finding("anomaly_service", 0.35))),  # evidence gone 3 s
        m.update(_look(106.0)),  # nothing at all
        m.update(_look(116.0, _finding("anomaly_service", 0.35))),  # gone 16 s: the hold
        m.update(_look(117.0, _finding("anomaly_service", 0.35))),  # gone 17 s: released
    ]
    assert _tops(looks) == [
        "gpu_memory_leak",
        "gpu_memory_leak",
        "gpu_memory_leak",
        "gpu_memory_leak",
        "anomaly_service",
    ]
    held = looks[2].findings[0]
    assert held.held_since == 100.0 and held.evidence_seen == 100.0
    assert looks[1].findings[1].signature == "anomaly_service"  # kept, behind it
    assert m.held is None


def test_a_weaker_signature_does_not_displace_it_while_its_evidence_holds() -> None:
    m = FindingMemory(hold=16.0)
    m.update(_look(100.0, _finding("timeouts_not_aborting", 1.0)))
    # the engine ranked a challenger first (its earlier deviation's bonus), with less
    # confidence than the held finding has now
    d = m.update(
        _look(
            103.0,
            _finding("cpu_bound_preprocessing", 0.75),
            _finding("timeouts_not_aborting", 0.88),
        )
    )
    assert [f.signature for f in d.findings] == ["timeouts_not_aborting", "cpu_bound_preprocessing"]
    assert d.findings[0].confidence == 0.88  # as seen now, not as it was
    assert d.findings[0].evidence_seen == 103.0 and d.findings[0].held_since == 100.0


def test_a_stronger_signature_displaces_it_and_is_held_in_turn() -> None:
    m = FindingMemory(hold=16.0)
    m.update(_look(100.0, _finding("cache_stampede", 0.78)))
    d = m.update(_look(103.0, _finding("connection_flood", 0.82), _finding("cache_stampede", 0.78)))
    assert d.findings[0].signature == "connection_flood"
    assert d.findings[0].held_since == 103.0
    assert d.findings[1].held_since is None  # only the held finding carries the marks


def test_a_fully_evidenced_cause_takes_over_once_the_held_evidence_is_gone() -> None:
    # the early looks read a blocked loop as network latency; its evidence has been gone
    # for a rate window (the grace) and the specific cause is evidenced at high
    # confidence: holding the first would be a lie
    m = FindingMemory(hold=16.0)
    assert m.grace == 8.0  # one of the hold's two rate windows
    m.update(_look(100.0, _finding("network_latency", 0.95)))
    d = m.update(_look(109.0, _finding("event_loop_blocked", 0.78)))
    assert d.findings[0].signature == "event_loop_blocked"
    # a lead under high confidence is not such a cause
    m = FindingMemory(hold=16.0)
    m.update(_look(100.0, _finding("network_latency", 0.95)))
    d = m.update(_look(109.0, _finding("event_loop_blocked", 0.55)))
    assert d.findings[0].signature == "network_latency"


def test_evidence_missing_for_less_than_the_grace_is_not_gone() -> None:
    # a rate over bursty inputs can drop for up to one of its windows: one poll without
    # the held finding's evidence does not hand the lead to a weaker cause
    m = FindingMemory(hold=16.0)
    m.update(_look(108.0, _finding("timeouts_not_aborting", 1.0)))
    m.update(_look(111.0, _finding("timeouts_not_aborting", 1.0)))
    d = m.update(_look(114.0, _finding("cpu_bound_preprocessing", 0.75)))  # gone 3 s
    assert d.findings[0].signature == "timeouts_not_aborting"
    assert d.findings[0].evidence_seen == 111.0
    # ... while a stronger one still takes it, as it would while the evidence is found
    d = m.update(_look(116.0, _finding("gpu_xid", 1.0)))
    assert d.findings[0].signature == "timeouts_not_aborting"  # not stronger: equal
    m = FindingMemory(hold=16.0)
    m.update(_look(108.0, _finding("cpu_bound_preprocessing", 0.75)))
    d = m.update(_look(111.0, _finding("gpu_xid", 0.82)))
    assert d.findings[0].signature == "gpu_xid"


def test_nothing_under_high_confidence_is_ever_held() -> None:
    m = FindingMemory(hold=16.0)
    m.update(_look(100.0, _finding("traffic_surge", 0.55)))
    d = m.update(_look(103.0, _finding("anomaly_service", 0.35)))
    assert d.findings[0].signature == "anomaly_service"
    m.update(_look(104.0, _finding("anomaly_service", 0.9)))  # a generic anomaly is no cause
    assert m.held is None


def test_failed_evidence_queries_keep_the_hold_and_say_so() -> None:
    m = FindingMemory(hold=16.0)
    expr = "max(gpu_memory_used_bytes) > 0"
    m.update(_look(100.0, _finding("gpu_memory_leak", 0.78, expr)))
    failed = Unseen(expr, "query failed: BackendTimeout: no answer in time")
    d = m.update(_look(103.0, unseen=(failed,)))
    d = m.update(_look(130.0, _finding("anomaly_service", 0.3), unseen=(failed,)))  # > hold
    top = d.findings[0]
    assert top.signature == "gpu_memory_leak"
    assert top.evidence_unseen_since == 103.0 and top.evidence_seen == 100.0
    assert "evidence unseen since" in d.to_markdown()
    # seen again: the mark goes, and the hold restarts from the new sighting
    d = m.update(_look(133.0, _finding("gpu_memory_leak", 0.78, expr)))
    assert d.findings[0].evidence_unseen_since is None and d.findings[0].evidence_seen == 133.0


def test_a_backend_given_up_on_keeps_the_hold_too() -> None:
    m = FindingMemory(hold=16.0)
    m.update(_look(100.0, _finding("gpu_xid", 0.82)))
    dead = Unseen("12 queries", "not sent: the backend failed 3 queries in a row")
    d = m.update(_look(200.0, unseen=(dead,)))
    assert d.findings[0].signature == "gpu_xid" and d.findings[0].evidence_unseen_since == 200.0


def test_the_report_says_since_when_it_is_held() -> None:
    m = FindingMemory(hold=16.0)
    m.update(_look(1_800_000_000.0, _finding("gpu_memory_leak", 0.78)))
    d = m.update(_look(1_800_000_012.0, _finding("anomaly_service", 0.35)))
    md, html, text = d.to_markdown(), d.to_html(), d.to_terminal()
    for out in (md, html, text):
        assert re.search(r"held since \d\d:\d\d:\d\d, evidence last seen \d\d:\d\d:\d\d", out)
    assert d.to_dict()["findings"][0]["held_since"] == 1_800_000_000.0


def test_over_a_fleet_each_node_is_its_own_finding() -> None:
    m = FindingMemory(hold=16.0)
    m.update(_look(100.0, _finding("gpu_memory_leak", 0.78, node="n1"), location="node"))
    # the same signature on another node is another finding: it does not renew n1's hold
    d = m.update(_look(120.0, _finding("gpu_memory_leak", 0.7, node="n2"), location="node"))
    assert d.findings[0].where == {"node": "n2"} and d.findings[0].held_since == 120.0


def test_bad_input_is_refused_and_an_old_look_is_not_remembered() -> None:
    with pytest.raises(ConfigError, match="hold must be >= 0"):
        FindingMemory(hold=-1.0)
    with pytest.raises(ConfigError, match="lead must be"):
        FindingMemory(lead=0.0)
    with pytest.raises(ConfigError, match="grace must be between 0 and the hold"):
        FindingMemory(hold=16.0, grace=20.0)
    with pytest.raises(ConfigError, match="rate must be > 0"):
        hold_for(0.0)
    m = FindingMemory(hold=16.0)
    with pytest.raises(ConfigError, match="takes a Diagnosis"):
        m.update({"findings": []})  # type: ignore[arg-type]
    m.update(_look(100.0, _finding("gpu_oom", 0.82)))
    older = _look(90.0, _finding("anomaly_service", 0.3))
    assert m.update(older) is older  # returned as it is ...
    d = m.update(_look(101.0, _finding("anomaly_service", 0.3)))
    assert d.findings[0].signature == "gpu_oom"  # ... and the hold is intact
    m.reset()
    assert m.held is None


def test_the_hold_follows_the_time_scale() -> None:
    assert hold_for() == 120.0  # two of the shipped one-minute rate windows
    assert hold_for(8.0) == 16.0  # quick runs' 8 s
    assert FindingMemory().hold == 120.0


def test_look_back_takes_the_looks_a_live_memory_would_have_taken() -> None:
    asked: list[float] = []

    def at(t: float) -> Diagnosis:
        asked.append(t)
        return _look(t, _finding("gpu_memory_leak", 0.78)) if t < 190 else _look(t)

    d = look_back(at, 200.0, 40.0)
    assert asked == [160.0, 170.0, 180.0, 190.0, 200.0]
    assert d.findings[0].signature == "gpu_memory_leak" and d.findings[0].evidence_seen == 180.0
    asked.clear()
    assert look_back(at, 200.0, 0.0).findings == [] and asked == [200.0]
    with pytest.raises(ConfigError):
        look_back(at, 200.0, -5.0)


class _Failing:
    """The recorded store, whose queries naming ``names`` fail from ``after`` on."""

    def __init__(self, store: Any, names: set[str], after: float) -> None:
        self.store, self.names, self.after = store, names, after

    def query(self, expr: str, at: float | None = None) -> QueryResult:
        return self.store.query(expr, at)

    def query_range(self, expr: str, start: float, end: float, step: float) -> QueryResult:
        if end >= self.after and any(n in expr for n in self.names):
            raise BackendError("connection reset by peer")
        return self.store.query_range(expr, start, end, step)


@pytest.mark.slow
def test_a_recorded_fault_whose_evidence_queries_fail_mid_incident_stays_named() -> None:
    rec = next(r for r in load_recordings(RECORDINGS) if r.name == "gpu_oom@moderate")
    store = rec.store()
    t_base, t_fault = float(rec.label["t_baseline"]), float(rec.label["t_fault"])
    first = diagnose(store, end=t_fault + 5, window=max(15.0, 5 + t_fault - t_base), step=1.0)
    assert first.findings[0].signature == "gpu_oom"
    req = [e.expr for e in first.findings[0].evidence if e.role == "required"]
    names = {n for e in req for n in re.findall(r"[a-z_]+_(?:bytes|total|ratio)\b", e)}
    assert names, req
    failing = _Failing(store, names, after=t_fault + 7)
    m = FindingMemory(hold_for(8.0))
    for after in (5.0, 8.0, 11.0, 14.0):
        t = t_fault + after
        d = m.update(
            diagnose(failing, end=t, window=max(15.0, t - t_base), step=1.0, location=None)
        )
    top = d.findings[0]
    assert top.signature == "gpu_oom", [f.signature for f in d.findings]
    assert top.evidence_unseen_since == t_fault + 8.0
    assert any("failed" in u.why for u in d.unseen)
