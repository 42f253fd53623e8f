"""The agent's own alerting: which rules it evaluates and where it sends what fires.

``aivitals agent`` evaluates the shipped rule pack, rendered for its scrape interval,
or the user's rule files (``--rules``) on its store, and hands what fires to webhooks
and Alertmanagers (``--notify``). A library ``Agent`` evaluates nothing until a
``RuleEngine`` is attached to it (``engine.attach(agent)``): the demo stack and
validate attach their own, with compressed windows, so nothing is evaluated twice.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from ..errors import AivitalsError, ConfigError, RuleError
from ..signals import Sample
from ..tsdb import Store

if TYPE_CHECKING:
    from ..alerts import Notifier, RuleEngine, RuleGroup
    from ._agent import Agent

__all__ = [
    "NOTIFY_KINDS",
    "SHIPPED_FILE",
    "SLA_METRIC",
    "NotifyTarget",
    "RulesCollector",
    "SlaCollector",
    "attach_rules",
    "fit_retention",
    "prom_duration",
    "shipped_rules",
    "sla_bound",
    "user_rules",
]

log = logging.getLogger("aivitals.agent")

NOTIFY_KINDS = ("alertmanager", "webhook")
#: the series that gives a scraped service its SLA (the rule pack's group aivitals-slo)
SLA_METRIC = "aivitals_service_sla_seconds"
#: the shipped group whose rules are fitted to the store's retention
_SLO_GROUP = "aivitals-slo"
_RANGE = re.compile(r"\[([0-9a-z]+)\]")
#: the ``file`` that ``/api/v1/rules`` names for the groups of the shipped pack
SHIPPED_FILE = "aivitals-rules.yml (shipped)"


@dataclass(frozen=True, slots=True)
class NotifyTarget:
    """Where the agent sends alerts: ``alertmanager=URL`` (pushed to its v2 API, as
    Prometheus does) or ``webhook=URL`` (Alertmanager's webhook body, POSTed).

    The kind is always named, never guessed: both are plain http URLs whose payloads
    differ, and a probe at start would pick the wrong format whenever the receiver is
    down, behind a proxy, or answers anything with 200.
    """

    kind: str
    url: str

    @classmethod
    def parse(cls, text: str) -> NotifyTarget:
        kind, sep, url = text.partition("=")
        if not sep or kind not in NOTIFY_KINDS:
            raise ConfigError(
                f"notify: {text!r} is not KIND=URL with KIND one of {', '.join(NOTIFY_KINDS)} "
                "(alertmanager=http://127.0.0.1:9093, webhook=http://127.0.0.1:5001/alerts)"
            )
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"notify: {url!r} is not an http(s) URL")
        return cls(kind, url)


class RulesCollector:
    """The engine's and the notifiers' own metrics (alerts firing, evaluation time,
    notifications by result) as agent samples, so they are on ``/metrics`` and in the
    store like every other signal. The registries are added once they exist."""

    name = "rules"

    def __init__(self) -> None:
        self.registries: list[CollectorRegistry] = []

    def collect(self) -> Iterator[Sample]:
        for registry in list(self.registries):
            for family in registry.collect():
                for s in family.samples:
                    if not s.name.endswith("_created"):
                        yield Sample(s.name, dict(s.labels), s.value)


def prom_duration(seconds: float) -> str:
    """Seconds as a Prometheus duration (``15s``, ``200ms``)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def shipped_rules(
    scrape_interval: float, params: Mapping[str, Any] | None = None
) -> tuple[tuple[RuleGroup, ...], dict[str, str]]:
    """The shipped pack's groups, evaluated and windowed for this scrape interval, and
    the file of each; ``params`` (``--param``) override any pack parameter."""
    from ..alerts import default_pack

    every = prom_duration(scrape_interval)
    chosen = {"scrape_interval": every, "evaluation_interval": every, **(params or {})}
    try:
        pack = default_pack(**chosen)
    except ConfigError as exc:
        raise ConfigError(
            f"the shipped rule pack at --scrape-interval {every}: {exc}. Widen the window "
            "with --param NAME=VALUE, give your own --rules, or run with --no-rules"
        ) from exc
    return pack.groups, dict.fromkeys((g.name for g in pack.groups), SHIPPED_FILE)


def user_rules(paths: Sequence[str]) -> tuple[tuple[RuleGroup, ...], dict[str, str]]:
    """The groups of the user's rule files (Prometheus's format), and the file of each.

    Each rule is also evaluated once on an empty store, so an expression the embedded
    engine cannot run is refused now, not found later as a rule that never fires.
    ``ConfigError`` names the file, the rule and the problem.
    """
    from ..alerts import load_rules

    groups: list[RuleGroup] = []
    files: dict[str, str] = {}
    empty = Store(retention=60.0)
    for text in paths:
        path = Path(text)
        if not path.is_file():
            raise ConfigError(f"--rules {text}: no such file")
        try:
            loaded = load_rules(path)
        except RuleError as exc:
            raise ConfigError(f"--rules {text}: {exc}") from exc
        for g in loaded:
            if g.name in files:
                raise ConfigError(
                    f"--rules {text}: group {g.name!r} is already defined in {files[g.name]}; "
                    "group names must be unique across the rule files"
                )
            for rule in g.rules:
                try:
                    empty.query(rule.expr, 0.0)
                except AivitalsError as exc:
                    raise ConfigError(f"--rules {text}: rule {rule.name!r}: {exc}") from exc
            files[g.name] = text
            groups.append(g)
    return tuple(groups), files


def attach_rules(
    agent: Agent,
    groups: Sequence[RuleGroup],
    files: Mapping[str, str],
    *,
    notify: Sequence[NotifyTarget] = (),
    collector: RulesCollector | None = None,
) -> tuple[RuleEngine, list[Notifier]]:
    """Evaluate ``groups`` on the agent's store at its scrape interval (a group's own
    ``interval`` wins), serve them on ``/api/v1/alerts`` and ``/api/v1/rules``, and send
    what fires to ``notify``. The caller closes the notifiers after the agent stops."""
    from ..alerts import AlertmanagerNotifier, RuleEngine, WebhookNotifier

    notifiers: list[Any] = []
    seen: dict[str, int] = {}
    for target in notify:
        seen[target.kind] = seen.get(target.kind, 0) + 1
        receiver = target.kind if seen[target.kind] == 1 else f"{target.kind}-{seen[target.kind]}"
        registry = CollectorRegistry()  # one each: they count under the same metric name
        cls = AlertmanagerNotifier if target.kind == "alertmanager" else WebhookNotifier
        notifiers.append(cls(target.url, receiver=receiver, registry=registry))
        if collector is not None:
            collector.registries.append(registry)
    registry = CollectorRegistry()
    engine = RuleEngine(
        agent.store, groups, notifiers=notifiers, registry=registry, files=dict(files)
    )
    if collector is not None:
        collector.registries.append(registry)
    engine.attach(agent, default_interval=agent.config.scrape_interval)
    return engine, notifiers


def sla_bound(sla: float, bounds: Iterable[str]) -> tuple[str, bool]:
    """The ``le`` text at which ``sla`` seconds is measured on a histogram with ``bounds``
    (its ``le`` values as the target writes them), and whether it is the SLA itself.

    "Slower than the SLA" is read off a histogram as the requests above one bucket
    bound, so the SLA must be a bound. A service instrumented with aivitals has them
    at the usual SLAs (0.5, 1, 1.5, 2, 3, 5 s ...); a foreign one has its own. Refusing
    a foreign service's histogram would leave its users' waits unwatched, so the SLA is
    measured at the nearest bound at or above it: a looser SLA, never a stricter one
    (it pages on no request that met the SLA), which the alert names as its ``le`` and
    the agent logs. Bounds are compared as numbers and returned as the target wrote them
    (``2`` from a Go client, ``2.0`` from Python's), so the rule's join on ``le`` holds.
    Without a finite bound at or above the SLA, the SLA's own text (Python's ``repr``)
    is returned, not exact: the rule pack's SLABucketMissing then says so.
    """
    finite: list[tuple[float, str]] = []
    for text in bounds:
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value):
            finite.append((value, text))
    above = sorted(b for b in finite if b[0] >= sla)
    if above:
        return above[0][1], math.isclose(above[0][0], sla)
    return repr(float(sla)), False


