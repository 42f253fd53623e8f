"""The knowledge base: fault signatures as YAML data, validated at load.

A signature file holds one mapping or a list of them::

    id: gpu_memory_leak
    layer: model                      # model / service / infrastructure / business
    title: GPU memory leak in pid {pid}
    shapes: [widespread_timeouts]
    params: {growth_bytes_per_s: 2e6}
    required:
      - expr: delta(gpu_process_memory_used_bytes[5m]) / 300 > ${growth_bytes_per_s}
        says: One process's GPU memory keeps growing.
    supporting:
      - expr: histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket[5m])))
        deviation: up                 # judged by the detector against its own baseline
        says: P99 latency rose above its baseline.
    contradicting: [...]
    events:                           # kernel lines, logs, alerts (regex on the text)
      - {kind: kernel, match: 'Xid.*\\b79\\b', says: ..., role: required}
    commands: ["nvidia-smi --query-compute-apps=pid,used_memory --format=csv",
               "py-spy dump --pid {pid}"]
    stop_loss: ["Drain and restart pid {pid}."]
    prior: 1.0                        # how much a match alone says (lower for symptom-only ones)

``${name}`` is a threshold from ``params`` (overridable per call), the
engine's ``${rate}`` window or ``${rate_seconds}``, that window in seconds (a horizon
written in windows, ``${windows} * ${rate_seconds}``, shrinks with a compressed run's
window, as an amount over a window must); ``{label}`` in titles, commands and stop-loss is
filled from the labels of the evidence that held. Every expression is parsed
with promql-parser at load: a bad one raises ``SignatureError`` naming the id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from ..errors import SignatureError

__all__ = ["EventEvidence", "Evidence", "Signature", "load_signatures", "parse_signatures"]

LAYERS = ("model", "service", "infrastructure", "business")
SHAPES = ("unavailable", "widespread_timeouts", "intermittent_spikes", "semantic_anomalies")
ROLES = ("required", "supporting", "contradicting")
_PARAM = re.compile(r"\$\{(\w+)\}")


@dataclass(frozen=True, slots=True)
class Evidence:
    """One PromQL evidence item. ``deviation`` None means "holds when the result is non-empty"."""

    role: str
    expr: str
    says: str
    deviation: str | None = None
    min_change: float = 0.0
    recent: float = 300.0


@dataclass(frozen=True, slots=True)
class EventEvidence:
    """Evidence found in events (kernel lines, logs, alerts) by regex on their text."""

    role: str
    kind: str
    match: str
    says: str

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.match)


@dataclass(frozen=True, slots=True)
class Signature:
    id: str
    layer: str
    title: str
    summary: str
    shapes: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    events: tuple[EventEvidence, ...]
    commands: tuple[str, ...]
    stop_loss: tuple[str, ...]
    params: Mapping[str, float] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    prior: float = 1.0

    def of_role(self, role: str) -> list[Evidence]:
        return [e for e in self.evidence if e.role == role]

    def render(self, params: Mapping[str, float] | None = None, rate: str = "1m") -> Signature:
        """The signature with ``${...}`` filled in: its params, overrides, and the rate window."""
        values = {**self.params, **(params or {})}
        evidence = tuple(
            Evidence(
                e.role,
                _fill(self.id, e.expr, values, rate),
                e.says,
                e.deviation,
                e.min_change,
                e.recent,
            )
            for e in self.evidence
        )
        return Signature(
            self.id,
            self.layer,
            self.title,
            self.summary,
            self.shapes,
            evidence,
            self.events,
            self.commands,
            self.stop_loss,
            self.params,
            self.aliases,
            self.prior,
        )


def _fill(sig: str, expr: str, values: Mapping[str, float], rate: str) -> str:
    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key == "rate":
            return rate
        if key == "rate_seconds":
            return _number(promql_parser.parse_duration(rate).total_seconds())
        if key not in values:
            raise SignatureError(sig, f"expression uses ${{{key}}} but params has no {key!r}")
        return _number(values[key])

    return _PARAM.sub(sub, expr)


def _number(value: float) -> str:
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def parse_signatures(text: str, *, source: str = "<text>") -> list[Signature]:
    """Signatures from YAML text; validates every field and every expression."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SignatureError(source, f"not valid YAML: {exc}") from exc
    items = data if isinstance(data, list) else [data]
    return [_signature(item, source) for item in items if item is not None]


