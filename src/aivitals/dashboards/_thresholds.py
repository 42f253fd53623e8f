"""Panel thresholds read from the rule pack's alert expressions.

A panel that shows what an alert watches draws the alert's threshold, taken
from the rendered rule (``queue_length > 20`` gives 20), so the line on the
graph and the page the alert sends cannot disagree: change the pack's
parameter and both move.
"""

from __future__ import annotations

from dataclasses import dataclass

import promql_parser

from ..alerts import AlertingRule, RulePack
from ..errors import ConfigError

__all__ = ["Threshold", "alert_threshold"]

_COMPARISONS = {">", ">=", "<", "<=", "==", "!="}
_SET_OPS = {"and", "or", "unless"}


@dataclass(frozen=True, slots=True)
class Threshold:
    """The comparison an alert fires on: ``op`` and ``value``, and its name and severity."""

    alert: str
    op: str
    value: float
    severity: str


def _constant(node: object) -> float | None:
    if isinstance(node, promql_parser.NumberLiteral):
        return float(node.val)
    if isinstance(node, promql_parser.ParenExpr):
        return _constant(node.expr)
    if isinstance(node, promql_parser.BinaryExpr):
        lhs, rhs, op = _constant(node.lhs), _constant(node.rhs), str(node.op)
        if lhs is None or rhs is None:
            return None
        ops = {"+": lhs + rhs, "-": lhs - rhs, "*": lhs * rhs}
        if op == "/" and rhs != 0:
            return lhs / rhs
        return ops.get(op)
    return None


def _comparison(node: object) -> tuple[str, float] | None:
    """The first comparison against a constant, reading set operations left first."""
    if isinstance(node, promql_parser.ParenExpr):
        return _comparison(node.expr)
    if not isinstance(node, promql_parser.BinaryExpr):
        return None
    op = str(node.op)
    if op in _COMPARISONS:
        value = _constant(node.rhs)
        if value is not None:
            return op, value
        return _comparison(node.lhs)
    if op in _SET_OPS:
        return _comparison(node.lhs) or _comparison(node.rhs)
    return None


def alert_threshold(pack: RulePack, alert: str) -> Threshold:
    """The threshold of ``alert`` in ``pack``; ``ConfigError`` when the pack has no such
    alert or its expression compares against no constant."""
    for group in pack.groups:
        for rule in group.rules:
            if isinstance(rule, AlertingRule) and rule.alert == alert:
                found = _comparison(promql_parser.parse(rule.expr))
                if found is None:
                    raise ConfigError(f"alert {alert!r} compares against no constant: {rule.expr}")
                severity = rule.labels.get("severity")
                return Threshold(
                    alert, found[0], found[1], "" if severity is None else str(severity.source)
                )
    raise ConfigError(f"the rule pack has no alert {alert!r}")
