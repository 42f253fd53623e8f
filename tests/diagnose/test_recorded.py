"""The diagnosis on REAL recorded validate runs (tests/fixtures/recordings), at validate's polls.

Each fixture once made the diagnosis flip between polls; the test asks it at the
moments validate would (from its fault-phase start, every 3 s, to the revert) and
requires what strict validate requires: once the fault is named first, every later
poll names it first too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aivitals.diagnose import diagnose
from aivitals.validate import load_recordings

FIXTURES = Path(__file__).parent.parent / "fixtures" / "recordings"
HELDOUT = Path(__file__).parent.parent.parent / "benchmarks" / "recordings" / "HELDOUT.txt"


def _polls(run: str, name: str) -> list[tuple[float, str]]:
    (rec,) = [r for r in load_recordings(FIXTURES / run) if r.name == name]
    assert rec.problems == ()
    t_base, t_fault, t_revert = (float(rec.label[k]) for k in ("t_baseline", "t_fault", "t_revert"))
    store = rec.store()
    out = []
    after = 5.0  # validate's quick fault_min, then a poll every 3 s
    while t_fault + after <= t_revert:
        end = t_fault + after
        d = diagnose(
            store,
            end=end,
            window=max(15.0, end - t_base),
            step=rec.tick,
            events=[e for e in rec.events if e.time <= end],
            alerts=[a for a in rec.alerts if a.at <= end],
            rate=rec.diagnosis_rate,
        )
        out.append((after, d.findings[0].signature if d.findings else "-"))
        after += 3.0
    return out


def test_the_fixtures_are_tuning_recordings() -> None:
    held = set(HELDOUT.read_text().split())
    names = {p.stem for p in FIXTURES.glob("*/*.json")}
    assert names and not names & held


@pytest.mark.parametrize(
    ("run", "name"), [("run8", "timeouts_not_aborting"), ("sweep8", "traffic_surge@moderate")]
)
def test_once_named_the_fault_stays_named(run: str, name: str) -> None:
    polls = _polls(run, name)
    fault = name.split("@")[0]  # a sweep's case is fault@severity
    named = [after for after, top in polls if top == fault]
    assert named, polls
    later = [(after, top) for after, top in polls if after >= named[0]]
    assert all(top == fault for _, top in later), polls
