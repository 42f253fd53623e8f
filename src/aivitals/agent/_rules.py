"""The agent's own alerting: which rules it evaluates and where it sends what fires.

``aivitals agent`` evaluates the shipped rule pack, rendered for its scrape interval,
or the user's rule files (``--rules``) on its store, and hands what fires to webhooks
and Alertmanagers (``--notify``). A library ``Agent`` evaluates nothing until a
``RuleEngine`` is attached to it (``engine.attach(agent)``): the demo stack and
validate attach their own, with compressed windows, so nothing is evaluated twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
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
    "NotifyTarget",
    "RulesCollector",
    "attach_rules",
    "prom_duration",
    "shipped_rules",
    "user_rules",
]

NOTIFY_KINDS = ("alertmanager", "webhook")
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
