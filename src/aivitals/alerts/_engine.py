"""The embedded rule engine: Prometheus rule semantics over any ``Backend``.

It follows Prometheus' rules/alerting.go step for step, so the same rule file
gives the same alerts here and in Prometheus at the same evaluation times:

* an expression result creates a *pending* alert (``active_at`` = now); it turns
  *firing* once ``now - active_at >= for``; with ``for: 0`` in the same evaluation;
* when the result no longer holds the alert, a pending alert is dropped and a
  firing one *resolved*; ``keep_firing_for`` keeps a firing alert for that long
  after its condition last held;
* resolved alerts stay known for 15 minutes so notifiers can report the resolution;
* labels and annotations are templates over ``$labels`` and ``$value``;
* recording rules run in group order, and when the backend can store samples
  (the embedded ``Store``) their results, ``ALERTS`` and ``ALERTS_FOR_STATE`` are
  written back so later rules, dashboards and the diagnosis can query them.

A failing query (bad data, a backend down) marks the rule unhealthy and leaves its
alerts as they were, like Prometheus; evaluation of the other rules goes on.
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry

from .. import signals
from ..errors import AivitalsError
from ..tsdb import Backend, InstantSample
from ._rules import AlertingRule, RecordingRule, RuleGroup, RulePack
from ._template import Template

__all__ = ["AlertEvent", "AlertState", "Notifier", "RuleEngine", "RuleHealth", "api_alert"]

log = logging.getLogger("aivitals.alerts")

AlertState = Literal["pending", "firing", "resolved"]
#: a series' identity: its labels, sorted
_LabelKey = tuple[tuple[str, str], ...]

#: Prometheus's staleness marker: a NaN with this exact bit pattern.
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
_DUPLICATE = "vector contains metrics with the same labelset after applying alert labels"
#: How long a resolved alert is kept (and re-sent as resolved), as in Prometheus.
RESOLVED_RETENTION = 15 * 60.0
#: Go's zero time: what Prometheus's API writes for a rule never evaluated.
_ZERO_TIME = "0001-01-01T00:00:00Z"


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One alert at one moment: its identity, state and the times of its transitions.

    ``active_at`` is when its condition first held, ``fired_at`` when it passed
    its ``for`` duration, ``resolved_at`` when it stopped. ``valid_until`` is the
    ``endsAt`` a notifier reports for a firing alert (Prometheus: 4 resend periods).
    """

    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: AlertState
    active_at: float
    fired_at: float | None
    resolved_at: float | None
    value: float
    valid_until: float | None = None
    group: str = ""

    @property
    def at(self) -> float:
        """The time of the transition this event records."""
        if self.state == "resolved" and self.resolved_at is not None:
            return self.resolved_at
        if self.state == "firing" and self.fired_at is not None:
            return self.fired_at
        return self.active_at

    @property
    def fingerprint(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))

    def to_dict(self) -> dict[str, object]:
        return {
            "alertname": self.alertname,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "state": self.state,
            "active_at": self.active_at,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
            "value": None if math.isnan(self.value) else self.value,
        }


def _rfc3339(ts: float | None) -> str:
    if ts is None:
        return _ZERO_TIME
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _go_exp(v: float) -> str:
    """``strconv.FormatFloat(v, 'e', -1, 64)``: how Prometheus's API writes an alert's value."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0e+00"
    sign, digits, exp = Decimal(repr(v)).normalize().as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits))
    power = len(text) + exp - 1
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"


def api_alert(e: AlertEvent) -> dict[str, object]:
    """An alert as Prometheus's ``/api/v1/alerts`` writes it (labels, annotations, state,
    activeAt, value), with the engine's epoch times beside it: ``aivitals alerts``, the
    console and the diagnosis read ``alertname``, ``active_at``, ``fired_at``."""
    return {
        "labels": dict(e.labels),
        "annotations": dict(e.annotations),
        "state": e.state,
        "activeAt": _rfc3339(e.active_at),
        "value": _go_exp(e.value),
        "alertname": e.alertname,
        "active_at": e.active_at,
        "fired_at": e.fired_at,
        "resolved_at": e.resolved_at,
    }


@runtime_checkable
class Notifier(Protocol):
    """Receives the alerts to send after an evaluation; must return at once."""

    def notify(self, alerts: Sequence[AlertEvent]) -> None: ...


@runtime_checkable
class _Appendable(Protocol):
    def append(
        self, name: str, labels: Mapping[str, str], value: float, timestamp: float
    ) -> None: ...


@dataclass
class RuleHealth:
    """The outcome of a rule's last evaluation (``ok`` or the error text)."""

    rule: str
    group: str
    last_evaluation: float | None = None
    duration: float = 0.0
    error: str | None = None
    samples: int = 0


