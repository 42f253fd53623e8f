"""The value types of a diagnosis: events in, findings and a verdict out."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol

__all__ = [
    "Diagnosis",
    "Event",
    "EventLike",
    "EvidenceResult",
    "Finding",
    "Shape",
    "SignalDeviation",
    "Unseen",
]


class Shape(StrEnum):
    """DOMAIN.md section 3: the shape of the symptom, decided first."""

    HEALTHY = "healthy"
    UNAVAILABLE = "unavailable"
    WIDESPREAD_TIMEOUTS = "widespread_timeouts"
    INTERMITTENT_SPIKES = "intermittent_spikes"
    SEMANTIC_ANOMALIES = "semantic_anomalies"


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened at a time: a kernel line, an error-coded log, an alert.

    ``kind`` is ``kernel``, ``log``, ``alert`` or ``change`` (a deploy, a
    config push); ``fields`` carries structured values (``error_code``,
    ``pid``, ``gpu``) that evidence can match and runbooks can fill in.

    >>> Event(1700000000.0, "kernel", "NVRM: Xid 79, pid=4242").kind
    'kernel'
    """

    time: float
    kind: str
    text: str
    fields: Mapping[str, str] = field(default_factory=dict)


class EventLike(Protocol):
    """Anything shaped like an ``Event`` (e.g. ``aivitals.collect.Event`` from the agent)."""

    @property
    def time(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def fields(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class EvidenceResult:
    """One evidence item evaluated: did it hold, since when, with which values."""

    role: str  # required / supporting / contradicting
    says: str
    expr: str
    held: bool
    seen: bool
    since: float | None = None
    values: Sequence[tuple[Mapping[str, str], float]] = ()
    new: bool = False
    score: float = 0.0


@dataclass(frozen=True, slots=True)
class SignalDeviation:
    """A vital signal that left its baseline: when, which way, how strongly."""

    name: str
    layer: str
    labels: Mapping[str, str]
    first_deviation: float
    direction: str
    score: float
    baseline: float
    latest: float


@dataclass(frozen=True, slots=True)
class Unseen:
    """Something the diagnosis could not look at, and why."""

    what: str
    why: str


@dataclass(frozen=True, slots=True)
class Finding:
    """A ranked hypothesis: a fault signature (or an anomalous layer) with its evidence."""

    signature: str
    layer: str
    title: str
    confidence: float
    evidence: Sequence[EvidenceResult]
    first_deviation: float | None
    commands: Sequence[str]
    stop_loss: Sequence[str]
    timeline: Sequence[tuple[float, str]] = ()
    summary: str = ""
    #: Where: the location labels of the evidence that held (node, instance, gpu, pid,
    #: model...). ``scope`` is "local" (one machine, no location label), "node" (one node
    #: of a fleet) or "fleet" (the same fault on (nearly) every node: ``nodes`` lists them).
    where: Mapping[str, str] = field(default_factory=dict)
    scope: str = "local"
    nodes: Sequence[str] = ()
    #: Set by ``FindingMemory`` on the finding it holds first: when it took the lead, when
    #: its evidence last held, and since when its evidence could not be looked at.
    held_since: float | None = None
    evidence_seen: float | None = None
    evidence_unseen_since: float | None = None

    @property
    def held(self) -> list[EvidenceResult]:
        return [e for e in self.evidence if e.held]


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The verdict over one window; render it with ``to_json``/``to_markdown``/``to_html``.

    >>> d = diagnose(store)                      # doctest: +SKIP
    >>> d.findings[0].signature, d.findings[0].layer   # doctest: +SKIP
    ('gpu_memory_leak', 'model')
    """

    shape: Shape
    start: float
    end: float
    step: float
    findings: Sequence[Finding]
    deviations: Sequence[SignalDeviation]
    unseen: Sequence[Unseen]
    events: Sequence[Event] = ()
    layers: Mapping[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0
    #: Queries sent to the backend (bounded by the signatures, never by the fleet's size).
    queries: int = 0
    #: The label that names where (``node``), when the data has it: a fleet diagnosis.
    location: str | None = None
    #: Each node of the fleet and its verdict: "healthy", the signatures naming it,
    #: "fleet-wide: <signature>", or "scrape target down".
    nodes: Mapping[str, str] = field(default_factory=dict)

    @property
    def top(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = str(self.shape)
        return data

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def to_markdown(self) -> str:
        from ._render import to_markdown

        return to_markdown(self)

    def to_html(self) -> str:
        from ._render import to_html

        return to_html(self)

    def to_terminal(self) -> str:
        from ._render import to_terminal

        return to_terminal(self)
