"""Every recorded run, replayed poll by poll as validate asked: no flips after the first
correct poll. A live run shows a flip by chance; a replay shows it every time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aivitals.errors import ConfigError
from aivitals.validate import ReplayedPoll, count_flips, load_recordings, replay, replayable
from aivitals.validate._runner import poll_times

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = [
    ROOT / "benchmarks" / "recordings",
    *sorted(p for p in (ROOT / "tests" / "fixtures" / "recordings").iterdir() if p.is_dir()),
]
RECORDINGS = [r for folder in FOLDERS for r in load_recordings(folder) if replayable(r)]


def test_the_corpus_is_there() -> None:
    # 23 faults at four magnitudes, the pairs and the fixtures: a replay over nothing passes
    assert len(RECORDINGS) >= 80


@pytest.mark.parametrize(
    "rec", RECORDINGS, ids=[f"{r.path.parent.name}/{r.name}" for r in RECORDINGS]
)
def test_no_flip_after_the_first_correct_poll(rec: object) -> None:
    r = replay(rec)  # type: ignore[arg-type]
    shown = " | ".join(f"{p.after_s:g}s {p.top} {p.confidence:.2f}" for p in r.polls)
    assert r.flips == 0, f"{r.name}: {r.flips} flips: {shown}"


def test_without_memory_the_recorded_flips_come_back() -> None:
    """The memory is what holds these answers: the bare diagnoses flip (so the test above
    can fail, and says why it passes)."""
    flipped = []
    for name in ("gpu_contention@threshold", "overlong_inputs@threshold"):
        rec = next(r for r in RECORDINGS if r.name == name and "benchmarks" in str(r.path))
        bare, held = replay(rec, memory=False), replay(rec)
        assert held.flips == 0 and held.first == bare.first
        flipped.append(bare.flips)
    assert all(f >= 1 for f in flipped), flipped


def test_a_held_finding_missing_for_one_poll_is_not_gone() -> None:
    """A live run named timeouts_not_aborting at 1.00, missed its evidence for one poll
    (cpu_bound_preprocessing 0.75 led), then named it again: the memory holds it. The
    weaker cause is now a lead: the hung model calls raised the model's own time per
    request with the CPU, which contradicts preprocessing. So the recording no longer
    shows the grace itself (``FindingMemory(grace=0)`` holds too); the synthetic looks of
    ``tests/diagnose/test_memory.py`` do."""
    from aivitals.diagnose import FindingMemory, hold_for

    rec = next(r for r in RECORDINGS if r.path.parent.name.endswith("one-poll-gone"))
    hold = hold_for(rec.diagnosis_rate)
    bare = replay(rec, memory=False)
    assert bare.flips == 2
    gap = bare.polls[3]
    assert gap.top == "cpu_bound_preprocessing" and gap.confidence < 0.5, gap
    assert replay(rec, memory=FindingMemory(hold, grace=0.0)).flips == 0
    held = replay(rec)
    assert held.flips == 0 and all(p.top == "timeouts_not_aborting" for p in held.polls[1:])


def test_a_blocked_loop_is_not_read_as_network_latency() -> None:
    """A blocked event loop slows the callers' probe and the agent's loopback scrape alike;
    network latency slows only the callers' path. The loopback scrape contradicts
    network_latency on the blocked loop's recording and never on network_latency's own."""
    from aivitals.diagnose import HIGH_CONFIDENCE, diagnose

    def finding(rec: object, after_s: float) -> object:
        label = rec.label  # type: ignore[attr-defined]
        t = float(label["t_fault"]) + after_s
        d = diagnose(
            rec.store(),  # type: ignore[attr-defined]
            end=t,
            window=max(15.0, t - float(label["t_baseline"])),
            step=rec.tick,  # type: ignore[attr-defined]
            alerts=[a for a in rec.alerts if a.at <= t],  # type: ignore[attr-defined]
            rate=rec.diagnosis_rate,  # type: ignore[attr-defined]
        )
        return next(f for f in d.findings if f.signature == "network_latency")

    def loopback_held(f: object) -> bool:
        return any(
            e.role == "contradicting" and "loopback" in e.says and e.held
            for e in f.evidence  # type: ignore[attr-defined]
        )

    blocked = next(r for r in RECORDINGS if r.path.parent.name.endswith("scrapes-time-out"))
    f = finding(blocked, 8.2)  # the probe waits on the loop: its required evidence holds
    assert loopback_held(f) and f.confidence < HIGH_CONFIDENCE  # type: ignore[attr-defined]
    assert replay(blocked).polls[2].top == "event_loop_blocked"  # named from 11 s, not 17
    for rec in RECORDINGS:
        if rec.name.split("@")[0] == "network_latency":
            r = replay(rec)
            assert r.first is not None, rec.name
            f = finding(rec, r.polls[r.first].after_s)
            assert not loopback_held(f), rec.name


def _poll(top: str, matched: bool, quiet: bool = False) -> ReplayedPoll:
    return ReplayedPoll(0.0, top, 0.9, matched, quiet)


def test_count_flips() -> None:
    a, b, n = _poll("a", True), _poll("b", False), _poll("anomaly_service", False, quiet=True)
    assert count_flips([b, a, a, a]) == 0  # wrong before the first correct one is no flip
    assert count_flips([a, b, a]) == 2
    assert count_flips([b, b]) == 0  # never correct: a miss, not a flip
    assert count_flips([a, n, n], event=True) == 0  # a one-time event went quiet
    assert count_flips([a, n, a], event=True) == 1  # ... and was named again
    assert count_flips([a, n], event=False) == 1
    p, q = _poll("x", True), _poll("y", True)
    assert count_flips([p, q, p], pair=True) == 0  # both in the top three throughout


def test_recorded_poll_times_are_replayed_and_missing_ones_said(tmp_path: Path) -> None:
    rec = next(r for r in RECORDINGS if r.name == "gpu_xid" and "benchmarks" in str(r.path))
    # a recording made before validate kept its polls: the validate poll period, said so
    old = replay(rec)
    assert not old.timed
    t_fault, end = float(rec.label["t_fault"]), rec.diagnosis_window()[0]
    period = poll_times(t_fault, end, rec_config(rec))
    assert [p.after_s for p in old.polls] == [round(t - t_fault, 1) for t in period]
    # one that kept them: replayed at exactly those
    doc = json.loads(rec.label_path.read_text())
    doc["label"]["polls"] = [[t_fault + 6.5, 20.0], [t_fault + 10.2, 24.0]]
    shutil.copy(rec.path, tmp_path / rec.path.name)
    (tmp_path / rec.label_path.name).write_text(json.dumps(doc))
    (timed,) = load_recordings(tmp_path)
    got = replay(timed)
    assert got.timed and [p.after_s for p in got.polls] == [6.5, 10.2]


def rec_config(rec: object) -> object:
    from aivitals.validate import ValidateConfig

    return ValidateConfig(quick=bool(rec.label.get("quick")))  # type: ignore[attr-defined]


def test_a_recording_that_is_not_replayable_is_refused() -> None:
    soak = next(r for f in FOLDERS[1:] for r in load_recordings(f) if r.kind == "soak")
    assert not replayable(soak)
    with pytest.raises(ConfigError, match="not replayable"):
        replay(soak)
