"""Where the console's data comes from: an agent in this process, or a server over HTTP.

A ``Source`` gives the console a ``Backend`` for PromQL, the alerts (active
and recent, in one shape whatever the server), the diagnosis (the latest, or
of a chosen window) and the alert rules as loaded (for thresholds). Both
kinds only read.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import BackendError, ConfigError

if TYPE_CHECKING:
    from ..tsdb import RemoteConnection

__all__ = [
    "AgentSource",
    "RemoteSource",
    "Source",
    "chart_diagnosis",
    "evidence_chart",
    "normalize_alerts",
    "rule_thresholds",
]

#: The longest window "diagnose this window" accepts (the agent keeps 1-3 h; Prometheus more).
MAX_DIAGNOSIS_WINDOW = 86400.0
#: The latest diagnosis of a Prometheus (which has no diagnosis endpoint) covers this.
LATEST_WINDOW = 900.0
_COMPARISONS = {">", "<", ">=", "<="}


class Source(Protocol):
    kind: str
    url: str
    backend: Any
    tick: float

    def alerts(self) -> dict[str, Any]: ...

    def diagnosis(self, start: float | None, end: float | None) -> dict[str, Any]: ...

    def rules(self) -> dict[str, dict[str, Any]]: ...

    def alert_objects(self, start: float, end: float) -> list[Any]: ...


# --- thresholds from rule expressions ------------------------------------------------------
def _constant(node: Any) -> float | None:
    import promql_parser as pp

    if isinstance(node, pp.NumberLiteral):
        return float(node.val)
    if isinstance(node, pp.ParenExpr):
        return _constant(node.expr)
    if isinstance(node, pp.BinaryExpr):
        a, b = _constant(node.lhs), _constant(node.rhs)
        if a is None or b is None:
            return None
        op = str(node.op)
        ops: dict[str, Callable[[float, float], float]] = {
            "+": lambda x, y: x + y,
            "-": lambda x, y: x - y,
            "*": lambda x, y: x * y,
            "/": lambda x, y: x / y if y else math.nan,
        }
        return ops[op](a, b) if op in ops else None
    return None


def expr_threshold(expr: str) -> tuple[str, float] | None:
    """The first ``<vector> <op> <constant>`` of ``expr`` (left of any ``and``/``unless``/
    ``or``: an ``or`` of two sources of one quantity compares both to the same limit).

    >>> expr_threshold("queue_length > 20")
    ('>', 20.0)
    >>> expr_threshold("p99 > 2 * 1 and on () (x > 0)")
    ('>', 2.0)
    >>> expr_threshold('queue_length > 20 or label_replace(q, "a", "$1", "b", "(.+)") > 20')
    ('>', 20.0)
    """
    import promql_parser as pp

    try:
        node: Any = pp.parse(expr)
    except (ValueError, SyntaxError, TypeError):
        return None
    for _ in range(32):  # rule expressions are shallow; bounded walk
        while isinstance(node, pp.ParenExpr):
            node = node.expr
        if not isinstance(node, pp.BinaryExpr):
            return None
        op = str(node.op)
        if op in ("and", "unless", "or"):
            node = node.lhs
            continue
        if op in _COMPARISONS:
            value = _constant(node.rhs)
            return None if value is None or not math.isfinite(value) else (op, value)
        return None
    return None


def evidence_chart(expr: str, vitals: Mapping[str, str]) -> dict[str, Any]:
    """What to chart for an evidence expression: the series under its comparison.

    ``deriv(m[1m]) > 2e6`` charts ``deriv(m[1m])`` with a line at 2e6 (the
    comparison alone would show only the points where it held); a vital's
    name charts the vital's expression.

    >>> evidence_chart("deriv(m[1m]) > 2000000", {})["threshold"]
    {'op': '>', 'value': 2000000.0}
    """
    import promql_parser as pp

    if expr in vitals:
        return {"expr": vitals[expr], "threshold": None}
    try:
        node: Any = pp.parse(expr)
    except (ValueError, SyntaxError, TypeError):
        return {"expr": expr, "threshold": None}
    for _ in range(32):
        while isinstance(node, pp.ParenExpr):
            node = node.expr
        if not isinstance(node, pp.BinaryExpr):
            break
        op = str(node.op)
        if op in ("and", "unless"):
            node = node.lhs
            continue
        if op in _COMPARISONS:
            value = _constant(node.rhs)
            if value is not None and math.isfinite(value):
                return {"expr": str(node.lhs), "threshold": {"op": op, "value": value}}
        break
    return {"expr": expr, "threshold": None}


def chart_diagnosis(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a diagnosis as JSON) with a ``chart`` on every evidence item."""
    from ..diagnose import VITALS

    vitals = {name: expr.replace("${rate}", "$W") for name, _, expr in VITALS}
    for f in data.get("findings") or []:
        for e in f.get("evidence") or []:
            if isinstance(e, dict) and isinstance(e.get("expr"), str):
                e["chart"] = evidence_chart(e["expr"], vitals)
    return data


