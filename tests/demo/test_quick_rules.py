"""The compressed rule pack of quick runs (``QUICK_RULES``), on a real recorded run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aivitals.alerts import (
    AlertingRule,
    PackParams,
    RuleEngine,
    RuleGroup,
    default_pack,
    load_rules,
)
from aivitals.demo import FOR_SPANS_WINDOW, QUICK_RULES, for_floors, scale_for
from aivitals.errors import ConfigError
from aivitals.validate._record import load_recording
from tests._paths import FIXTURES, REPO

#: A quick event_loop_blocked case at 0.3 s a request (the loop past its capacity),
#: recorded while quick runs averaged the idle share over 4 s.
BLOCKED_LOOP = FIXTURES / "recordings" / "event-loop-blocked-quick" / "event_loop_blocked.json"


def _groups(params: dict[str, Any]) -> list[RuleGroup]:
    pack = default_pack(**params)
    return load_rules(scale_for(pack.text, 60.0))  # as Stack.pack_groups compresses it


def _alert(params: dict[str, Any], name: str) -> AlertingRule:
    (rule,) = [r for g in _groups(params) for r in g.alerting_rules if r.alert == name]
    return rule


def _held(params: dict[str, Any], name: str, *, step: float = 1.0) -> list[tuple[float, bool]]:
    """``(seconds after the fault, held)`` of alert ``name``'s condition, evaluated every
    ``step`` over the recording's fault phase."""
    groups = _groups(params)
    (rule,) = [r for g in groups for r in g.alerting_rules if r.alert == name]
    rec = load_recording(BLOCKED_LOOP)
    store, t_fault = rec.store(), float(rec.label["t_fault"])
    # the pack's recording rules, replayed: series recorded live keep their samples (a
    # rewrite is refused as out of order), series the recording predates are written
    records = [RuleGroup(g.name, g.interval, g.recording_rules) for g in groups]
    engine = RuleEngine(store, records)
    t = float(rec.label["t_baseline"])
    while t < float(rec.label["t_revert"]):
        engine.evaluate(t)
        t += step
    out = []
    t = t_fault
    while t < float(rec.label["t_revert"]):
        out.append((t - t_fault, bool(store.query(rule.expr, at=t).vector)))
        t += step
    return out


def _first_fire(params: dict[str, Any], name: str) -> float | None:
    """Seconds after the fault at which the condition has held for the alert's whole
    ``for:`` (None: never in the phase)."""
    for_ = _alert(params, name).for_
    held_since: float | None = None
    for t, held in _held(params, name):
        if held:
            held_since = t if held_since is None else held_since
            if t - held_since >= for_:
                return t
        else:
            held_since = None
    return None


def _restarts(params: dict[str, Any], name: str, until: float) -> int:
    """How often the condition stopped holding after it first held, within ``until`` s."""
    seq = [held for t, held in _held(params, name) if t <= until]
    start = seq.index(True) if True in seq else len(seq)
    return sum(1 for a, b in zip(seq[start:], seq[start + 1 :], strict=False) if a and not b)


def test_a_blocked_loops_bursts_do_not_restart_the_idle_alerts_for() -> None:
    rule = _alert(dict(QUICK_RULES), "LatencyHighWorkersIdle")
    assert rule.for_ == 2.0  # 2m / 60
    assert "[8s]" in rule.expr and QUICK_RULES["idle_window"] == "8s"
    fired = _first_fire(dict(QUICK_RULES), "LatencyHighWorkersIdle")
    assert fired is not None and fired <= 10.0, fired
    # over 4 samples a burst of the blocked loop's work reads as a busy pool and restarts
    # the for: (twice in the first 15 s here); over 8 it does not
    four = {**QUICK_RULES, "idle_window": "4s"}
    assert _restarts(four, "LatencyHighWorkersIdle", 15.0) >= 1
    assert _restarts(dict(QUICK_RULES), "LatencyHighWorkersIdle", 15.0) == 0
    later = _first_fire(four, "LatencyHighWorkersIdle")
    assert later is None or later > fired, (later, fired)


