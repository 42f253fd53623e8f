"""Findings with memory: a finding that led with high confidence keeps leading.

One diagnosis is a look at one window. Successive looks at the same incident (validate's
polls, the agent's live page, the console, a soak) can disagree for reasons that say
nothing about the incident: a rate that dipped for one scrape, a generic anomaly that
briefly outscored a signature, a query that timed out. An operator who reads "network
latency" and, five seconds later, "service anomaly" stops trusting both. So, the way an
alert's ``keep_firing_for`` works, a finding that led at ``HIGH_CONFIDENCE`` keeps its
place until its own evidence has been gone for the hold period:

- while its evidence still holds (the signature is still found), only a signature with
  more confidence displaces it; a generic anomaly or a weaker signature does not;
- once its evidence is gone (the signature not found for one rate window, the grace), a
  signature at high confidence may take its place: a new cause, fully evidenced; a
  generic anomaly or nothing at all does not, until the hold period (two rate windows)
  has passed since the evidence was last seen. Missing for less than the grace is not
  gone: a rate-based condition over bursty inputs can drop for up to one of its windows,
  so until then only a stronger signature displaces it, as while it is found;
- when its evidence could not be looked at (its queries failed, the backend was given
  up on), it keeps its hold and says "evidence unseen since", never dropped silently.

Evidence is judged over a window of samples by the engine itself (a condition holds when
it held in the window's recent span; a deviation is judged against its baseline), so one
noisy scrape neither makes nor breaks it. The hold period scales with the time scale: two
of the diagnosis's rate windows (two minutes at the shipped one-minute rate, 16 s in a
quick run's 8 s), since a rate forgets a burst within one window and a condition that is
gone for two of them is gone, not noisy.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from ._engine import HIGH_CONFIDENCE
from ._model import Diagnosis, Finding

__all__ = ["HOLD_RATE_WINDOWS", "LOOKS", "FindingMemory", "hold_for", "look_back"]

#: The hold period, in rate windows of the diagnosis (the time scale's unit).
HOLD_RATE_WINDOWS = 2.0
#: The diagnosis's rate window at the shipped time scale, seconds.
_DEFAULT_RATE = 60.0
_GENERIC = "anomaly_"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def hold_for(rate: float | None = None) -> float:
    """The hold period for a diagnosis whose rate window is ``rate`` seconds (None: the
    shipped minute): ``HOLD_RATE_WINDOWS`` of them."""
    r = _DEFAULT_RATE if rate is None else float(rate)
    if not (math.isfinite(r) and r > 0):
        raise ConfigError(f"hold_for: rate must be > 0 seconds, got {rate!r}")
    return HOLD_RATE_WINDOWS * r


def _key(f: Finding, location: str | None) -> tuple[str, str]:
    """A finding's identity across looks: its signature and, over a fleet, its node."""
    node = str(f.where.get(location, "")) if location else ""
    return f.signature, node if f.scope != "fleet" else "fleet"


def _generic(f: Finding) -> bool:
    return f.signature.startswith(_GENERIC)


def _unseen(held: Finding, d: Diagnosis) -> bool:
    """Whether ``d`` could not look at ``held``'s required evidence: a query of it failed,
    or the diagnosis stopped asking (the backend given up on, its time budget spent)."""
    exprs = [e.expr for e in held.evidence if e.role == "required"]
    names = {n for e in exprs for n in _NAME.findall(e)}
    for u in d.unseen:
        if u.why.startswith("not sent"):
            return True
        if "failed" in u.why and (u.what in exprs or names & set(_NAME.findall(u.what))):
            return True
    return False


@dataclass(slots=True)
class _Held:
    key: tuple[str, str]
    finding: Finding
    since: float
    seen: float
    unseen_since: float | None = None


