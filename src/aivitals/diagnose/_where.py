"""Where a finding is: PromQL kept per node, series grouped by node, peers compared.

A fleet diagnosis asks each question once for the whole fleet (no per-node or
per-series fan-out): every aggregation of a signature or vital keeps the
location label (``sum(x)`` becomes ``sum by (node) (x)``, ``on ()`` becomes
``on (node)``), so one answer holds every node's series, and the engine reads
each node's share of it. Series without the label (a shared exporter) belong to
every node.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

import numpy as np
import promql_parser

__all__ = [
    "DIALECTS",
    "WHERE_KEYS",
    "in_pod",
    "localize",
    "node_of",
    "peer_outlier",
    "peer_outliers",
    "per_node",
    "to_dialect",
    "where_of",
]

#: Labels that say where: copied from the evidence onto a finding's ``where``.
WHERE_KEYS = (
    "node",
    "instance",
    "job",
    "gpu",
    "uuid",
    "pid",
    "process",
    "model",
    "namespace",
    "pod",
    "pod_uid",
)


def in_pod(labels: Mapping[str, str]) -> str:
    """`` in pod <namespace>/<pod>`` for a process the GPU collector placed in a Kubernetes
    pod (`` in pod uid <uid>`` when the pod was not named), else "" (the ``{in_pod}`` of a
    signature's text, after a ``{pid}``).

    Only a label set with ``pod_uid``, which the GPU collector alone sets, names a pod:
    the ``namespace`` and ``pod`` a scrape adds as target labels (the service's own pod)
    say nothing about which pod a pid runs in.

    >>> in_pod({"pid": "4242", "pod_uid": "6f1c", "namespace": "team-a", "pod": "llm-0"})
    ' in pod team-a/llm-0'
    >>> in_pod({"pid": "4242", "namespace": "team-a", "pod": "api-0"})
    ''
    """
    uid = labels.get("pod_uid")
    if not uid:
        return ""
    pod, ns = labels.get("pod"), labels.get("namespace")
    if pod:
        return f" in pod {ns}/{pod}" if ns else f" in pod {pod}"
    return f" in pod uid {uid}"


_AGG = re.compile(
    r"\b(sum|min|max|avg|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)\b"
    r"(?P<mod>\s*(?:by|without)\s*\([^()]*\))?\s*\("
)
_TRAILING = re.compile(r"\s*(by|without)\s*\(([^()]*)\)")
_ON = re.compile(r"\bon\s*\(([^()]*)\)")


def _close(text: str, open_at: int) -> int:
    """Index of the parenthesis closing the one at ``open_at`` (strings skipped)."""
    depth, i, quote = 0, open_at, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'`":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _with(labels: str, label: str) -> str:
    names = [x.strip() for x in labels.split(",") if x.strip()]
    return ", ".join(names if label in names else [*names, label])


@functools.lru_cache(maxsize=4096)
def localize(expr: str, label: str) -> str:
    """``expr`` with every aggregation and ``on (...)`` match keeping ``label``.

    >>> localize("histogram_quantile(0.99, sum by (le) (rate(x[1m])))", "node")
    'histogram_quantile(0.99, sum by (le, node) (rate(x[1m])))'
    >>> localize("max(a / b)", "node")
    'max by (node) (a / b)'

    ``without`` clauses keep the label already; an expression that would not parse
    after the rewrite is returned unchanged (and stays a fleet-wide question).
    """
    out = expr
    pos = 0
    while True:
        m = _AGG.search(out, pos)
        if m is None:
            break
        mod = m.group("mod")
        paren = m.end() - 1
        if mod is not None:
            if mod.strip().startswith("by"):
                inner = mod[mod.index("(") + 1 : mod.rindex(")")]
                new_mod = f" by ({_with(inner, label)}) "
                out = out[: m.start("mod")] + new_mod + out[m.end("mod") :].lstrip()
            pos = m.start() + 1
            continue
        close = _close(out, paren)
        if close < 0:
            return expr
        trailing = _TRAILING.match(out, close + 1)
        if trailing is not None:
            if trailing.group(1) == "by":
                clause = f" by ({_with(trailing.group(2), label)})"
                out = out[: close + 1] + clause + out[trailing.end() :]
        else:
            out = out[: m.end(1)] + f" by ({label}) " + out[m.end(1) :].lstrip()
        pos = m.start() + 1
    out = _ON.sub(lambda mm: f"on ({_with(mm.group(1), label)})", out)
    try:
        promql_parser.parse(out)
    except ValueError:
        return expr
    return out


#: Query languages a backend may speak: PromQL, or VictoriaMetrics' MetricsQL.
DIALECTS = ("promql", "metricsql")
# MetricsQL's changes(), increase() and delta() also count a series' first sample in the
# window (a node started 5 minutes ago "changed" in the last 10); its *_prometheus
# variants keep Prometheus' semantics, so both engines give the same answer.
_METRICSQL = re.compile(r"\b(changes|increase|delta)\s*\(")


def to_dialect(expr: str, dialect: str) -> str:
    """``expr`` as the backend's language wants it (what is sent, not what is reported)."""
    if dialect == "metricsql":
        return _METRICSQL.sub(lambda m: f"{m.group(1)}_prometheus(", expr)
    return expr


def per_node(expr: str, label: str) -> bool:
    """True when every series of ``expr``'s answer is at most one per ``label`` value: each
    selector is under an aggregation ``by`` that label (and ``le``, which
    ``histogram_quantile`` consumes). Asking such an expression per node changes nothing."""
    try:
        ast = promql_parser.parse(expr)
    except ValueError:
        return False
    return _coarse(ast, {label, "le"})


def _coarse(node: object, allowed: set[str]) -> bool:
    p = promql_parser
    if isinstance(node, p.AggregateExpr):
        mod = node.modifier
        if mod is not None and mod.type == p.AggModifierType.By:
            return set(mod.labels) <= allowed
        return mod is None  # sum(x): one series; without (...): what is left is unknown
    if isinstance(node, p.BinaryExpr):
        return _coarse(node.lhs, allowed) and _coarse(node.rhs, allowed)
    if isinstance(node, p.Call):
        return all(_coarse(a, allowed) for a in node.args)
    if isinstance(node, p.ParenExpr | p.UnaryExpr):
        return _coarse(node.expr, allowed)
    return isinstance(node, p.NumberLiteral | p.StringLiteral)


def node_of(labels: Mapping[str, str], label: str) -> str:
    """The node a series belongs to; "" for a series without the label (every node's)."""
    return labels.get(label, "")


def where_of(labels: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The location labels of held evidence: each key's first value, in WHERE_KEYS order."""
    found: dict[str, str] = {}
    for lab in labels:
        for k in WHERE_KEYS:
            if k in lab and k not in found:
                found[k] = str(lab[k])
    return {k: found[k] for k in WHERE_KEYS if k in found}


def peer_outlier(values: Mapping[str, float], node: str) -> tuple[float, float, float] | None:
    """How far ``node``'s value stands from its peers': (score, value, peers' median).

    The score is the distance from the peers' median in robust spreads (MAD, floored
    at 5 % of the median so a flat fleet does not make noise infinite). None when
    fewer than two peers have a value.
    """
    return peer_outliers(values).get(node)


#: From this many nodes on, the peers of each node are taken as the whole fleet (one
#: median for all, instead of one per node without it: the same to within 1/N).
_SHARED_PEERS = 32


def peer_outliers(values: Mapping[str, float]) -> dict[str, tuple[float, float, float]]:
    """``peer_outlier`` for every node at once (one median for a large fleet)."""
    finite = {k: float(v) for k, v in values.items() if np.isfinite(v)}
    out: dict[str, tuple[float, float, float]] = {}
    if len(finite) < 3:
        return out
    if len(finite) >= _SHARED_PEERS:
        arr = np.fromiter(finite.values(), dtype=np.float64, count=len(finite))
        med = float(np.median(arr))
        scale = _scale(arr, med)
        return {k: (abs(v - med) / scale, v, med) for k, v in finite.items()}
    for node, value in finite.items():
        peers = np.array([v for k, v in finite.items() if k != node])
        med = float(np.median(peers))
        out[node] = (abs(value - med) / _scale(peers, med), value, med)
    return out


def _scale(peers: np.ndarray, med: float) -> float:
    spread = float(np.median(np.abs(peers - med))) * 1.4826
    return max(spread, 0.05 * abs(med), 1e-12)