@dataclass
class _Alert:
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float
    active_at: float
    state: str = "pending"  # pending, firing or inactive (resolved)
    fired_at: float | None = None
    resolved_at: float | None = None
    keep_firing_since: float | None = None
    last_sent_at: float | None = None
    valid_until: float | None = None


@dataclass
class _RuleState:
    rule: AlertingRule
    active: dict[frozenset[tuple[str, str]], _Alert] = field(default_factory=dict)
    written: set[tuple[str, frozenset[tuple[str, str]]]] = field(default_factory=set)


def _event(a: _Alert, rule: AlertingRule, state: AlertState) -> AlertEvent:
    return AlertEvent(
        alertname=rule.alert,
        labels=dict(a.labels),
        annotations=dict(a.annotations),
        state=state,
        active_at=a.active_at,
        fired_at=a.fired_at,
        resolved_at=a.resolved_at,
        value=a.value,
        valid_until=a.valid_until,
        group=rule.group,
    )


def _public_state(a: _Alert) -> AlertState:
    return "resolved" if a.state == "inactive" else "firing" if a.state == "firing" else "pending"


class RuleEngine:
    """Evaluates rule groups on a ``Backend`` with Prometheus semantics.

    **Usage**::

        engine = RuleEngine(store, default_pack().groups, notifiers=[WebhookNotifier(url)])
        engine.evaluate(time.time())          # or engine.attach(agent) to run on its clock
        engine.active()                       # pending and firing alerts
        engine.history(start=t0)              # every transition since t0

    ``resend_delay`` is how often firing alerts are re-sent to notifiers (1m, as
    Prometheus' ``--rules.alert.resend-delay``); ``history_limit`` bounds the kept
    transitions; ``write_back`` stores recorded series and ``ALERTS`` when the backend
    can append samples (None: whenever it can). ``files`` names the file each group came
    from (group name -> path), as ``/api/v1/rules`` reports it.
    """

    def __init__(
        self,
        backend: Backend,
        groups: Sequence[RuleGroup] | RulePack,
        *,
        notifiers: Iterable[Notifier] = (),
        resend_delay: float = 60.0,
        history_limit: int = 10_000,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
        write_back: bool | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        files: Mapping[str, str] | None = None,
    ) -> None:
        self.backend = backend
        self.groups: tuple[RuleGroup, ...] = tuple(
            groups.groups if isinstance(groups, RulePack) else groups
        )
        self.notifiers = list(notifiers)
        self.resend_delay = resend_delay
        self.external_labels = dict(external_labels or {})
        self.external_url = external_url
        can_write = isinstance(backend, _Appendable)
        self._write = can_write if write_back is None else (write_back and can_write)
        self._clock = clock
        self._lock = threading.RLock()
        #: per recording rule, the series it wrote at its last evaluation
        self._recorded: dict[
            tuple[str, str], dict[tuple[tuple[str, str], ...], dict[str, str]]
        ] = {}
        self._states: dict[tuple[str, str], _RuleState] = {
            (g.name, r.alert): _RuleState(r) for g in self.groups for r in g.alerting_rules
        }
        self._health: dict[tuple[str, str], RuleHealth] = {}
        self._history: deque[AlertEvent] = deque(maxlen=history_limit)
        self._last_eval: dict[str, float] = {}
        self._eval_took: dict[str, float] = {}
        self.files = dict(files or {})
        #: the period of a group without its own interval (set by ``attach``)
        self.default_interval = 15.0
        self.write_errors = 0
        self._gauge_keys: set[tuple[str, str, str]] = set()
        self._firing_gauge = signals.metric("aivitals_alerts_firing", registry=registry)
        self._eval_gauge = signals.metric("aivitals_rule_evaluation_seconds", registry=registry)

    # --- evaluation -----------------------------------------------------------------

    def evaluate(self, at: float | None = None) -> list[AlertEvent]:
        """Evaluate every group at ``at`` (epoch seconds; None: now).

        Returns the alerts pending or firing after this evaluation and those
        resolved by it. Notifiers are handed what needs sending and never block.
        """
        ts = self._clock() if at is None else at
        out: list[AlertEvent] = []
        for group in self.groups:
            out.extend(self.evaluate_group(group.name, ts))
        return out

    def evaluate_group(self, name: str, at: float | None = None) -> list[AlertEvent]:
        """Evaluate one group; the agent schedules each group at its own interval."""
        group = next((g for g in self.groups if g.name == name), None)
        if group is None:
            raise AivitalsError(f"no rule group named {name!r}")
        ts = self._clock() if at is None else at
        started = time.perf_counter()
        out: list[AlertEvent] = []
        to_send: list[AlertEvent] = []
        for rule in group.rules:
            # Queried outside the lock: a slow backend never blocks readers of the state.
            samples = self._query(rule, ts)
            if isinstance(rule, RecordingRule):
                self._record(rule, samples, ts, group.limit)
                continue
            with self._lock:
                events, send = self._alert(rule, samples, ts, group)
            out.extend(events)
            to_send.extend(send)
        took = time.perf_counter() - started
        with self._lock:
            self._last_eval[name] = ts
            self._eval_took[name] = took
            self._update_firing_gauge()
        self._eval_gauge.labels(group=name).set(took)  # type: ignore[attr-defined]
        if to_send:
            for notifier in self.notifiers:
                try:
                    notifier.notify(to_send)
                except Exception:  # a notifier must never stop evaluation
                    log.exception("notifier %r failed", notifier)
        return out

    def _set_health(self, rule: RecordingRule | AlertingRule, **values: object) -> None:
        with self._lock:
            health = self._health.setdefault(
                (rule.group, rule.name), RuleHealth(rule.name, rule.group)
            )
            for key, value in values.items():
                setattr(health, key, value)

    def _query(self, rule: RecordingRule | AlertingRule, ts: float) -> list[InstantSample] | None:
        started = time.perf_counter()
        try:
            result = self.backend.query(rule.expr, ts)
        except Exception as exc:  # one broken rule or backend hiccup never stops the others
            if not isinstance(exc, AivitalsError):
                log.exception("rule %s: unexpected error from the backend", rule.name)
            else:
                log.warning("rule %s: %s", rule.name, exc)
            self._set_health(
                rule, last_evaluation=ts, duration=time.perf_counter() - started, error=str(exc)
            )
            return None
        samples: list[InstantSample] | None
        error = None
        if result.type == "scalar":
            value = result.scalar[1] if result.scalar else math.nan
            samples = [InstantSample({}, value, ts)]
        elif result.type == "vector":
            samples = list(result.vector)
        else:
            samples, error = None, f"expression gave a {result.type}, not a vector"
        self._set_health(
            rule,
            last_evaluation=ts,
            duration=time.perf_counter() - started,
            error=error,
            samples=len(samples or ()),
        )
        return samples

    def _record(
        self, rule: RecordingRule, samples: list[InstantSample] | None, ts: float, limit: int
    ) -> None:
        if samples is None or not self._write:
            return
        if limit and len(samples) > limit:
            self._set_health(rule, error=f"exceeded limit of {limit} with {len(samples)} series")
            return
        written: dict[_LabelKey, dict[str, str]] = {}
        for s in samples:
            labels = {k: v for k, v in s.labels.items() if k != "__name__"}
            labels.update(rule.labels)
            self._append(rule.record, labels, s.value, ts)
            written[tuple(sorted(labels.items()))] = labels
        # Like Prometheus, end a recorded series that the rule no longer returns with a
        # staleness marker. Without it the last value stayed visible for the 5-minute
        # lookback, and an alert on the recorded series (QueueWaitHigh on its P99) kept
        # firing long after the condition's own series had gone.
        key = (rule.group, rule.record)
        for gone, labels in self._recorded.get(key, {}).items():
            if gone not in written:
                self._append(rule.record, labels, STALE_NAN, ts)
        self._recorded[key] = written

    def _append(self, name: str, labels: Mapping[str, str], value: float, ts: float) -> None:
        assert isinstance(self.backend, _Appendable)
        try:
            self.backend.append(name, labels, value, ts)
        except AivitalsError as exc:  # a re-evaluation of the same instant is a duplicate
            self.write_errors += 1
            log.debug("write-back of %s refused: %s", name, exc)

    def _alert(
        self, rule: AlertingRule, samples: list[InstantSample] | None, ts: float, group: RuleGroup
    ) -> tuple[list[AlertEvent], list[AlertEvent]]:
        state = self._states[(group.name, rule.alert)]
        fresh = None if samples is None else self._expand(rule, samples, ts)
        if fresh is not None:
            self._transition(state, fresh, ts)
            active = sum(1 for a in state.active.values() if a.state != "inactive")
            if group.limit and active > group.limit:
                # Prometheus drops every alert of a rule past its group's limit.
                state.active.clear()
                self._set_health(
                    rule, error=f"exceeded limit of {group.limit} with {active} alerts"
                )
                fresh = None
        # On a failed evaluation nothing is written, as Prometheus writes no samples then.
        events = self._collect(state, ts, write=fresh is not None)
        return events, self._due(state, ts)

    def _expand(
        self, rule: AlertingRule, samples: list[InstantSample], ts: float
    ) -> dict[frozenset[tuple[str, str]], _Alert] | None:
        fresh: dict[frozenset[tuple[str, str]], _Alert] = {}
        for s in samples:

            def render(tmpl: Template, s: InstantSample = s) -> str:
                return tmpl.render(
                    value=s.value,
                    labels=s.labels,
                    external_labels=self.external_labels,
                    external_url=self.external_url,
                )

            labels = {k: v for k, v in s.labels.items() if k != "__name__"}
            labels.update({key: render(tmpl) for key, tmpl in rule.labels.items()})
            labels = {k: v for k, v in labels.items() if v != ""}
            labels["alertname"] = rule.alert
            annotations = {k: render(t) for k, t in rule.annotations.items()}
            key = frozenset(labels.items())
            if key in fresh:
                self._set_health(rule, error=_DUPLICATE)
                return None
            fresh[key] = _Alert(labels, annotations, s.value, active_at=ts)
        return fresh

    def _transition(
        self, state: _RuleState, fresh: dict[frozenset[tuple[str, str]], _Alert], ts: float
    ) -> None:
        rule = state.rule
        for key, alert in fresh.items():
            known = state.active.get(key)
            if known is not None and known.state != "inactive":
                known.value, known.annotations = alert.value, alert.annotations
                continue
            state.active[key] = alert
            self._history.append(_event(alert, rule, "pending"))
        for key, alert in list(state.active.items()):
            if key not in fresh:
                keep = False
                if alert.state == "firing" and rule.keep_firing_for > 0:
                    if alert.keep_firing_since is None:
                        alert.keep_firing_since = ts
                    keep = ts - alert.keep_firing_since < rule.keep_firing_for
                retired = (
                    alert.resolved_at is not None and ts - alert.resolved_at > RESOLVED_RETENTION
                )
                if alert.state == "pending" or retired:
                    del state.active[key]
                if alert.state != "inactive" and not keep:
                    was_firing = alert.state == "firing"
                    alert.state, alert.resolved_at = "inactive", ts
                    if was_firing:
                        self._history.append(_event(alert, rule, "resolved"))
                if not keep:
                    continue
            else:
                alert.keep_firing_since = None
            if alert.state == "pending" and ts - alert.active_at >= rule.for_:
                alert.state, alert.fired_at = "firing", ts
                self._history.append(_event(alert, rule, "firing"))

    def _collect(self, state: _RuleState, ts: float, *, write: bool) -> list[AlertEvent]:
        rule = state.rule
        events: list[AlertEvent] = []
        written: set[tuple[str, frozenset[tuple[str, str]]]] = set()
        for alert in state.active.values():
            if alert.state == "inactive":
                if alert.resolved_at == ts:
                    events.append(_event(alert, rule, "resolved"))
                continue
            events.append(_event(alert, rule, _public_state(alert)))
            if self._write and write:
                alerts_labels = {**alert.labels, "alertstate": alert.state}
                self._append("ALERTS", alerts_labels, 1.0, ts)
                self._append("ALERTS_FOR_STATE", alert.labels, alert.active_at, ts)
                written.add(("ALERTS", frozenset(alerts_labels.items())))
                written.add(("ALERTS_FOR_STATE", frozenset(alert.labels.items())))
        if self._write and write:
            # Like Prometheus, end the series of alerts that went away with a staleness
            # marker, so ALERTS stops answering at once instead of 5 minutes later.
            for name, labels in state.written - written:
                self._append(name, dict(labels), STALE_NAN, ts)
            state.written = written
        return events

    def _due(self, state: _RuleState, ts: float) -> list[AlertEvent]:
        """Alerts to hand the notifiers now (Prometheus' needsSending)."""
        group = next(g for g in self.groups if g.name == state.rule.group)
        interval = group.interval or self.resend_delay
        due: list[AlertEvent] = []
        for alert in state.active.values():
            if alert.state == "pending":
                continue
            resolved_since_sent = alert.resolved_at is not None and (
                alert.last_sent_at is None or alert.resolved_at > alert.last_sent_at
            )
            stale = alert.last_sent_at is None or alert.last_sent_at + self.resend_delay < ts
            if not (resolved_since_sent or stale):
                continue
            # Two missed evaluations or sends may pass before Alertmanager expires it.
            alert.valid_until = ts + 4 * max(interval, self.resend_delay)
            alert.last_sent_at = ts
            due.append(_event(alert, state.rule, _public_state(alert)))
        return due

    def _update_firing_gauge(self) -> None:
        counts = dict.fromkeys(self._gauge_keys, 0)
        for st in self._states.values():
            for alert in st.active.values():
                if alert.state == "firing":
                    labels = alert.labels
                    key = (st.rule.alert, labels.get("severity", ""), labels.get("layer", ""))
                    counts[key] = counts.get(key, 0) + 1
        self._gauge_keys = set(counts)
        for (name, severity, layer), n in counts.items():
            self._firing_gauge.labels(alertname=name, severity=severity, layer=layer).set(n)  # type: ignore[attr-defined]

    # --- reading ----------------------------------------------------------------------

    def active(self) -> list[AlertEvent]:
        """Pending and firing alerts now, firing first, then by name."""
        with self._lock:
            out = [
                _event(a, st.rule, _public_state(a))
                for st in self._states.values()
                for a in st.active.values()
                if a.state != "inactive"
            ]
        return sorted(out, key=lambda e: (e.state != "firing", e.alertname, e.fingerprint))

    def firing(self) -> list[AlertEvent]:
        return [e for e in self.active() if e.state == "firing"]

    def history(self, start: float | None = None, end: float | None = None) -> list[AlertEvent]:
        """Every transition (pending, firing, resolved) whose time is within [start, end]."""
        with self._lock:
            events = list(self._history)
        return [
            e for e in events if (start is None or e.at >= start) and (end is None or e.at <= end)
        ]

    def health(self) -> list[RuleHealth]:
        with self._lock:
            return [replace(h) for h in self._health.values()]

    def snapshot(self) -> dict[str, object]:
        """What ``/api/v1/alerts`` serves: active alerts and recent history, JSON-ready."""
        return {
            "alerts": [api_alert(e) for e in self.active()],
            "history": [e.to_dict() for e in self.history()[-200:]],
            "rules": [
                {
                    "rule": h.rule,
                    "group": h.group,
                    "health": "ok" if h.error is None else "err",
                    "error": h.error,
                    "last_evaluation": h.last_evaluation,
                }
                for h in self.health()
            ],
        }

    def rules_json(self) -> dict[str, object]:
        """What ``/api/v1/rules`` serves: every group and rule with its state, health and
        alerts, in Prometheus's shape (durations in seconds, times in RFC 3339)."""
        with self._lock:
            health = {(h.group, h.rule): replace(h) for h in self._health.values()}
            alerts = {
                key: [
                    api_alert(_event(a, st.rule, _public_state(a)))
                    for a in st.active.values()
                    if a.state != "inactive"
                ]
                for key, st in self._states.items()
            }
            last, took = dict(self._last_eval), dict(self._eval_took)
        groups = []
        for g in self.groups:
            rules = [_rule_json(r, health.get((g.name, r.name)), alerts) for r in g.rules]
            groups.append(
                {
                    "name": g.name,
                    "file": self.files.get(g.name, ""),
                    "rules": rules,
                    "interval": g.interval or self.default_interval,
                    "limit": g.limit,
                    "evaluationTime": took.get(g.name, 0.0),
                    "lastEvaluation": _rfc3339(last.get(g.name)),
                }
            )
        return {"groups": groups}

    # --- scheduling -------------------------------------------------------------------

    def attach(self, agent: _Scheduler, *, default_interval: float = 15.0) -> None:
        """Run every group on the agent's clock and serve alerts (and, where the agent
        takes it, the rules) from its HTTP API."""
        self.default_interval = default_interval
        for group in self.groups:
            interval = group.interval or default_interval
            agent.add_periodic(f"rules:{group.name}", interval, self._job(group.name))
        agent.set_alerts_provider(self.snapshot)
        set_rules = getattr(agent, "set_rules_provider", None)
        if callable(set_rules):
            set_rules(self.rules_json)

    def _job(self, name: str) -> Callable[[float], None]:
        def run(ts: float) -> None:
            try:
                self.evaluate_group(name, ts)
            except Exception:  # the agent's loop must survive a broken rule group
                log.exception("evaluation of rule group %s failed", name)

        return run