def test_the_idle_window_defaults_to_the_short_window_and_is_checked() -> None:
    assert PackParams().idle_window == PackParams().short_window == "1m"
    with pytest.raises(ConfigError, match="idle_window='20s' spans fewer than 4 scrapes"):
        PackParams(idle_window="20s")  # 15 s scrapes


def _pool_fires(window: str, busy: list[float]) -> float | None:
    """When quick runs' WorkerPoolSaturated (``saturation_window=window``) fires over a
    pool whose busy share is ``busy[i]`` at second i (None: never)."""
    from aivitals.tsdb import Store

    rule = _alert({**QUICK_RULES, "saturation_window": window}, "WorkerPoolSaturated")
    assert rule.for_ == 1.0  # 30s / 60, at least one evaluation
    store = Store(retention=10_000)
    labels = {"job": "demo", "pool": "model"}
    for i, v in enumerate(busy):
        store.append("pool:worker_pool_utilization:ratio", labels, v, 1000.0 + i)
    held_since: float | None = None
    for i in range(len(busy)):
        t = 1000.0 + i
        if store.query(rule.expr, at=t).vector:
            held_since = t if held_since is None else held_since
            if t - held_since >= rule.for_:
                return float(i)
        else:
            held_since = None
    return None


def test_a_healthy_burst_does_not_saturate_quick_runs_pool_and_a_stuck_pool_does() -> None:
    """Six scrapes in a row with both workers busy in a half-busy pool (a burst of a
    healthy trace near its peak) paged P0 over 4 samples (two evaluations, the 1 s for:);
    over quick runs' 8 they do not. A stuck pool
    (every worker busy from second 30 on, the worker_pool_saturated fault) fires 9 s in."""
    assert QUICK_RULES["saturation_window"] == "8s"
    burst = [0.5] * 30 + [1.0] * 6 + [0.5] * 30
    assert _pool_fires("4s", burst) is not None
    assert _pool_fires("8s", burst) is None
    stuck = [0.5] * 30 + [1.0] * 30
    fired = _pool_fires("8s", stuck)
    assert fired is not None and fired - 30 <= 10, fired
    assert PackParams().saturation_window == PackParams().short_window == "1m"
    with pytest.raises(ConfigError, match="saturation_window='20s' spans fewer than 4 scrapes"):
        PackParams(saturation_window="20s")


#: A 5-minute compressed soak whose CacheHitRatioDrop paged P1 at 267 s for one
#: evaluation of a 1 s ``for:`` (1 hit in 14 lookups of a 4 s window, a healthy Zipf
#: cache at x1.4 of the trace's rate).
BLIP_SOAK = FIXTURES / "recordings" / "soak-quick-cache-blip" / "soak-300s-quick.json"
#: A quick cache_stampede at the sweep's at-threshold severity (the corpus' tuning half):
#: the shortest run of the stampede's condition among the recorded severities.
STAMPEDE = REPO / "benchmarks" / "recordings" / "cache_stampede@threshold.json"


def _quick_cache_rule(*, floors: bool) -> AlertingRule:
    pack = default_pack(**QUICK_RULES)
    text = scale_for(pack.text, 60.0, floors=for_floors(pack.params) if floors else None)
    (rule,) = [
        r for g in load_rules(text) for r in g.alerting_rules if r.alert == "CacheHitRatioDrop"
    ]
    return rule


def _fires(rule: AlertingRule, label: Path, start: float, end: float) -> list[float]:
    """When ``rule`` fires over ``label``'s recording between ``start`` and ``end``
    (seconds into it), evaluated every second as quick runs' engine does."""
    rec = load_recording(label)
    store, t0 = rec.store(), float(rec.start)
    fired: list[float] = []
    held_since: float | None = None
    for i in range(int(start), int(end)):
        t = t0 + i
        if store.query(rule.expr, at=t).vector:
            held_since = t if held_since is None else held_since
            if t - held_since >= rule.for_ and (not fired or fired[-1] < held_since - t0):
                fired.append(t - t0)
        else:
            held_since = None
    return fired


