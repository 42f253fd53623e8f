"""Discrete events (an Xid, an OOM kill, a hung task) handed to the diagnosis."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Event"]


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened once, with when, what kind, the raw text and parsed fields.

    ``kind`` is ``kernel`` for a kernel log line (``fields["rule"]`` says which
    rule matched: ``xid``, ``oom``, ``hung_task``, ``io_error``) and ``gpu``
    for an Xid the GPU backend saw (NVML event API, the sim GPU). The shape is
    the one ``aivitals.diagnose`` takes as events.

    **Usage**::

        Event(time=1700000000.0, kind="kernel", text="NVRM: Xid ...", fields={"xid": "79"})
    """

    time: float
    kind: str
    text: str
    fields: Mapping[str, str] = field(default_factory=dict)