class SlaCollector:
    """``aivitals_service_sla_seconds{job, instance, bound}`` for every scrape target:
    the SLA (``aivitals agent --sla``) and the bucket bound of the target's
    ``http_request_duration_seconds`` it is measured at (``sla_bound``). The rule
    pack's burn-rate alerts measure only the services that have this series.

    The bound is read from the agent's store (``store`` is set once the agent exists),
    so a target's series appear after its first scrape that carries the histogram;
    a target without one gets none, as it has no latency to measure.
    """

    name = "sla"

    def __init__(self, targets: Sequence[tuple[str, str]], sla: float) -> None:
        self.targets = tuple(targets)
        self.sla = sla
        self.store: Store | None = None
        self._told: set[tuple[str, str, str]] = set()

    def collect(self) -> Iterator[Sample]:
        if self.store is None:
            return
        for job, instance in self.targets:
            selector = (
                f"http_request_duration_seconds_bucket{{job={json.dumps(job)},"
                f"instance={json.dumps(instance)}}}"
            )
            found = self.store.query(f"count by (le) ({selector})").vector
            bounds = sorted({s.labels["le"] for s in found if "le" in s.labels}, key=_as_float)
            if not bounds:
                continue
            le, exact = sla_bound(self.sla, bounds)
            if not exact:
                self._tell(job, instance, le, bounds)
            # ``bound``, not ``le``: a gauge with ``le`` reads as a histogram bucket (promtool
            # refuses it); the rules put it in ``le`` with label_replace to join the buckets
            yield Sample(SLA_METRIC, {"job": job, "instance": instance, "bound": le}, self.sla)

    def _tell(self, job: str, instance: str, le: str, bounds: Sequence[str]) -> None:
        # once per target and bound: the collector runs every interval
        if (job, instance, le) in self._told:
            return
        self._told.add((job, instance, le))
        if any(self.sla <= _as_float(b) < math.inf for b in bounds):
            how = f"measuring at le={le}, the nearest bound above"
        else:
            how = "none is at or above it: its latency SLO is not measured (SLABucketMissing)"
        log.warning(
            "--sla %gs is not a bucket bound of http_request_duration_seconds of %s (%s) "
            "(bounds: %s); %s",
            self.sla,
            job,
            instance,
            ", ".join(bounds),
            how,
        )


