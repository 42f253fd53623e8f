"""The agent's own alerting: rule files, the shipped pack, notify targets."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from aivitals.agent import Agent, AgentConfig
from aivitals.agent._rules import (
    SHIPPED_FILE,
    NotifyTarget,
    RulesCollector,
    attach_rules,
    prom_duration,
    shipped_rules,
    user_rules,
)
from aivitals.errors import ConfigError
from tests.alerts._receiver import receiver

from .conftest import Counting, wait_for

ALWAYS = """
groups:
  - name: {name}
    rules:
      - alert: Counting
        expr: host_load1 > 0
        labels: {{severity: P2}}
"""


@pytest.mark.parametrize(
    ("text", "kind", "url"),
    [
        ("alertmanager=http://127.0.0.1:9093", "alertmanager", "http://127.0.0.1:9093"),
        ("webhook=https://hooks.example/a?b=c", "webhook", "https://hooks.example/a?b=c"),
    ],
)
def test_a_notify_target_names_its_kind(text: str, kind: str, url: str) -> None:
    assert NotifyTarget.parse(text) == NotifyTarget(kind, url)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("http://127.0.0.1:9093", "is not KIND=URL"),  # a bare URL is never guessed
        ("slack=http://127.0.0.1:1/", "is not KIND=URL"),
        ("webhook=127.0.0.1:5001", "is not an http(s) URL"),
        ("webhook=", "is not an http(s) URL"),
    ],
)
def test_a_bad_notify_target_is_refused(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        NotifyTarget.parse(text)


@pytest.mark.parametrize(("seconds", "text"), [(15.0, "15s"), (0.2, "200ms"), (90.0, "90s")])
def test_prom_duration(seconds: float, text: str) -> None:
    assert prom_duration(seconds) == text


def test_the_shipped_pack_is_evaluated_at_the_scrape_interval() -> None:
    groups, files = shipped_rules(5.0, {"queue_limit": 7})
    assert {g.interval for g in groups} == {5.0}
    assert set(files.values()) == {SHIPPED_FILE}
    backlog = next(r for g in groups for r in g.alerting_rules if r.alert == "QueueBacklog")
    assert "> 7" in backlog.expr


def test_the_same_group_in_two_files_is_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yml", tmp_path / "b.yml"
    a.write_text(ALWAYS.format(name="g"))
    b.write_text(ALWAYS.format(name="g"))
    with pytest.raises(ConfigError, match=f"--rules {b}: group 'g' is already defined in {a}"):
        user_rules([str(a), str(b)])
    b.write_text(ALWAYS.format(name="h"))
    groups, files = user_rules([str(a), str(b)])
    assert [g.name for g in groups] == ["g", "h"] and files == {"g": str(a), "h": str(b)}


def test_an_expression_the_store_cannot_run_is_refused_at_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("groups: [{name: g, rules: [{alert: A, expr: 'sort_by_label(up, \"x\")'}]}]")
    with pytest.raises(ConfigError, match=f"--rules {bad}: rule 'A': "):
        user_rules([str(bad)])


def test_alerts_reach_an_alertmanager_and_the_counts_are_agent_series(tmp_path: Path) -> None:
    rules = tmp_path / "r.yml"
    rules.write_text(ALWAYS.format(name="g"))
    groups, files = user_rules([str(rules)])
    collector = RulesCollector()
    config = AgentConfig(
        listen="127.0.0.1:0", interval=0.1, scrape_interval=0.2, gpu="none", kernel_log=False
    )
    agent = Agent(config, collectors=[Counting(), collector])
    with receiver() as am:
        engine, notifiers = attach_rules(
            agent,
            groups,
            files,
            notify=[NotifyTarget("alertmanager", am.url), NotifyTarget("webhook", am.url)],
            collector=collector,
        )
        with agent:
            assert am.wait_for(lambda bodies: len(bodies) >= 2, timeout=10)
            wait_for(lambda: bool(agent.store.query("aivitals_notifications_total").vector))
        for n in notifiers:
            n.close()  # type: ignore[attr-defined]
    pushed = next(b for b in am.bodies if isinstance(b, list))  # Alertmanager's v2 body
    assert pushed[0]["labels"] == {"alertname": "Counting", "severity": "P2"}
    assert any(isinstance(b, dict) and b["receiver"] == "webhook" for b in am.bodies)
    assert engine.default_interval == 0.2
    sent = agent.store.query("aivitals_notifications_total", time.time()).vector
    assert {s.labels["receiver"] for s in sent} <= {"alertmanager", "webhook"}