def test_the_cache_drop_holds_a_whole_window_in_quick_runs_so_a_healthy_soak_stays_quiet() -> None:
    old, new = _quick_cache_rule(floors=False), _quick_cache_rule(floors=True)
    assert (old.for_, new.for_) == (1.0, 4.0)  # 1m / 60; the 4 s short window
    assert "[4s]" in str(default_pack(**QUICK_RULES).text) and QUICK_RULES["short_window"] == "4s"
    soak = load_recording(BLIP_SOAK)
    t0 = float(soak.start)
    span = (float(soak.label["t_baseline"]) - t0, float(soak.end) - t0)
    assert _fires(old, BLIP_SOAK, *span), "the soak's blip no longer pages the old for: 1s"
    assert _fires(new, BLIP_SOAK, *span) == []
    stampede = load_recording(STAMPEDE)
    fault = float(stampede.label["t_fault"]) - float(stampede.start)
    revert = float(stampede.label["t_revert"]) - float(stampede.start)
    fired = _fires(new, STAMPEDE, fault, revert)
    assert fired and fired[0] - fault <= 10.0, (fired, fault)


def test_a_for_floor_never_raises_the_shipped_for_and_leaves_other_rules_alone() -> None:
    pack = default_pack()
    plain = load_rules(scale_for(pack.text, 60.0))
    floored = load_rules(scale_for(pack.text, 60.0, floors={"CacheHitRatioDrop": 3600.0}))
    fors = {r.alert: r.for_ for g in plain for r in g.alerting_rules}
    got = {r.alert: r.for_ for g in floored for r in g.alerting_rules}
    assert got.pop("CacheHitRatioDrop") == 60.0  # the shipped 1m, not the hour asked
    fors.pop("CacheHitRatioDrop")
    assert got == fors
    assert for_floors(PackParams()) == {"CacheHitRatioDrop": 60.0}
    assert set(FOR_SPANS_WINDOW) <= set(pack.alert_names)


#: A quick event_loop_blocked case (SLA 0.19 s, calibrated) in which one inference of
#: ~0.5 s among the 9-14 of an 8 s window held the window's P99 (its maximum) over twice
#: the SLA for 7 evaluations, and the 2 s ``for:`` paged InferenceLatencyHigh (P1).
ONE_SLOW = (
    FIXTURES / "recordings" / "event-loop-blocked-one-slow-inference" / "event_loop_blocked.json"
)
#: A quick gpu_contention (x8 on every inference step): every window slow.
CONTENTION = REPO / "benchmarks" / "recordings" / "gpu_contention.json"


def _inference_rule(sla: float) -> AlertingRule:
    return _alert({**QUICK_RULES, "sla_seconds": sla}, "InferenceLatencyHigh")


def test_one_slow_inference_in_a_sparse_window_does_not_page_and_a_slowdown_does() -> None:
    rule = _inference_rule(0.19)
    assert rule.for_ == 2.0
    rec = load_recording(ONE_SLOW)
    t0 = float(rec.start)
    fault = float(rec.label["t_fault"]) - t0
    revert = float(rec.label["t_revert"]) - t0
    # the hazard is in the data: the window's P99 alone held over 2 x SLA past the for:
    p99_only = replace(rule, expr="job_model:model_inference_time_seconds:p99_8s > 2 * 0.19")
    assert _fires(p99_only, ONE_SLOW, fault, revert + 10), "the recording no longer holds it"
    assert _fires(rule, ONE_SLOW, fault, revert + 10) == []
    # a window that is slow because every inference is slow is slow in the window before
    # it too: gpu_contention still pages, one window (8 s) later than the P99 alone
    contention = load_recording(CONTENTION)
    c0 = float(contention.start)
    c_fault = float(contention.label["t_fault"]) - c0
    c_revert = float(contention.label["t_revert"]) - c0
    fired = _fires(_inference_rule(0.25), CONTENTION, c_fault, c_revert)
    assert fired and fired[0] - c_fault <= 15.0, (fired, c_fault)
