"""Recordings of validate scenarios: round trip, refusals, gaps and missing families.

The stores are real ``aivitals.tsdb.Store``s filled with the SYNTHETIC service of
``tests/diagnose/_corpus.py`` (every family a demo stack exports, ``up`` each
second), cut where a test needs a hole.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aivitals.diagnose import Event, diagnose, load_signatures
from aivitals.errors import ConfigError, StoreError
from aivitals.tsdb import Store, parse_duration
from aivitals.validate._record import (
    HISTORY,
    MAX_GAP_TICKS,
    REQUIRED_FAMILIES,
    SNAPSHOT_SUFFIX,
    load_recordings,
    save_recording,
)
from tests._paths import load_script
from tests.diagnose import _corpus as corpus


@dataclasses.dataclass(frozen=True)
class _Alert:
    """Shaped like ``aivitals.alerts.AlertEvent`` (what ``RuleEngine.history`` returns)."""

    alertname: str
    labels: dict[str, str]
    state: str
    active_at: float
    fired_at: float | None
    resolved_at: float | None


def _store(
    fault: str | None = "gpu_memory_leak",
    *,
    hole: tuple[float, float] | None = None,
    hole_only: str | None = None,
    drop: tuple[str, ...] = (),
    duration: float = 360.0,
) -> tuple[Store, Any]:
    """A 6-minute synthetic run (or ``duration`` s), the fault in its last 2 minutes.

    ``hole``: seconds (from the start) without any sample, or, with ``hole_only``,
    without samples of that one metric; ``drop``: name prefixes never stored.
    """
    sc = corpus.scenario(fault, seed=1, duration=duration, after=120, distractor=False)
    store = Store(retention=7200.0)
    for name, labels, ts, vals in corpus.samples(sc):
        if name.startswith(drop) if drop else False:
            continue
        keep = np.ones(len(ts), dtype=bool)
        if hole is not None and (hole_only is None or name == hole_only):
            keep = (ts < sc.start + hole[0]) | (ts >= sc.start + hole[1])
        for t, v in zip(ts[keep].tolist(), vals[keep].tolist(), strict=True):
            store.append(name, labels, v, t)
    return store, sc


def _label(sc: Any, **over: Any) -> dict[str, Any]:
    label: dict[str, Any] = {
        "name": "gpu_memory_leak-moderate",
        "kind": "fault",
        "faults": ["gpu_memory_leak"],
        "expected": ["gpu_memory_leak"],
        "layer": "model",
        "severity": "moderate",
        "params": {"rate": 4e6},
        "t_baseline": sc.start + 70,
        "t_fault": sc.fault_start,
        "t_revert": sc.end,
        "quick": True,
        "tick": 1.0,
        "passed": True,
    }
    label.update(over)
    return label


@pytest.fixture(scope="module")
def leak() -> tuple[Store, Any]:
    return _store()


def _by_series(store: Store, name: str, lo: int, hi: int) -> dict[Any, tuple[Any, Any]]:
    labels, t, v, off = store.fetch([("__name__", "=", name)], lo, hi)
    return {lab: (t[off[i] : off[i + 1]], v[off[i] : off[i + 1]]) for i, lab in enumerate(labels)}


def _save(tmp_path: Path, store: Store, sc: Any, **over: Any) -> Path:
    return save_recording(store, tmp_path, _label(sc, **over), start=sc.start, end=sc.end)


def test_round_trip_keeps_window_label_events_and_the_diagnosis(tmp_path: Path) -> None:
    # 15 minutes, so that the window saved starts well after the store's first sample
    store, sc = _store(duration=900.0)
    xid = Event(sc.fault_start + 5, "kernel", "NVRM: Xid 79", {"xid": "79"})
    before = Event(sc.start + 100, "kernel", "outside the window", {})
    alert = _Alert("GPUMemoryHigh", {"severity": "P1"}, "firing", sc.fault_start + 10,
                   sc.fault_start + 20, None)  # fmt: skip
    # resolved before the window: its transition is not part of the recording
    old = _Alert("CPUHigh", {}, "resolved", sc.start + 90, sc.start + 100, sc.start + 120)
    label = _label(sc, t_baseline=sc.end - 289)
    # asked from 400 s; the diagnosis window starts at 610 s, its first rates read 60 s
    # before, and HISTORY more: the window saved is [220 s, end], nothing before it
    path = save_recording(
        store, tmp_path, label, start=sc.start + 400, end=sc.end, events=[xid, before],
        alerts=[old, alert],
    )  # fmt: skip
    assert path == tmp_path / f"gpu_memory_leak-moderate{SNAPSHOT_SUFFIX}"
    assert (tmp_path / "gpu_memory_leak-moderate.json").is_file()
    assert not list(tmp_path.glob(".*"))  # no temporary file left

    [rec] = load_recordings(tmp_path)
    assert rec.name == "gpu_memory_leak-moderate"
    assert dict(rec.label) == label
    assert rec.problems == ()
    assert rec.events == (xid,)
    assert [
        (a.alertname, a.labels, a.state, a.active_at, a.fired_at, a.resolved_at)
        for a in rec.alerts
    ] == [("GPUMemoryHigh", {"severity": "P1"}, "firing", sc.fault_start + 10,
           sc.fault_start + 20, None)]  # fmt: skip
    assert rec.alerts[0].at == sc.fault_start + 20
    assert rec.meta["format"] == 1 and rec.meta["aivitals_version"]
    assert rec.meta["samples"] > 0 and rec.meta["series"] == store.series_count
    assert rec.size_bytes == path.stat().st_size + rec.label_path.stat().st_size

    again = rec.store()
    assert rec.start == sc.start + 610 - 60 - HISTORY == sc.start + 220
    lo, hi = round(rec.start * 1000), round(sc.end * 1000)
    for name in ("up", "gpu_memory_used_bytes", "http_request_duration_seconds_bucket"):
        want = _by_series(store, name, lo, hi)
        got = _by_series(again, name, -(2**62), 2**62)
        assert sorted(got) == sorted(want) and len(got) > 0
        for key, (t, v) in want.items():
            np.testing.assert_array_equal(got[key][0], t)
            np.testing.assert_array_equal(got[key][1], v)
    assert again.stats()["samples"] == rec.meta["samples"]

    end, window = rec.diagnosis_window()
    assert (end, window) == (sc.end, sc.end - label["t_baseline"])
    live = diagnose(store, end=end, window=window, step=1.0)
    replay = diagnose(again, end=end, window=window, step=1.0)
    assert live.findings[0].signature == replay.findings[0].signature == "gpu_memory_leak"
    assert live.findings[0].confidence == replay.findings[0].confidence


def test_saving_again_replaces_the_recording(tmp_path: Path, leak: tuple[Store, Any]) -> None:
    store, sc = leak
    _save(tmp_path, store, sc, passed=False)
    _save(tmp_path, store, sc, passed=True)
    [rec] = load_recordings(tmp_path)
    assert rec.label["passed"] is True


def test_short_window_diagnosis_is_validates_minimum(
    tmp_path: Path, leak: tuple[Store, Any]
) -> None:
    store, sc = leak
    # a 4 s baseline (validate --quick): validate still diagnoses 30 s
    _save(tmp_path, store, sc, t_baseline=sc.end - 12, t_fault=sc.end - 8)
    [rec] = load_recordings(tmp_path)
    assert rec.diagnosis_window() == (sc.end, 30.0)
    assert rec.problems == ()


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"kind": None}, "wrong type: kind"),
        ({"tick": "1s"}, "wrong type: tick"),
        ({"quick": 1}, "wrong type: quick"),
        ({"t_baseline": True}, "wrong type: t_baseline"),
        ({"name": "../escape"}, "plain file name"),
        ({"name": ""}, "plain file name"),
        ({"kind": "chaos"}, "kind 'chaos' is not one of"),
        ({"severity": "extreme"}, "severity 'extreme'"),
        ({"tick": 0.0}, "tick > 0"),
        ({"t_fault": 1.0}, "t_baseline <= t_fault <= t_revert"),
        ({"expected": []}, "one expected signature"),
        ({"expected": [3]}, "expected must be a list of names"),
        ({"kind": "soak"}, "soak recording has no faults"),
        ({"kind": "pair"}, "pair recording has two faults"),
        ({"kind": "unknown", "layer": None}, "expected layer and its suspects"),
    ],
)
def test_save_refuses_a_bad_label_and_writes_nothing(
    tmp_path: Path, leak: tuple[Store, Any], over: dict[str, Any], match: str
) -> None:
    store, sc = leak
    with pytest.raises(ConfigError, match=match):
        _save(tmp_path, store, sc, **over)
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_a_missing_field_and_a_bad_window(
    tmp_path: Path, leak: tuple[Store, Any]
) -> None:
    store, sc = leak
    label = _label(sc)
    del label["t_fault"], label["tick"]
    with pytest.raises(ConfigError, match="label fields missing: t_fault, tick"):
        save_recording(store, tmp_path, label, start=sc.start, end=sc.end)
    with pytest.raises(ConfigError, match="finite start < end"):
        save_recording(store, tmp_path, _label(sc), start=sc.end, end=sc.start)
    with pytest.raises(ConfigError, match="finite start < end"):
        save_recording(store, tmp_path, _label(sc), start=float("nan"), end=sc.end)
    assert list(tmp_path.iterdir()) == []


def _edit(path: Path, change: Any) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_load_refuses_a_label_with_a_missing_field(tmp_path: Path, leak: tuple[Store, Any]) -> None:
    store, sc = leak
    _save(tmp_path, store, sc)
    label = tmp_path / "gpu_memory_leak-moderate.json"
    _edit(label, lambda d: d["label"].pop("expected"))
    with pytest.raises(ConfigError, match=r"gpu_memory_leak-moderate\.json.*missing: expected"):
        load_recordings(tmp_path)
    _edit(label, lambda d: d.pop("label"))
    with pytest.raises(ConfigError, match="missing field 'label'"):
        load_recordings(tmp_path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.update(format=99), "recording format 99 is not supported"),
        (lambda d: d.update(start="yesterday"), "field 'start' has the wrong type"),
        (lambda d: d["label"].update(name="other"), "does not match the file name"),
        (lambda d: d.update(events=[{"time": 1.0}]), "malformed events or alerts"),
        (lambda d: d.update(alerts=[{"alertname": "X"}]), "malformed events or alerts"),
    ],
)
def test_load_refuses_a_malformed_label(
    tmp_path: Path, leak: tuple[Store, Any], change: Any, match: str
) -> None:
    store, sc = leak
    _save(tmp_path, store, sc)
    _edit(tmp_path / "gpu_memory_leak-moderate.json", change)
    with pytest.raises(ConfigError, match=match):
        load_recordings(tmp_path)


def test_load_refuses_a_label_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"broken\.json: not a readable recording label"):
        load_recordings(tmp_path)
    (tmp_path / "broken.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="a recording label is a JSON object"):
        load_recordings(tmp_path)


def test_load_refuses_a_label_without_its_snapshot(tmp_path: Path, leak: tuple[Store, Any]) -> None:
    store, sc = leak
    _save(tmp_path, store, sc).unlink()
    with pytest.raises(
        StoreError, match=r"its snapshot gpu_memory_leak-moderate\.aivsnap is missing"
    ):
        load_recordings(tmp_path)


def test_load_refuses_a_snapshot_without_its_label(tmp_path: Path, leak: tuple[Store, Any]) -> None:
    store, sc = leak
    _save(tmp_path, store, sc)
    (tmp_path / "gpu_memory_leak-moderate.json").rename(tmp_path / "notes.txt")
    with pytest.raises(
        StoreError, match=r"a snapshot without its label gpu_memory_leak-moderate\.json"
    ):
        load_recordings(tmp_path)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "bad_magic"])
def test_load_refuses_a_corrupt_snapshot(
    tmp_path: Path, leak: tuple[Store, Any], damage: str
) -> None:
    store, sc = leak
    snap = _save(tmp_path, store, sc)
    raw = gzip.decompress(snap.read_bytes())
    if damage == "garbage":
        snap.write_bytes(b"this is not gzip at all")
    elif damage == "truncated":
        snap.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    else:
        snap.write_bytes(gzip.compress(b"NOTASNAP" + raw[8:]))
    with pytest.raises(StoreError, match=r"gpu_memory_leak-moderate\.aivsnap"):
        load_recordings(tmp_path)


def test_load_of_a_missing_directory_and_an_empty_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_recordings(tmp_path / "nowhere")
    (tmp_path / "HELDOUT.txt").write_text("# nothing yet\n")
    assert load_recordings(tmp_path) == []


def test_a_gap_in_every_scrape_is_flagged(tmp_path: Path) -> None:
    # 20 s without any sample, inside the diagnosis window (the baseline starts at 70 s)
    store, sc = _store(hole=(150.0, 170.0))
    _save(tmp_path, store, sc)
    [rec] = load_recordings(tmp_path)
    assert len(rec.problems) >= 1
    assert rec.problems[0].startswith("no sample at all for 21.0 s")
    assert any(
        p.startswith('up{instance="127.0.0.1:8000",job="demo"} missing') for p in rec.problems
    )


def test_a_gap_of_one_heartbeat_is_flagged(tmp_path: Path) -> None:
    # the other series go on: only the service's scrape target fell silent
    store, sc = _store(hole=(200.0, 240.0), hole_only="up")
    _save(tmp_path, store, sc)
    [rec] = load_recordings(tmp_path)
    assert rec.problems == (
        f'up{{instance="127.0.0.1:8000",job="demo"}} missing for 41.0 s '
        f"({sc.start + 199:.3f}..{sc.start + 240:.3f})",
    )


def test_a_short_stall_is_not_a_gap(tmp_path: Path) -> None:
    # MAX_GAP_TICKS ticks without a sample: a late scrape, not a hole
    store, sc = _store(hole=(200.0, 200.0 + MAX_GAP_TICKS - 1))
    _save(tmp_path, store, sc)
    [rec] = load_recordings(tmp_path)
    assert rec.problems == ()


def test_a_gap_at_the_end_is_flagged(tmp_path: Path) -> None:
    store, sc = _store(hole=(340.0, 400.0))
    _save(tmp_path, store, sc)
    [rec] = load_recordings(tmp_path)
    assert rec.problems[0].startswith("no sample at all for 20.0 s")


def test_missing_families_are_flagged(tmp_path: Path) -> None:
    # the GPU collector and the process collector were not running
    store, sc = _store(drop=("gpu_", "service_process_"))
    _save(tmp_path, store, sc)
    [rec] = load_recordings(tmp_path)
    [problem] = rec.problems
    gone = [f for f in REQUIRED_FAMILIES if f.startswith(("gpu_", "service_process_"))]
    assert gone and problem.startswith(
        "missing metric families in the diagnosis window: " + ", ".join(gone)
    )


def test_the_saved_window_reaches_back_as_far_as_the_diagnosis_reads(
    tmp_path: Path, leak: tuple[Store, Any]
) -> None:
    store, sc = leak
    # asked from 60 s; the diagnosis window starts at 70 s, its first rates read a
    # minute (a quarter of the 289 s window: 72 s, capped at 60 s) before that, and the
    # signatures' baselines HISTORY more: before the store's first sample, which is
    # no problem (validate's diagnosis had no more either)
    save_recording(store, tmp_path, _label(sc), start=sc.start + 60, end=sc.end)
    [rec] = load_recordings(tmp_path)
    assert rec.start == sc.start + 10 - HISTORY
    assert rec.problems == ()
    assert min(rec.store().fetch([("__name__", "=", "up")], 0, 2**62)[1]) == round(sc.start * 1000)


_LOOKBACK = re.compile(r"\[(\d+[smh])(?::[^\]]*)?\]|offset\s+(\d+[smh])")
#: A count of rare events over a range: a recording cut shorter can miss one, not invent one.
#: So with a count of samples that hold (``count_over_time((cond)[15m:1m]) >= 4``) and a
#: floor subtracted (``- min_over_time(x[15m])``): a shorter history lowers the count and
#: raises the floor, so the evidence can be lost, never invented.
_RARE_COUNT = re.compile(
    r"(?:increase|changes|resets)\(\s*[a-z_]+(?:\{[^}]*\})?\[(\d+[smh])\]\)"
    r"|count_over_time\(\(.*?\)\[(\d+[smh]):[^\]]*\]\)"
    r"|-\s*min_over_time\(\s*[a-z_]+(?:\{[^}]*\})?\[(\d+[smh])\]\)"
)


def test_history_covers_every_lookback_that_could_invent_evidence() -> None:
    exprs = [e.expr for sig in load_signatures() for e in sig.evidence]
    assert exprs
    longer = []
    for expr in exprs:
        rare = {m.start(g) for m in _RARE_COUNT.finditer(expr) for g in (1, 2, 3) if m.group(g)}
        for m in _LOOKBACK.finditer(expr):
            pos = m.start(1) if m.group(1) else m.start(2)
            span = parse_duration("lookback", m.group(1) or m.group(2))
            if span > HISTORY and pos not in rare:
                longer.append((m.group(0), expr))
    assert longer == []


def test_data_that_starts_after_the_diagnosis_needs_it_is_flagged(tmp_path: Path) -> None:
    # the agent started late: nothing before 60 s
    store, sc = _store(hole=(-1.0, 60.0))
    _save(tmp_path, store, sc)
    [rec] = load_recordings(tmp_path)
    assert rec.problems[0] == (
        f"no sample at all for 50.0 s ({sc.start + 10:.3f}..{sc.start + 60:.3f})"
    )


def test_a_soak_is_checked_over_the_polls_it_asked(tmp_path: Path) -> None:
    # the stack (and its agent) started 10 s before the soak's warm-up: the whole soak
    # as one window would read its first rate (a minute) before there was any data,
    # but the soak asked 60 s windows from 120 s on, whose rates (15 s) read from 45 s
    store, sc = _store(hole=(-1.0, 20.0))
    soak: dict[str, Any] = {
        "name": "soak", "kind": "soak", "faults": [], "expected": [], "layer": None,
        "severity": None, "t_fault": None, "t_revert": None, "passed": None,
        "t_baseline": sc.start + 30,
    }  # fmt: skip
    polls = [[sc.start + t, 60.0] for t in range(120, 361, 10)]
    _save(tmp_path, store, sc, **soak, polls=polls)
    [rec] = load_recordings(tmp_path)
    assert rec.polls == tuple((float(e), w) for e, w in polls)
    assert rec.problems == ()
    # the same soak without its polls is judged whole, and that window lacks data
    _save(tmp_path, store, sc, **soak)
    [rec] = load_recordings(tmp_path)
    assert rec.polls == ()
    assert rec.problems[0] == (
        f"no sample at all for 50.0 s ({sc.start - 30:.3f}..{sc.start + 20:.3f})"
    )


def test_a_hand_made_label_that_starts_too_late_is_flagged(
    tmp_path: Path, leak: tuple[Store, Any]
) -> None:
    store, sc = leak
    _save(tmp_path, store, sc)
    _edit(tmp_path / "gpu_memory_leak-moderate.json", lambda d: d.update(start=sc.start + 60))
    [rec] = load_recordings(tmp_path)
    assert rec.problems[0].startswith("starts 50.0 s after the diagnosis window needs data")


def test_soak_pair_and_unknown_labels(tmp_path: Path, leak: tuple[Store, Any]) -> None:
    store, sc = leak
    _save(tmp_path, store, sc, name="soak", kind="soak", faults=[], expected=[], layer=None,
          severity=None, t_fault=None, t_revert=None, passed=None)  # fmt: skip
    _save(tmp_path, store, sc, name="pair-a+b", kind="pair", faults=["cpu_burn", "gpu_memory_leak"],
          expected=["cpu_burn", "gpu_memory_leak"], layer=None, severity=None)  # fmt: skip
    _save(tmp_path, store, sc, name="thread_leak", kind="unknown", faults=["thread_leak"],
          expected=["service_process_threads"], layer="service", severity=None)  # fmt: skip
    recs = {r.name: r for r in load_recordings(tmp_path)}
    soak, pair, unknown = recs["soak"], recs["pair-a+b"], recs["thread_leak"]
    assert soak.kind == "soak" and soak.diagnosis_window() == (sc.end, sc.end - sc.start - 70)
    assert pair.name == "pair-a+b" and pair.kind == "pair"
    assert unknown.kind == "unknown" and unknown.suspects == ("service_process_threads",)


def _accuracy_benchmark() -> Any:
    return load_script("benchmarks/diagnosis_accuracy.py", "diagnosis_accuracy")


@pytest.mark.parametrize(
    ("name", "event"), [("cold_start@moderate", True), ("redis_down+traffic_surge", False)]
)
def test_the_accuracy_benchmark_judges_a_recording_as_validate_does(
    tmp_path: Path, name: str, event: bool
) -> None:
    """Replayed at validate's polls, through the case's memory, and judged with its rule.
    A cold start's load is paid before the phase ends: the bare diagnosis there names
    nothing, and the memory still holds the cold start it named (its evidence last seen
    within the hold), as validate's last poll reads it. Both recordings are of the tuning
    half (``benchmarks/recordings/HELDOUT.txt``)."""
    bench = _accuracy_benchmark()
    assert bench.split_of(name) == "tuning"
    src = Path(bench.RECORDINGS)
    for suffix in (".json", SNAPSHOT_SUFFIX):
        (tmp_path / f"{name}{suffix}").write_bytes((src / f"{name}{suffix}").read_bytes())
    [rec] = load_recordings(tmp_path)
    row = bench.score_recording(rec)
    assert row["stable"] is True, row
    assert row["top1"] == row["top1_at_end"] is True, row
    assert row["flips"] == 0, row
    if event:
        # the bare answer at the phase's end (14 s past the reload) names nothing
        assert not row["top"] or not row["top"][0].startswith("cold_start"), row