def load_signatures(
    paths: Iterable[str | Path] | None = None, *, include_builtin: bool = True
) -> list[Signature]:
    """The shipped knowledge base plus any extra YAML files or directories.

    >>> sigs = load_signatures()
    >>> len(sigs) >= 25
    True
    """
    sigs: list[Signature] = []
    if include_builtin:
        root = resources.files("aivitals.diagnose") / "signatures"
        for entry in sorted(root.iterdir(), key=lambda p: p.name):
            if entry.name.endswith((".yaml", ".yml")):
                sigs += parse_signatures(entry.read_text(), source=entry.name)
    for path in paths or ():
        p = Path(path)
        if not p.exists():
            raise SignatureError(str(p), "no such file or directory")
        files = sorted(p.glob("*.y*ml")) if p.is_dir() else [p]
        for f in files:
            sigs += parse_signatures(f.read_text(), source=str(f))
    _check_unique(sigs)
    return sigs


def _check_unique(sigs: Sequence[Signature]) -> None:
    seen: set[str] = set()
    for s in sigs:
        if s.id in seen:
            raise SignatureError(s.id, "defined twice")
        seen.add(s.id)


def _signature(item: Any, source: str) -> Signature:
    if not isinstance(item, dict):
        raise SignatureError(source, f"a signature must be a mapping, got {type(item).__name__}")
    sid = item.get("id")
    if not isinstance(sid, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", sid):
        raise SignatureError(source, f"id must be a lower_snake_case string, got {sid!r}")
    unknown = set(item) - {
        "id",
        "layer",
        "title",
        "summary",
        "shapes",
        "params",
        "commands",
        "stop_loss",
        "events",
        "aliases",
        "prior",
        *ROLES,
    }
    if unknown:
        raise SignatureError(sid, f"unknown keys {sorted(unknown)}")
    layer = item.get("layer")
    if layer not in LAYERS:
        raise SignatureError(sid, f"layer must be one of {LAYERS}, got {layer!r}")
    shapes = tuple(item.get("shapes") or ())
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        raise SignatureError(sid, f"unknown shapes {bad}; known: {SHAPES}")
    params = _params(sid, item.get("params") or {})
    evidence = tuple(
        _evidence(sid, role, e, params) for role in ROLES for e in item.get(role) or ()
    )
    events = tuple(_event(sid, e) for e in item.get("events") or ())
    if not any(e.role == "required" for e in evidence) and not any(
        e.role == "required" for e in events
    ):
        raise SignatureError(sid, "needs at least one required evidence item")
    return Signature(
        id=sid,
        layer=layer,
        title=_text(sid, item, "title"),
        summary=str(item.get("summary") or ""),
        shapes=shapes,
        evidence=evidence,
        events=events,
        commands=tuple(str(c) for c in item.get("commands") or ()),
        stop_loss=tuple(str(c) for c in item.get("stop_loss") or ()),
        params=params,
        aliases=tuple(str(a) for a in item.get("aliases") or ()),
        prior=_prior(sid, item.get("prior", 1.0)),
    )


def _prior(sid: str, raw: Any) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise SignatureError(sid, f"prior must be a number in (0, 1], got {raw!r}")
    return value


def _text(sid: str, item: Mapping[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise SignatureError(sid, f"{key} must be a non-empty string, got {value!r}")
    return value


def _params(sid: str, raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise SignatureError(sid, f"params must be a mapping, got {raw!r}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            raise SignatureError(sid, f"param {key!r} must be a number, got {value!r}") from None
    return out


def _evidence(sid: str, role: str, raw: Any, params: Mapping[str, float]) -> Evidence:
    if not isinstance(raw, dict) or "expr" not in raw or "says" not in raw:
        raise SignatureError(sid, f"{role} evidence needs expr and says, got {raw!r}")
    expr, says = str(raw["expr"]), str(raw["says"])
    deviation = raw.get("deviation")
    if deviation not in (None, "up", "down", "any"):
        raise SignatureError(sid, f"deviation must be up, down or any, got {deviation!r}")
    try:
        promql_parser.parse(_fill(sid, expr, params, "1m"))
    except ValueError as exc:
        raise SignatureError(sid, f"invalid PromQL {expr!r}: {exc}") from None
    return Evidence(
        role,
        expr,
        says,
        deviation,
        float(raw.get("min_change", 0.0)),
        float(raw.get("recent", 300.0)),
    )


def _event(sid: str, raw: Any) -> EventEvidence:
    if not isinstance(raw, dict) or not {"kind", "match", "says"} <= set(raw):
        raise SignatureError(sid, f"event evidence needs kind, match and says, got {raw!r}")
    role = str(raw.get("role", "supporting"))
    if role not in ROLES:
        raise SignatureError(sid, f"event role must be one of {ROLES}, got {role!r}")
    try:
        re.compile(str(raw["match"]))
    except re.error as exc:
        raise SignatureError(sid, f"invalid event regex {raw['match']!r}: {exc}") from None
    return EventEvidence(role, str(raw["kind"]), str(raw["match"]), str(raw["says"]))
