"""``validate --target --prometheus URL [--alertmanager URL]``: the alerts of the user's
own monitoring, as validate's alert engine.

A drill on the user's service proves most when it reads the alerts where the user's
on-call reads them: the rules their Prometheus evaluates and the alerts it hands to their
Alertmanager. ``RemoteAlerts`` implements validate's ``TargetEngine`` over them: its
``groups`` are the rules Prometheus has loaded (``/api/v1/rules``), and a poller records
each alert's transitions from ``/api/v1/alerts`` (pending, firing, resolved), with
*firing* taken from Alertmanager's ``/api/v2/alerts`` when one is given (an alert counts
as fired once the notification pipeline holds it). ``check()`` refuses, before any fault,
a URL that is not Prometheus (or Alertmanager), a Prometheus without aivitals' alerts
loaded, and one that does not scrape the target.

Transition times are those of the polls, except where the server states them: a pending
alert's ``activeAt``, and Prometheus' firing time ``activeAt + for`` when it is past.

**Usage**::

    alerts = RemoteAlerts("http://prom:9090", "http://am:9093", interval=15.0)
    alerts.check(target_port=8300)     # ConfigError before any fault
    alerts.start()
    ...
    alerts.history(start=t_fault)      # AlertEvents, as the embedded engine gives them
    alerts.stop()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from ..errors import AivitalsError, ConfigError

if TYPE_CHECKING:
    from ..alerts import AlertEvent, AlertState, RuleGroup
    from ..tsdb import PrometheusBackend, RemoteConnection

__all__ = ["RemoteAlerts", "parse_rules_api"]

#: How to load aivitals' rules into a Prometheus, for the refusal that finds none.
LOAD_HINT = (
    "load the pack into it: `aivitals rules export --out DIR`, then add DIR's "
    "aivitals-rules.yml to its rule_files and reload it"
)


def _ts(text: Any) -> float | None:
    """An RFC 3339 time of the APIs (nanosecond fractions, ``Z`` or an offset) as epoch seconds;
    None for none, or for Go's zero time."""
    if not isinstance(text, str) or not text or text.startswith("0001-01-01"):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_rules_api(data: Mapping[str, Any]) -> tuple[tuple[RuleGroup, ...], list[str]]:
    """The rule groups of a ``/api/v1/rules`` answer, as aivitals parses a rule file, and
    the groups it could not parse (each with why): a group of the user's own whose
    templates aivitals' engine does not know is left out and named, never fatal."""
    from ..alerts import load_rules

    groups: list[RuleGroup] = []
    skipped: list[str] = []
    for g in (data.get("data") or {}).get("groups") or []:
        rules = []
        for r in g.get("rules") or []:
            if r.get("type") == "alerting":
                rule: dict[str, Any] = {"alert": r.get("name"), "expr": r.get("query")}
                if r.get("duration"):
                    rule["for"] = f"{float(r['duration']):g}s"
                if r.get("keepFiringFor"):
                    rule["keep_firing_for"] = f"{float(r['keepFiringFor']):g}s"
                if r.get("labels"):
                    rule["labels"] = dict(r["labels"])
                if r.get("annotations"):
                    rule["annotations"] = dict(r["annotations"])
            else:
                rule = {"record": r.get("name"), "expr": r.get("query")}
                if r.get("labels"):
                    rule["labels"] = dict(r["labels"])
            rules.append(rule)
        raw: dict[str, Any] = {"name": g.get("name"), "rules": rules}
        if g.get("interval"):
            raw["interval"] = f"{float(g['interval']):g}s"
        try:
            groups.extend(load_rules(yaml.safe_dump({"groups": [raw]}, sort_keys=False)))
        except (AivitalsError, ValueError) as exc:
            skipped.append(f"{g.get('name')}: {exc}")
    return tuple(groups), skipped