class FindingMemory:
    """Successive diagnoses of one incident, with the leading finding held.

    Feed each fresh diagnosis, in time order, to :meth:`update`; it returns the same
    diagnosis with the held finding first, carrying ``held_since``, ``evidence_seen``
    and (when its queries failed) ``evidence_unseen_since``. One memory follows one
    stream of looks (a validate case, an agent, a console session); :meth:`reset` starts
    over (a new case).

    **Usage**::

        memory = FindingMemory(hold=hold_for(rate=8.0))     # a quick run: 16 s
        for t in poll_times:
            d = memory.update(diagnose(store, end=t, window=..., rate=8.0))
    """

    def __init__(
        self,
        hold: float | None = None,
        *,
        lead: float = HIGH_CONFIDENCE,
        grace: float | None = None,
    ) -> None:
        hold = hold_for() if hold is None else hold
        if not (isinstance(hold, int | float) and math.isfinite(hold) and hold >= 0):
            raise ConfigError(f"FindingMemory: hold must be >= 0 seconds, got {hold!r}")
        grace = hold / HOLD_RATE_WINDOWS if grace is None else grace
        if not (isinstance(grace, int | float) and math.isfinite(grace) and 0 <= grace <= hold):
            raise ConfigError(
                f"FindingMemory: grace must be between 0 and the hold ({hold:g} s), got {grace!r}"
            )
        if not (isinstance(lead, int | float) and 0 < lead <= 1):
            raise ConfigError(f"FindingMemory: lead must be in (0, 1], got {lead!r}")
        self.hold = float(hold)
        self.grace = float(grace)
        self.lead = float(lead)
        self._held: _Held | None = None
        self._last: float | None = None
        # the agent's HTTP handlers and the console's refreshes look from several threads
        self._lock = threading.Lock()

    def _gone(self, h: _Held, t: float) -> bool:
        """The held finding's evidence is gone: looked at, and not found for the grace."""
        return h.unseen_since is None and t - h.seen >= self.grace

    @property
    def held(self) -> Finding | None:
        """The finding held now (as last seen), or None."""
        return None if self._held is None else self._held.finding

    def reset(self) -> None:
        with self._lock:
            self._held = None
            self._last = None

    def update(self, d: Diagnosis) -> Diagnosis:
        """``d`` with the held finding first, or as it is when nothing is held.

        A look older than the last one remembered (two threads that diagnosed at once
        and report in the other order) is returned as it is and not remembered: memory
        only moves forward in time.
        """
        if not isinstance(d, Diagnosis):
            raise ConfigError(f"FindingMemory.update takes a Diagnosis, got {type(d).__name__}")
        with self._lock:
            if self._last is not None and float(d.end) < self._last:
                return d
            self._last = float(d.end)
            return self._update(d)

    def _update(self, d: Diagnosis) -> Diagnosis:
        t = float(d.end)
        findings = list(d.findings)
        h = self._held
        if h is not None:
            now = next((f for f in findings if _key(f, d.location) == h.key), None)
            if now is not None:
                h.finding, h.seen, h.unseen_since = now, t, None
            elif _unseen(h.finding, d):
                h.unseen_since = t if h.unseen_since is None else h.unseen_since
            top = findings[0] if findings else None
            if top is not None and _key(top, d.location) == h.key:
                pass  # it leads by itself
            elif now is not None:
                if _displaces(top, now.confidence, self.lead):
                    h = self._held = None
            elif _displaces(top, -1.0 if self._gone(h, t) else h.finding.confidence, self.lead):
                # its evidence is gone and a new cause is evidenced; evidence missing for
                # less than the grace, or that could not be looked at, is not gone: then
                # only a stronger cause takes over, as while it is still found
                h = self._held = None
            elif h.unseen_since is None and t - h.seen > self.hold:
                h = self._held = None  # gone for the hold period: released
        if h is None:
            top = findings[0] if findings else None
            if top is not None and not _generic(top) and top.confidence >= self.lead:
                self._held = _Held(_key(top, d.location), top, t, t)
            return _annotated(d, findings, self._held)
        rest = [f for f in findings if _key(f, d.location) != h.key]
        return _annotated(d, [h.finding, *rest], h)


def _displaces(top: Finding | None, held_confidence: float, lead: float) -> bool:
    """A challenger takes the lead: a signature (not a generic anomaly) at high confidence
    with more confidence than the held finding has now (-1 when its evidence is gone)."""
    return (
        top is not None
        and not _generic(top)
        and top.confidence >= lead
        and top.confidence > held_confidence
    )


def _annotated(d: Diagnosis, findings: list[Finding], h: _Held | None) -> Diagnosis:
    if h is not None and findings:
        findings[0] = dataclasses.replace(
            findings[0],
            held_since=h.since,
            evidence_seen=h.seen,
            evidence_unseen_since=h.unseen_since,
        )
    if list(d.findings) == findings:
        return d
    return dataclasses.replace(d, findings=findings)


#: Looks ``look_back`` takes over the hold period before the one at the window's end.
LOOKS = 4


def look_back(
    diagnose_at: Callable[[float], Diagnosis], end: float, hold: float, *, looks: int = LOOKS
) -> Diagnosis:
    """The diagnosis at ``end`` as a memory that had been looking would give it.

    One look at a window (``aivitals diagnose``, the console's "diagnose this window") has
    no earlier looks to remember, so it takes them: ``looks`` more, evenly spread over the
    hold period before ``end``, each through one ``FindingMemory``. ``hold`` 0 is one look.
    """
    if not (math.isfinite(hold) and hold >= 0):
        raise ConfigError(f"look_back: hold must be >= 0 seconds, got {hold!r}")
    if looks < 1:
        raise ConfigError(f"look_back: looks must be >= 1, got {looks!r}")
    memory = FindingMemory(hold)
    times = [end - hold * k / looks for k in range(looks, 0, -1)] if hold > 0 else []
    d: Diagnosis | None = None
    for t in [*times, end]:
        d = memory.update(diagnose_at(t))
    assert d is not None  # the look at ``end`` always runs
    return d
