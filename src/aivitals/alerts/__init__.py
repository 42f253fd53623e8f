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
from ._export import ExportTargets, export_pack
from ._native import native_expr, native_names, native_samples, with_native
from ._notify import AlertmanagerNotifier, WebhookNotifier, webhook_payload
from ._params import PackParams, parse_param_pairs
from ._recording import native_rule_group, native_rules_text
from ._rules import AlertingRule, RecordingRule, Rule, RuleGroup, RulePack, default_pack, load_rules
from ._template import Template, TemplateError

__all__ = [
    "AlertEvent",
    "AlertState",
    "AlertingRule",
    "AlertmanagerNotifier",
    "ExportTargets",
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
    "WebhookNotifier",
    "default_pack",
    "export_pack",
    "load_rules",
    "native_expr",
    "native_names",
    "native_rule_group",
    "native_rules_text",
    "native_samples",
    "parse_param_pairs",
    "webhook_payload",
    "with_native",
]
