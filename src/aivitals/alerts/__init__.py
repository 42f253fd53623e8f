"""Alert rules: the shipped rule pack, the embedded engine and its notifiers.

**Usage**::

    from aivitals.alerts import RuleEngine, default_pack
    pack = default_pack(sla_seconds=0.5)      # thresholds are parameters
    pack.write("rules/")                      # for a real Prometheus
    engine = RuleEngine(store, pack)          # the same rules, embedded
    engine.evaluate(time.time())
"""

from __future__ import annotations

from ._engine import AlertEvent, AlertState, Notifier, RuleEngine, RuleHealth
from ._params import PackParams
from ._rules import AlertingRule, RecordingRule, Rule, RuleGroup, RulePack, default_pack, load_rules
from ._template import Template, TemplateError

__all__ = [
    "AlertEvent",
    "AlertState",
    "AlertingRule",
    "Notifier",
    "PackParams",
    "RecordingRule",
    "Rule",
    "RuleEngine",
    "RuleGroup",
    "RuleHealth",
    "RulePack",
    "Template",
    "TemplateError",
    "default_pack",
    "load_rules",
]