class _Scheduler(Protocol):
    def add_periodic(self, name: str, interval: float, fn: Callable[[float], None]) -> None: ...

    def set_alerts_provider(self, fn: Callable[[], object]) -> None: ...


def _rule_json(
    rule: AlertingRule | RecordingRule,
    health: RuleHealth | None,
    alerts: Mapping[tuple[str, str], list[dict[str, object]]],
) -> dict[str, object]:
    """One rule of ``/api/v1/rules``: Prometheus's AlertingRule or RecordingRule."""
    status: dict[str, object] = {
        "health": "unknown" if health is None else "ok" if health.error is None else "err",
        "lastError": "" if health is None or health.error is None else health.error,
        "evaluationTime": 0.0 if health is None else health.duration,
        "lastEvaluation": _rfc3339(None if health is None else health.last_evaluation),
    }
    if isinstance(rule, RecordingRule):
        return {
            "name": rule.record,
            "query": rule.expr,
            "labels": dict(rule.labels),
            **status,
            "type": "recording",
        }
    active = alerts.get((rule.group, rule.alert), [])
    states = {a["state"] for a in active}
    return {
        "state": "firing" if "firing" in states else "pending" if states else "inactive",
        "name": rule.alert,
        "query": rule.expr,
        "duration": rule.for_,
        "keepFiringFor": rule.keep_firing_for,
        "labels": {k: t.source for k, t in rule.labels.items()},
        "annotations": {k: t.source for k, t in rule.annotations.items()},
        "alerts": active,
        **status,
        "type": "alerting",
    }
