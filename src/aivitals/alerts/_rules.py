"""Rule files: Prometheus rule YAML parsed and checked into typed groups.

The checks are Prometheus' own (rulefmt): one of ``record``/``alert`` per rule,
an expression that parses, valid metric and label names, durations, no unknown
keys. On top, every label and annotation template must fit the subset the
embedded engine renders, so a rule the engine cannot expand exactly is refused
at load time with the rule's name rather than rendered differently later.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from ..errors import RuleError
from ._params import PackParams, parse_duration, render_pack_text
from ._template import Template, TemplateError

__all__ = [
    "AlertingRule",
    "RecordingRule",
    "Rule",
    "RuleGroup",
    "RulePack",
    "default_pack",
    "load_rules",
]

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_GROUP_KEYS = {"name", "interval", "rules", "limit"}
_ALERT_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
_RECORD_KEYS = {"record", "expr", "labels"}


@dataclass(frozen=True, slots=True)
class RecordingRule:
    """``record: name`` / ``expr``: its result stored as series ``name``."""

    record: str
    expr: str
    labels: Mapping[str, str]
    group: str

    @property
    def name(self) -> str:
        return self.record


@dataclass(frozen=True, slots=True)
class AlertingRule:
    """``alert: name`` with ``for``, ``keep_firing_for``, labels and annotations (templates)."""

    alert: str
    expr: str
    for_: float
    keep_firing_for: float
    labels: Mapping[str, Template]
    annotations: Mapping[str, Template]
    group: str

    @property
    def name(self) -> str:
        return self.alert


Rule = AlertingRule | RecordingRule


@dataclass(frozen=True, slots=True)
class RuleGroup:
    """A named, ordered list of rules evaluated together every ``interval`` seconds."""

    name: str
    interval: float | None
    rules: tuple[Rule, ...]
    limit: int = 0

    @property
    def alerting_rules(self) -> tuple[AlertingRule, ...]:
        return tuple(r for r in self.rules if isinstance(r, AlertingRule))

    @property
    def recording_rules(self) -> tuple[RecordingRule, ...]:
        return tuple(r for r in self.rules if isinstance(r, RecordingRule))


@dataclass(frozen=True, slots=True)
class RulePack:
    """The shipped rule pack rendered with its parameters.

    ``text`` is the Prometheus rule file, ``groups`` the parsed rules the
    embedded engine runs, ``params`` what they were rendered with.
    """

    text: str
    groups: tuple[RuleGroup, ...]
    params: PackParams

    def write(self, directory: Path | str, name: str = "aivitals-rules.yml") -> Path:
        """Write the rule file into ``directory`` and return its path."""
        path = Path(directory) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text, encoding="utf-8")
        return path

    @property
    def alert_names(self) -> list[str]:
        return [r.alert for g in self.groups for r in g.alerting_rules]


def default_pack(**params: Any) -> RulePack:
    """The shipped rule pack with thresholds; unknown or invalid parameters raise ``ConfigError``.

    **Usage**::

        pack = default_pack(sla_seconds=0.5, queue_limit=50)
        engine = RuleEngine(store, pack.groups)
        pack.write("out/")          # for Prometheus
    """
    chosen = PackParams.from_mapping(params)
    text = render_pack_text(chosen)
    return RulePack(text=text, groups=tuple(load_rules(text)), params=chosen)


def load_rules(source: str | Path) -> list[RuleGroup]:
    """Parse Prometheus rule YAML (a path, or the YAML text itself) into checked groups.

    ``RuleError`` names the rule (or group) and the problem: an expression that
    does not parse, an unsupported template, a bad duration, an unknown key.
    """
    text = _read(source)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleError("<file>", f"not valid YAML: {exc}") from None
    if doc is None:
        return []
    if not isinstance(doc, dict) or set(doc) - {"groups"}:
        raise RuleError("<file>", "a rule file is a mapping with one key, 'groups'")
    groups = doc.get("groups") or []
    if not isinstance(groups, list):
        raise RuleError("<file>", "'groups' must be a list")
    out = [_group(g, i) for i, g in enumerate(groups)]
    names = [g.name for g in out]
    for name in names:
        if names.count(name) > 1:
            raise RuleError(name, "group name appears more than once")
    return out


def _read(source: str | Path) -> str:
    if isinstance(source, Path):
        try:
            return source.read_text(encoding="utf-8")
        except OSError as exc:
            raise RuleError(str(source), f"cannot read the rule file: {exc}") from None
    if "\n" not in source and (source.endswith((".yml", ".yaml")) or Path(source).is_file()):
        return _read(Path(source))
    return source


def _group(raw: Any, index: int) -> RuleGroup:
    if not isinstance(raw, dict):
        raise RuleError(f"<group {index}>", "a group must be a mapping")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise RuleError(f"<group {index}>", "group has no name")
    _no_unknown_keys(raw, _GROUP_KEYS, name)
    interval = None
    if raw.get("interval") is not None:
        interval = _duration(raw["interval"], name, "interval")
        if interval <= 0:
            raise RuleError(name, "interval must be positive")
    limit = raw.get("limit", 0)
    if not isinstance(limit, int) or limit < 0:
        raise RuleError(name, f"limit={limit!r} must be a non-negative integer")
    rules = raw.get("rules") or []
    if not isinstance(rules, list):
        raise RuleError(name, "'rules' must be a list")
    return RuleGroup(name, interval, tuple(_rule(r, name, i) for i, r in enumerate(rules)), limit)


def _rule(raw: Any, group: str, index: int) -> Rule:
    where = f"{group}/rule {index}"
    if not isinstance(raw, dict):
        raise RuleError(where, "a rule must be a mapping")
    if ("alert" in raw) == ("record" in raw):
        raise RuleError(where, "a rule needs exactly one of 'alert' and 'record'")
    expr = raw.get("expr")
    if "record" in raw:
        name = str(raw["record"])
        _no_unknown_keys(raw, _RECORD_KEYS, name)
        if not _METRIC_NAME.match(name):
            raise RuleError(name, "record is not a valid metric name")
        _check_expr(expr, name)
        labels = _label_map(raw.get("labels"), name)
        for key, value in labels.items():
            if "{{" in value:
                raise RuleError(name, f"label {key} of a recording rule cannot be a template")
        return RecordingRule(name, str(expr), labels, group)
    name = str(raw["alert"])
    if not name:
        raise RuleError(where, "alert name is empty")
    _no_unknown_keys(raw, _ALERT_KEYS, name)
    _check_expr(expr, name)
    return AlertingRule(
        alert=name,
        expr=str(expr),
        for_=_duration(raw.get("for", "0s"), name, "for"),
        keep_firing_for=_duration(raw.get("keep_firing_for", "0s"), name, "keep_firing_for"),
        labels=_templates(_label_map(raw.get("labels"), name), name, "label"),
        annotations=_templates(_string_map(raw.get("annotations"), name, "annotations"), name),
        group=group,
    )


def _no_unknown_keys(raw: Mapping[str, Any], known: set[str], name: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RuleError(name, f"unknown field(s) {', '.join(unknown)}")


def _duration(value: Any, name: str, key: str) -> float:
    try:
        return parse_duration(str(value), key=key)
    except Exception as exc:
        raise RuleError(name, str(exc)) from None


def _check_expr(expr: Any, name: str) -> None:
    if not isinstance(expr, str) or not expr.strip():
        raise RuleError(name, "expr is missing or empty")
    try:
        parsed = promql_parser.parse(expr)
    except (ValueError, TypeError) as exc:
        raise RuleError(name, f"invalid expression: {exc}") from None
    if isinstance(parsed, promql_parser.MatrixSelector | promql_parser.StringLiteral):
        raise RuleError(name, "expression must give an instant vector or a scalar")


def _string_map(raw: Any, name: str, what: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RuleError(name, f"{what} must be a mapping")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not _LABEL_NAME.match(key):
            raise RuleError(name, f"{key!r} in {what} is not a valid name")
        if value is None or isinstance(value, dict | list):
            raise RuleError(name, f"{what} {key} must be a string, got {value!r}")
        out[key] = value if isinstance(value, str) else str(value)
    return out


def _label_map(raw: Any, name: str) -> dict[str, str]:
    labels = _string_map(raw, name, "labels")
    for key in labels:
        if key.startswith("__"):
            raise RuleError(name, f"label {key} is reserved")
    return labels


def _templates(raw: Mapping[str, str], name: str, what: str = "annotation") -> dict[str, Template]:
    out: dict[str, Template] = {}
    for key, text in raw.items():
        try:
            out[key] = Template.parse(text)
        except TemplateError as exc:
            raise RuleError(name, f"{what} {key}: {exc}") from None
    return out