def rule_thresholds(
    rules: Iterable[tuple[str, str, Mapping[str, str]]],
) -> dict[str, dict[str, Any]]:
    """``alertname -> {op, value, expr, severity, layer}`` from ``(name, expr, labels)``."""
    out: dict[str, dict[str, Any]] = {}
    for name, expr, labels in rules:
        found = expr_threshold(expr)
        out[name] = {
            "op": None if found is None else found[0],
            "value": None if found is None else found[1],
            "expr": expr,
            "severity": labels.get("severity", ""),
            "layer": labels.get("layer", ""),
        }
    return out


def _pack_rules(groups: Iterable[Any]) -> dict[str, dict[str, Any]]:
    rows = []
    for g in groups:
        for r in g.alerting_rules:
            labels = {k: getattr(v, "source", str(v)) for k, v in r.labels.items()}
            rows.append((r.alert, r.expr, labels))
    return rule_thresholds(rows)


def _default_rules() -> dict[str, dict[str, Any]]:
    from ..alerts import default_pack

    return _pack_rules(default_pack().groups)


# --- alerts in one shape -------------------------------------------------------------------
def _epoch(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _alert(raw: Mapping[str, Any], rules: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    labels = {str(k): str(v) for k, v in dict(raw.get("labels") or {}).items()}
    annotations = {str(k): str(v) for k, v in dict(raw.get("annotations") or {}).items()}
    name = str(raw.get("alertname") or labels.get("alertname") or "?")
    rule = rules.get(name, {})
    return {
        "alertname": name,
        "state": str(raw.get("state", "")),
        "severity": labels.get("severity") or rule.get("severity", ""),
        "layer": labels.get("layer") or rule.get("layer", ""),
        "labels": labels,
        "annotations": annotations,
        "active_at": _epoch(raw.get("active_at", raw.get("activeAt"))),
        "fired_at": _epoch(raw.get("fired_at")),
        "resolved_at": _epoch(raw.get("resolved_at")),
        "value": _number(raw.get("value")),
        "threshold": (
            None
            if rule.get("value") is None
            else {"op": rule["op"], "value": rule["value"], "expr": rule.get("expr", "")}
        ),
    }


def normalize_alerts(data: Any, rules: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The agent's alert snapshot or Prometheus's ``/api/v1/alerts`` data, in one shape."""
    if isinstance(data, Mapping):
        active = data.get("alerts") or []
        history = data.get("history") or []
    else:
        active, history = data or [], []
    ok = [a for a in active if isinstance(a, Mapping)]
    return {
        "alerts": [_alert(a, rules) for a in ok],
        "history": [_alert(a, rules) for a in history if isinstance(a, Mapping)][-200:],
    }


def _within(a: Mapping[str, Any], start: float, end: float) -> bool:
    at = a["fired_at"] or a["active_at"]
    return at is not None and start <= at <= end


def _objects(alerts: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Alert dicts as the attribute objects ``diagnose`` reads."""
    return [
        SimpleNamespace(
            alertname=a["alertname"],
            labels=a["labels"],
            state=a["state"],
            active_at=a["active_at"],
            fired_at=a["fired_at"],
        )
        for a in alerts
        if a.get("active_at") is not None
    ]


class _Cached:
    """One computation at a time per key, its answer kept ``ttl`` seconds.

    The console polls; a slow diagnosis must not be started again by every
    poll that arrives while it runs.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._store: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        with self._lock:  # serialises computations: a second caller waits, then hits
            hit = self._store.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl:
                cached: dict[str, Any] = hit[1]
                return cached
            value = compute()
            if len(self._store) > 32:
                self._store.clear()
            self._store[key] = (time.monotonic(), value)
            return value


def _check_window(start: float, end: float) -> None:
    if not (math.isfinite(start) and math.isfinite(end)):
        raise ConfigError("diagnosis window: start and end must be finite")
    if end <= start:
        raise ConfigError("diagnosis window: end must be after start")
    if end - start > MAX_DIAGNOSIS_WINDOW:
        raise ConfigError(
            f"diagnosis window of {end - start:.0f} s is over the "
            f"{MAX_DIAGNOSIS_WINDOW:.0f} s limit"
        )


def _run_diagnosis(
    backend: Any, start: float, end: float, alerts: list[Any], events: Any, hold: float = 0.0
) -> Any:
    """The diagnosis of ``[start, end]``; with ``hold``, as a memory that had looked over
    the hold period before ``end`` would give it (``look_back``)."""
    from ..diagnose import diagnose, look_back

    span = end - start
    step = max(1.0, math.ceil(span / 600.0))

    def at(t: float) -> Any:
        return diagnose(backend, end=t, window=span, step=step, alerts=alerts, events=events)

    return look_back(at, end, hold)


def _memory() -> Any:
    """The latest diagnosis's memory: the page's refreshes are successive looks at one
    service, so a finding that led keeps leading until its evidence has been gone for the
    hold period (two minutes: the sources the console reads run at the shipped time scale)."""
    from ..diagnose import FindingMemory

    return FindingMemory()


def _hold() -> float:
    from ..diagnose import hold_for

    return hold_for()


def _as_dict(d: Any) -> dict[str, Any]:
    import json

    if hasattr(d, "to_json"):
        out: dict[str, Any] = json.loads(d.to_json(indent=None))
        return out
    if isinstance(d, str | bytes):
        out = json.loads(d)
        return out
    return dict(d)


class AgentSource:
    """The console of an agent in this process: its store, alert engine and diagnosis."""

    kind = "agent"

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.url = "(this agent)"
        cfg = agent.config
        self.tick = float(min(cfg.interval, cfg.scrape_interval) if cfg.scrape else cfg.interval)
        self._cache = _Cached(ttl=max(2.0, self.tick))
        self._rules: dict[str, dict[str, Any]] | None = None
        self._memory = _memory()

    @property
    def backend(self) -> Any:
        return self.agent.store

    def _snapshot(self) -> Any:
        provider = self.agent.alerts_provider
        if provider is None:
            return None
        data = provider()
        return data.to_dict() if hasattr(data, "to_dict") else data

    def alerts(self) -> dict[str, Any]:
        data = self._snapshot()
        if data is None:
            return {"alerts": [], "history": [], "note": "no alert rules run in this agent"}
        if not isinstance(data, Mapping):
            data = {"alerts": [_alert_attrs(a) for a in data]}
        return normalize_alerts(data, self.rules())

    def alert_objects(self, start: float, end: float) -> list[Any]:
        hist = self.alerts()["history"]
        return _objects([a for a in hist if _within(a, start, end)])

    def rules(self) -> dict[str, dict[str, Any]]:
        if self._rules is None:
            # The engine behind the alerts provider holds the rules as loaded (with
            # the parameters they were rendered with); without one, the shipped pack.
            engine = getattr(self.agent.alerts_provider, "__self__", None)
            groups = getattr(engine, "groups", None)
            self._rules = _pack_rules(groups) if groups else _default_rules()
        return self._rules

    def diagnosis(self, start: float | None, end: float | None) -> dict[str, Any]:
        if start is None or end is None:
            provider = self.agent.diagnosis_provider
            if provider is not None:
                return self._cache.get("latest", lambda: _as_dict(provider()))
            now = time.time()
            s = now - LATEST_WINDOW
            return self._cache.get(
                "latest",
                lambda: _as_dict(
                    self._memory.update(
                        _run_diagnosis(
                            self.agent.store,
                            s,
                            now,
                            self.alert_objects(s, now),
                            self.agent.events(s, now),
                        )
                    )
                ),
            )
        _check_window(start, end)
        s, e = start, end
        return self._cache.get(
            (round(s), round(e)),
            lambda: _as_dict(
                _run_diagnosis(
                    self.agent.store,
                    s,
                    e,
                    self.alert_objects(s, e),
                    self.agent.events(s, e),
                    _hold(),
                )
            ),
        )


def _alert_attrs(a: Any) -> dict[str, Any]:
    if isinstance(a, Mapping):
        return dict(a)
    to_dict = getattr(a, "to_dict", None)
    if callable(to_dict):
        out: dict[str, Any] = to_dict()
        return out
    return {
        "alertname": getattr(a, "alertname", "?"),
        "labels": dict(getattr(a, "labels", {})),
        "annotations": dict(getattr(a, "annotations", {})),
        "state": getattr(a, "state", ""),
        "active_at": getattr(a, "active_at", None),
        "value": getattr(a, "value", None),
    }


class RemoteSource:
    """An aivitals agent or a Prometheus / VictoriaMetrics, over its HTTP API.

    For a Prometheus the diagnosis is computed here, by ``aivitals.diagnose``
    over a ``PrometheusBackend``; an agent serves its own latest one.
    """

    def __init__(
        self,
        url: str,
        *,
        kind: str,
        tick: float = 15.0,
        timeout: float = 10.0,
        connection: RemoteConnection | None = None,
    ) -> None:
        from ..tsdb import PrometheusBackend

        if kind not in ("agent", "prometheus"):
            raise ConfigError(f"kind={kind!r}: expected agent or prometheus")
        self.kind = kind
        self.url = url.rstrip("/")
        self.tick = tick
        # one client for queries and the other API paths: the same credentials, TLS, headers
        self.backend = PrometheusBackend(self.url, timeout=timeout, connection=connection)
        self._cache = _Cached(ttl=max(2.0, tick))
        self._rules: dict[str, dict[str, Any]] | None = None
        self._memory = _memory()

    def close(self) -> None:
        self.backend.close()

    def _get(self, path: str) -> Any:
        r = self.backend.get(path)
        if r.status_code == 404:
            raise LookupError(f"{self.url}{path}: not served by this backend")
        try:
            body = r.json()
        except ValueError:
            raise BackendError(f"{self.url}{path}: HTTP {r.status_code}, not JSON") from None
        if r.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            raise BackendError(f"{self.url}{path}: HTTP {r.status_code}: {err or r.text[:200]}")
        return body.get("data")

    def rules(self) -> dict[str, dict[str, Any]]:
        if self._rules is None:
            try:
                data = self._get("/api/v1/rules?type=alert")
                rows = [
                    (str(r.get("name")), str(r.get("query", "")), dict(r.get("labels") or {}))
                    for g in (data or {}).get("groups", [])
                    for r in g.get("rules", [])
                    if r.get("type") == "alerting"
                ]
                # an agent run with --no-rules lists none: the shipped pack's thresholds
                self._rules = rule_thresholds(rows) if rows else _default_rules()
            except (LookupError, BackendError):
                self._rules = _default_rules()  # an older agent, without /api/v1/rules
        return self._rules

    def alerts(self) -> dict[str, Any]:
        return normalize_alerts(self._get("/api/v1/alerts"), self.rules())

    def alert_objects(self, start: float, end: float) -> list[Any]:
        try:
            data = self.alerts()
        except (LookupError, BackendError):
            return []
        every = [*data["alerts"], *data["history"]]
        return _objects(
            [a for a in every if start <= (a["fired_at"] or a["active_at"] or 0) <= end]
        )

    def diagnosis(self, start: float | None, end: float | None) -> dict[str, Any]:
        if start is None or end is None:
            if self.kind == "agent":
                return self._cache.get("latest", lambda: _as_dict(self._get("/api/v1/diagnosis")))
            # one key for "the latest": every page polling it shares one computation
            # per tick, instead of a new window (and a new diagnosis) every second
            now = time.time()
            return self._cache.get(
                "latest",
                lambda: _as_dict(
                    self._memory.update(
                        _run_diagnosis(
                            self.backend,
                            now - LATEST_WINDOW,
                            now,
                            self.alert_objects(now - LATEST_WINDOW, now),
                            (),
                        )
                    )
                ),
            )
        _check_window(start, end)
        s, e = start, end
        return self._cache.get(
            (round(s), round(e)),
            lambda: _as_dict(
                _run_diagnosis(self.backend, s, e, self.alert_objects(s, e), (), _hold())
            ),
        )