class RemoteAlerts:
    """The user's Prometheus (and Alertmanager) alerts as validate's ``TargetEngine``."""

    def __init__(
        self,
        prometheus: PrometheusBackend,
        alertmanager: str | None = None,
        *,
        interval: float = 15.0,
        timeout: float = 10.0,
        connection: RemoteConnection | None = None,
    ) -> None:
        from ..tsdb import PrometheusBackend, RemoteConnection

        if alertmanager is not None and not alertmanager.startswith(("http://", "https://")):
            raise ConfigError(f"--alertmanager {alertmanager!r}: expected an http(s):// URL")
        self.prometheus = prometheus
        self.alertmanager = None if alertmanager is None else alertmanager.rstrip("/")
        #: the Alertmanager's connection: Prometheus' credentials, TLS and headers (one
        #: monitoring stack behind one gateway); its files are read here, before any fault
        self.connection = connection or RemoteConnection()
        # the backend's GET names a refused token or a failed handshake as for Prometheus
        self._am: PrometheusBackend | None = (
            None
            if self.alertmanager is None
            else PrometheusBackend(self.alertmanager, timeout=timeout, connection=self.connection)
        )
        self.interval = interval
        self.timeout = timeout
        self.groups: tuple[RuleGroup, ...] = ()
        #: the user's groups aivitals could not parse, each with why (for the report)
        self.skipped_groups: list[str] = []
        #: polls that failed, the last error (the run goes on; a miss says so)
        self.failed_polls = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._history: list[AlertEvent] = []
        self._now: dict[str, AlertEvent] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- refusals, before any fault -----------------------------------------------------
    def check(self, *, target_port: int | None = None) -> None:
        """``ConfigError`` when the URLs are not what they claim, Prometheus has none of
        aivitals' alerts loaded, or it does not scrape the target's port."""
        from ..alerts import default_pack

        url = self.prometheus.url
        data = self._prom_json("/api/v1/rules", what="its rules")
        self.groups, self.skipped_groups = parse_rules_api(data)
        ours = set(default_pack().alert_names)
        loaded = {r.alert for g in self.groups for r in g.alerting_rules}
        if not loaded & ours:
            raise ConfigError(
                f"--prometheus {url}: none of aivitals' {len(ours)} alerts is loaded "
                f"({len(loaded)} alerting rules of other names); {LOAD_HINT}"
            )
        if target_port is not None:
            up = self._prom_json("/api/v1/query", {"query": "up"}, what="`up`")
            instances = [
                str(s.get("metric", {}).get("instance", ""))
                for s in (up.get("data") or {}).get("result") or []
            ]
            if not any(i.rpartition(":")[2] == str(target_port) for i in instances):
                raise ConfigError(
                    f"--prometheus {url}: it does not scrape the target (no `up` series "
                    f"with an instance on port {target_port}; it scrapes "
                    f"{', '.join(sorted(instances)[:5]) or 'nothing'}); add the service to "
                    "its scrape_configs"
                )
        if self.alertmanager is not None:
            status = self._am_json("/api/v2/status")
            if not isinstance(status, dict) or "versionInfo" not in status:
                raise ConfigError(
                    f"--alertmanager {self.alertmanager}: not an Alertmanager (its "
                    "/api/v2/status has no versionInfo)"
                )

    def _prom_json(
        self, path: str, params: dict[str, str] | None = None, *, what: str
    ) -> dict[str, Any]:
        url = self.prometheus.url
        try:
            r = self.prometheus.get(path, params)
        except AivitalsError as exc:
            raise ConfigError(f"--prometheus {url}: {what} could not be read: {exc}") from exc
        try:
            data = r.json()
        except ValueError:
            data = None
        if r.status_code != 200 or not isinstance(data, dict) or data.get("status") != "success":
            first = (r.text.strip().splitlines() or [""])[0][:120]
            raise ConfigError(
                f"--prometheus {url}: not a Prometheus API ({path} answered HTTP "
                f"{r.status_code}: {first!r})"
            )
        return data

    def _am_json(self, path: str) -> Any:
        assert self._am is not None
        try:
            r = self._am.get(path)
        except AivitalsError as exc:
            raise ConfigError(f"--alertmanager {self.alertmanager}: {exc}") from exc
        try:
            return r.json() if r.status_code == 200 else None
        except ValueError:
            return None

    # -- the poller ------------------------------------------------------------------------
    def start(self) -> None:
        self.poll()
        self._thread = threading.Thread(target=self._run, name="remote-alerts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)
        if self._am is not None and (self._thread is None or not self._thread.is_alive()):
            self._am.close()  # a poll still running past the join keeps its client

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self, now: float | None = None) -> None:
        """Read the alerts once and record what changed since the last poll. A failed
        read records nothing (an alert is never resolved for want of an answer)."""
        now = time.time() if now is None else now
        try:
            alerts = self._prom_alerts()
            delivered = self._am_firing() if self.alertmanager is not None else None
        except (AivitalsError, httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            with self._lock:
                self.failed_polls += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
            return
        from ..alerts import AlertEvent

        fors = {r.alert: r.for_ for g in self.groups for r in g.alerting_rules}
        with self._lock:
            seen: set[str] = set()
            for a in alerts:
                labels = {str(k): str(v) for k, v in (a.get("labels") or {}).items()}
                key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                seen.add(key)
                name = labels.get("alertname", "")
                active_at = _ts(a.get("activeAt")) or now
                if delivered is not None:
                    firing, starts = _held(labels, delivered)
                    fired_at = max(active_at, starts or now) if firing else None
                else:
                    firing = a.get("state") == "firing"
                    fired_at = min(now, active_at + fors.get(name, 0.0)) if firing else None
                state: AlertState = "firing" if firing else "pending"
                old = self._now.get(key)
                if old is not None and old.state == state:
                    continue
                if old is not None and old.state == "firing":
                    continue  # Alertmanager lags a resolve: firing holds until it is gone
                event = AlertEvent(
                    alertname=name,
                    labels=labels,
                    annotations={str(k): str(v) for k, v in (a.get("annotations") or {}).items()},
                    state=state,
                    active_at=active_at,
                    fired_at=fired_at,
                    resolved_at=None,
                    value=_value(a.get("value")),
                )
                if old is None and firing:
                    # first seen firing: its pending stretch happened between polls
                    self._history.append(_with(event, state="pending", fired_at=None))
                self._history.append(event)
                self._now[key] = event
            for key in [k for k in self._now if k not in seen]:
                gone = self._now.pop(key)
                self._history.append(_with(gone, state="resolved", resolved_at=now))

    def _prom_alerts(self) -> list[dict[str, Any]]:
        r = self.prometheus.get("/api/v1/alerts")
        r.raise_for_status()
        alerts = r.json()["data"]["alerts"]
        return [a for a in alerts if isinstance(a, dict)]

    def _am_firing(self) -> list[tuple[dict[str, str], float | None]]:
        """Alertmanager's active alerts: their labels and ``startsAt`` (Prometheus sends
        the time the alert fired)."""
        assert self._am is not None
        r = self._am.get(
            "/api/v2/alerts", {"active": "true", "silenced": "true", "inhibited": "true"}
        )
        r.raise_for_status()
        return [
            ({str(k): str(v) for k, v in (a.get("labels") or {}).items()}, _ts(a.get("startsAt")))
            for a in r.json()
        ]

    # -- what validate reads ---------------------------------------------------------------
    def history(self, start: float | None = None, end: float | None = None) -> list[AlertEvent]:
        with self._lock:
            events = list(self._history)
        return [
            e for e in events if (start is None or e.at >= start) and (end is None or e.at <= end)
        ]

    def active(self) -> list[AlertEvent]:
        with self._lock:
            out = list(self._now.values())
        return sorted(out, key=lambda e: (e.state != "firing", e.alertname, e.fingerprint))

    def firing(self) -> list[AlertEvent]:
        return [e for e in self.active() if e.state == "firing"]

    def describe(self) -> dict[str, Any]:
        """What the report states of the alert source."""
        return {
            "prometheus": self.prometheus.url,
            "alertmanager": self.alertmanager,
            "alerting_rules": sum(len(g.alerting_rules) for g in self.groups),
            "skipped_groups": list(self.skipped_groups),
            "failed_polls": self.failed_polls,
            "last_error": self.last_error,
        }


def _held(
    labels: Mapping[str, str], delivered: list[tuple[dict[str, str], float | None]]
) -> tuple[bool, float | None]:
    """Whether Alertmanager holds the alert with ``labels``, and its ``startsAt``. Its
    labels may add to Prometheus' (the external labels Prometheus sends with them)."""
    for held, starts in delivered:
        if all(held.get(k) == v for k, v in labels.items()):
            return True, starts
    return False, None


def _value(raw: Any) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        return float("nan")


def _with(event: AlertEvent, **changes: Any) -> AlertEvent:
    from dataclasses import replace

    return replace(event, **changes)
