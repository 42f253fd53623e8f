"""The fault table: one row per fault, the data ``validate`` checks against, read from
each fault's spec (``FaultSpec``, beside its implementation).

``signature`` is the id the diagnosis must name as its top finding, or None
for a fault the knowledge base has no signature for: then the diagnosis's
generic part must name ``layer`` and rank one of ``suspects`` (metric names)
among its top three changed series. ``alerts`` are names from the shipped
rule pack (``aivitals/alerts/rules/aivitals-rules.yml``) that should fire
while the fault runs; an empty ``alerts`` means no signal the service side
collects moves for that fault (the description says why) and only the
diagnosis is checked.

Strict validation reads two more columns. ``hurts_clients``: the fault must
show in what the clients measure (P99 or errors); faults that only build up
(a leak before it exhausts memory) or that the service absorbs (rejected bad
inputs, idle connections) need not. ``consequences``: the other alerts the fault
legitimately causes (a surge's 429s, an idle GPU behind a blocked event
loop), each with ``reasons[alert]``, the one-line mechanism by which the fault
causes it (a spec without one is refused when it is made); any other P0/P1 alert
that fires during the fault is a false alert.
``event``: a one-time event whose effect passes by itself (a cold start: the next
requests pay the load, then the service is warm); once it has passed, a diagnosis
that names nothing is right, one that names another fault is not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ._spec import FaultSpec

__all__ = ["FaultInfo", "build_table"]


@dataclass(frozen=True, slots=True)
class FaultInfo:
    name: str
    layer: str
    signature: str | None
    alerts: tuple[str, ...]
    description: str
    hurts_clients: bool = False
    consequences: tuple[str, ...] = ()
    suspects: tuple[str, ...] = ()
    event: bool = False
    #: consequence -> the mechanism by which the fault causes it
    reasons: Mapping[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, spec: FaultSpec) -> FaultInfo:
        """The table row of ``spec``."""
        return cls(
            spec.name,
            spec.layer,
            spec.signature,
            spec.alerts,
            spec.description,
            hurts_clients=spec.hurts_clients,
            consequences=tuple(spec.consequences),
            suspects=spec.suspects,
            event=spec.event,
            reasons=dict(spec.consequences),
        )


def build_table(specs: Iterable[FaultSpec]) -> dict[str, FaultInfo]:
    """name -> FaultInfo, in the order of ``specs``."""
    return {s.name: FaultInfo.of(s) for s in specs}
