"""Replay a recorded validate case poll by poll, as validate asked, and count its flips.

A live validate run finds a top finding that flips between polls only by chance, and
only now and then; a recording replays the same looks at the same data every time. So
every recording is replayed at the polls validate made (its label's ``polls``; the
validate poll period for a recording made before they were kept, and the replay says
so), through the same ``FindingMemory`` validate's polls go through, and the top
finding's changes after the first correct poll are counted: a flip is an operator
reading one cause and, a poll later, another.

**Usage**::

    for rec in load_recordings(Path("benchmarks/recordings")):
        if replayable(rec):
            r = replay(rec)
            print(rec.name, r.first, r.flips, r.timed)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..diagnose import FindingMemory
from ..errors import ConfigError
from ._config import ValidateConfig
from ._record import MIN_DIAGNOSIS_WINDOW, Recording, _settings
from ._runner import poll_times

__all__ = ["Replay", "ReplayedPoll", "count_flips", "replay", "replayable"]

#: Kinds a replay judges: the diagnosis names a signature (the generic ranking of a fault
#: no signature knows, and a soak's healthy polls, are judged elsewhere).
KINDS = ("fault", "pair")


@dataclass(frozen=True, slots=True)
class ReplayedPoll:
    """One replayed poll: seconds after the fault, the answer, and whether it is the fault."""

    after_s: float
    top: str
    confidence: float
    matched: bool
    #: nothing at high confidence (a one-time event that has passed may go quiet)
    quiet: bool


@dataclass(frozen=True, slots=True)
class Replay:
    name: str
    polls: Sequence[ReplayedPoll]
    #: index of the first poll that named the fault (None: never)
    first: int | None
    flips: int
    #: True when the poll times are the ones validate made; False when the recording
    #: kept none and the polls were replayed at validate's poll period
    timed: bool
    memory: bool


def replayable(rec: Recording) -> bool:
    """A recording a replay judges: a fault or a pair with data fit to diagnose."""
    return rec.kind in KINDS and not rec.problems


def _answer(p: ReplayedPoll, pair: bool, event: bool) -> str:
    # a pair is judged on both faults in the top three, so its answer is that alone; a
    # one-time event that has passed may go quiet, which validate accepts as the same answer
    if pair:
        return "matched" if p.matched else p.top
    if event and p.quiet and not p.matched:
        return "quiet"
    return p.top


def count_flips(polls: Sequence[ReplayedPoll], *, pair: bool = False, event: bool = False) -> int:
    """Changes of the answer after the first poll that named the fault.

    A one-time event that went quiet after it was named has not flipped (validate's
    rule), unless it is named again after going quiet, or something else is.
    """
    first = next((i for i, p in enumerate(polls) if p.matched), None)
    if first is None:
        return 0
    answers = [_answer(p, pair, event) for p in polls[first:]]
    named = answers[0]
    flips = 0
    for prev, cur in itertools.pairwise(answers):
        if cur == prev:
            continue
        if event and prev == named and cur == "quiet":
            continue  # the event passed
        flips += 1
    return flips


def replay(rec: Recording, *, memory: bool | FindingMemory = True) -> Replay:
    """Diagnose ``rec`` at each of validate's polls over its fault phase and judge them.

    ``memory`` (default) sends the polls through one ``FindingMemory`` with the hold of
    the recording's time scale, as validate does; False replays bare diagnoses; a
    ``FindingMemory`` of the caller's is used as given.
    Raises ``ConfigError`` for a recording a replay does not judge (``replayable``).
    """
    from ..chaos import FAULT_TABLE
    from ..diagnose import HIGH_CONFIDENCE, diagnose, hold_for

    if not replayable(rec):
        why = "; ".join(rec.problems) if rec.problems else f"kind {rec.kind!r}"
        raise ConfigError(f"recording {rec.name}: not replayable ({why})")
    label = rec.label
    least = float(_settings(label).get("min_window_s", MIN_DIAGNOSIS_WINDOW))
    t_base, t_fault = float(label["t_baseline"]), float(label["t_fault"])
    end, _ = rec.diagnosis_window()
    times = [e for e, _ in rec.polls]
    timed = bool(times)
    if not timed:
        times = poll_times(t_fault, end, ValidateConfig(quick=bool(label.get("quick"))))
    store = rec.store()
    if isinstance(memory, FindingMemory):
        mem: FindingMemory | None = memory
    else:
        mem = FindingMemory(hold_for(rec.diagnosis_rate)) if memory else None
    expected = [str(x) for x in label["expected"]]
    pair = rec.kind == "pair"
    polls: list[ReplayedPoll] = []
    for t in times:
        d = diagnose(
            store,
            end=t,
            window=max(least, t - t_base),
            step=rec.tick,
            alerts=[a for a in rec.alerts if a.at <= t],
            events=[e for e in rec.events if e.time <= t],
            rate=rec.diagnosis_rate,
        )
        if mem is not None:
            d = mem.update(d)
        top = d.findings[0] if d.findings else None
        if pair:
            matched = set(expected) <= {f.signature for f in d.findings[:3]}
        else:
            layer = label.get("layer")
            matched = (
                top is not None
                and top.signature == expected[0]
                and (layer is None or str(top.layer).lower() == layer)
            )
        polls.append(
            ReplayedPoll(
                round(t - t_fault, 1),
                top.signature if top is not None else "nothing",
                round(top.confidence, 3) if top is not None else 0.0,
                matched,
                not any(f.confidence >= HIGH_CONFIDENCE for f in d.findings),
            )
        )
    infos = [FAULT_TABLE.get(f) for f in label.get("faults", ())]
    event = not pair and bool(infos) and all(i is not None and i.event for i in infos)
    first = next((i for i, p in enumerate(polls) if p.matched), None)
    flips = count_flips(polls, pair=pair, event=event)
    return Replay(rec.name, polls, first, flips, timed, mem is not None)