def _as_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.inf


def fit_retention(
    groups: Sequence[RuleGroup], retention: float
) -> tuple[tuple[RuleGroup, ...], list[str]]:
    """The shipped groups without the SLO rules whose windows the store does not keep,
    and the names of the alerts left out.

    A rate over a window longer than the data stored is the rate over what is stored:
    a 6h burn read off one hour would page on an hour's burn, as a slow burn. So an
    agent keeping ``--retention 1h`` evaluates the fast burn (1h and 5m) only; 6h
    brings the slow burn, 3d the ticket. Only group aivitals-slo is fitted: the other
    rules' windows (DiskWillFill's 6h regression) ask a different question of the data
    they have. An alert goes with the recording rules it reads.
    """
    from ..tsdb import parse_duration

    out: list[RuleGroup] = []
    dropped: list[str] = []
    for group in groups:
        if group.name != _SLO_GROUP:
            out.append(group)
            continue
        gone: set[str] = set()
        kept = []
        for rule in group.rules:
            windows = [parse_duration("window", w) for w in _RANGE.findall(rule.expr)]
            too_long = any(w > retention for w in windows)
            reads_gone = any(re.search(re.escape(name) + r"(?![\w:])", rule.expr) for name in gone)
            if too_long or reads_gone:
                gone.add(rule.name)
                if hasattr(rule, "alert"):
                    dropped.append(rule.name)
                continue
            kept.append(rule)
        out.append(replace(group, rules=tuple(kept)))
    return tuple(out), dropped
