"""Diagnosis accuracy on RECORDED validate runs and on the SYNTHETIC corpus, apart.

**Recorded** (``--recordings DIR``, default ``benchmarks/recordings/``): scenarios the
real demo stack ran under ``aivitals validate --record DIR`` (each a snapshot of the
agent's store over the scenario's window, with its label: see
``aivitals.validate._record``). Each is diagnosed exactly as validate judges it: at the
end of the fault phase (``t_revert``; a soak's end), over ``max(30 s, t_revert -
t_baseline)``, at the run's tick, with the agent's events and the alerts fired by
then. Scored by kind:

- fault: top1 = the expected signature first (and its layer); top3 = in the first three.
  A one-time event (the fault table's ``event``: cold_start) has passed before its phase
  ends; as validate judges it, a diagnosis that named it and then went quiet (nothing at
  high confidence) counts for top1 too (``heldout_top1_at_end``: the end alone);
- pair: top3 = both signatures in the first three; top1 = that, and one of them first;
- soak: healthy = no finding at or above HIGH_CONFIDENCE, at every poll the soak asked
  (its label's ``polls``; the whole soak at once for a label without them);
  top1 = top3 = healthy;
- unknown (a fault no signature knows): ``rank_changes`` from the baseline to the
  fault phase, as validate asks it: top1 = its top layer is the expected one and a
  suspect metric is in its top three (validate's pass); top3 = a suspect in the top
  three (``rank_top3``, rank_changes' own figure on the recordings).

Every fault, pair and unknown recording is also replayed at validate's diagnosis polls
(``poll_times``) and judged with validate's own rule (``judge_polls``): named at some
poll and on every poll after (``stable``; ``heldout_stable``, ``recorded_stable``), the
stability the top-1 at one moment does not show.

A recording whose data is unfit (gaps, missing families: ``Recording.problems``) is
listed with its problems and left out of every figure (``recorded_excluded``).

**The old split** (``heldout_*``, ``tuning_*``): a recording of the corpus is in the
"held-out" half when the SHA-256 of its name is odd (listed in ``DIR/HELDOUT.txt``).
That half was used while tuning (``benchmarks/recordings/README.md`` says how), and each
of its cases is an older run of a scenario tuned live, so the ``heldout_*`` figures are
figures on this corpus, not held-out measures. The held-out measure is ``test_stable``
on the frozen test set, below.

**Test set** (``--testset DIR``; the set lives in ``benchmarks/testset/``, whose README
says how it is recorded and frozen): recordings made once, at one code version, frozen
by a manifest of SHA-256 hashes (``aivitals.validate._manifest``), and read by nothing
but this mode, in the final run whose figures are reported. The manifest is verified
first: a file whose hash differs, a listed file missing, a file not listed, or no
manifest at all refuses the run (``ManifestError`` naming the files). Every recording
is then scored as above, and:

- a fault, pair or unknown case **passes** when it is named at the end of the fault
  phase (``top1``: validate's last poll replayed through the case's memory, with the
  one-time-event rule: a ``cold_start`` named and then quiet) AND ``stable``
  (``judge_polls`` over the replayed polls: named at some poll and on every poll
  after the first match);
- a soak passes when no finding reaches ``HIGH_CONFIDENCE`` at any poll it asked;
- a recording whose data is unfit (``Recording.problems``) fails: the set is scored
  whole, nothing is left out;
- ``test_stable`` = passed / every recording of the set (the headline, target >= 0.9);
  ``test_top1_at_end`` = the share whose answer at the end of the phase alone is right
  (no event rule; a soak: healthy at every poll); ``test_cases`` = the set's size;
  ``manifest`` = the SHA-256 of ``MANIFEST.sha256``, the set's identity.

Without ``--testset`` nothing reads the test set, and ``--recordings`` refuses a
folder that holds a manifest.

**Synthetic** (``tests/diagnose/_corpus.py``, generated, a unit-test aid): every fault
model with noise, a distractor blip and, in a second variant, missing metric
families, plus four scenarios built from the REAL H200 fault recording (leak,
cotenant, contention, oom; time-stretched):

- detected: share of faults with a finding of the right signature (any rank);
- top1 / top3: share with the right signature first / in the first three;
- ttd_s: median seconds from fault start to a correct top-1, diagnosing every
  15 s after the start (at 1 s resolution);
- false_findings: high-confidence findings on 30 min of fault-free traffic;
- diagnose_5k_s: seconds to diagnose 5,000 series x 30 min at 1 s.

    .venv/bin/python benchmarks/diagnosis_accuracy.py [--quick] [--recordings DIR]
                                                      [--no-synthetic]
    .venv/bin/python benchmarks/diagnosis_accuracy.py --testset DIR   # the final run only

The machine is shared: the timing is noisy; the accuracy figures are not.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The corpus generator lives with the tests (it does not ship in the package).
sys.path.insert(0, str(ROOT))

from tests.diagnose import _corpus as corpus  # noqa: E402

from aivitals.chaos import FAULT_TABLE  # noqa: E402
from aivitals.diagnose import HIGH_CONFIDENCE, diagnose, rank_changes  # noqa: E402
from aivitals.errors import AivitalsError  # noqa: E402
from aivitals.tsdb import Store  # noqa: E402
from aivitals.validate import Recording, ValidateConfig, load_recordings, replay  # noqa: E402
from aivitals.validate._manifest import MANIFEST_NAME, Manifest, verify_manifest  # noqa: E402
from aivitals.validate._runner import Poll, judge_polls, poll_times  # noqa: E402

H200 = ROOT / "tests" / "fixtures" / "gpu" / "h200" / "scenarios.csv"
RESULTS = ROOT / "benchmarks" / "results"
RECORDINGS = ROOT / "benchmarks" / "recordings"
TTD_POINTS = (15, 30, 45, 60, 75, 90, 120, 150, 180)
HELDOUT_FILE = "HELDOUT.txt"
HELDOUT_NOTE = """\
# The "held-out" half of the recordings of the diagnosis accuracy benchmark
# (benchmarks/diagnosis_accuracy.py): those whose name's SHA-256 is odd. This half was
# used while tuning (benchmarks/recordings/README.md says how) and each case is an older
# run of a scenario tuned live, so the heldout_* figures are NOT held-out measures. The
# held-out measure is test_stable on the frozen test set (the benchmark's --testset).
# This file is rewritten by the benchmark from the names in this folder; the split
# depends on the name alone, so a recording keeps its half when the corpus grows.
"""


def rank_of(d: object, expected: str) -> int | None:
    for i, f in enumerate(d.findings):  # type: ignore[attr-defined]
        if f.signature == expected:
            return i
    return None


def evaluate(sc: corpus.Scenario, expected: str, quick: bool) -> dict[str, object]:
    store = corpus.to_store(sc)
    d = diagnose(store, end=sc.end, events=sc.events)
    rank = rank_of(d, expected)
    ttd = None
    points = (30, 60, 120) if quick else TTD_POINTS
    for after in points:
        at = sc.fault_start + after
        if at > sc.end:
            break
        dd = diagnose(store, end=at, events=[e for e in sc.events if e.time <= at])
        if dd.findings and dd.findings[0].signature == expected:
            ttd = float(after)
            break
    top = d.findings[0].signature if d.findings else "-"
    return {
        "scenario": sc.name,
        "expected": expected,
        "rank": rank,
        "top": top,
        "confidence": d.findings[0].confidence if d.findings else 0.0,
        "ttd_s": ttd,
        "shape": str(d.shape),
        "seconds": round(d.elapsed_s, 2),
    }


def false_findings(seeds: range) -> tuple[int, list[str]]:
    count, names = 0, []
    for seed in seeds:
        sc = corpus.healthy(seed=seed)
        d = diagnose(corpus.to_store(sc), end=sc.end)
        hi = [f.signature for f in d.findings if f.confidence >= HIGH_CONFIDENCE]
        count += len(hi)
        names += hi
    return count, names


def bench_5k() -> tuple[float, int, str]:
    """5,000 series, 30 min at 1 s: replicas of the service, one of them leaking."""
    store = Store(retention=7200.0)
    sc = corpus.scenario("gpu_memory_leak", seed=7)
    corpus.to_store(sc, store, extra_labels={"instance": "node0"})
    k = 1
    while store.series_count < 5000:
        healthy = corpus.scenario(None, seed=100 + k, after=0.0)
        corpus.to_store(healthy, store, extra_labels={"instance": f"node{k}"})
        k += 1
    times = []
    top = "-"
    for _ in range(3):
        t0 = time.perf_counter()
        d = diagnose(store, end=sc.end)
        times.append(time.perf_counter() - t0)
        top = d.findings[0].signature if d.findings else "-"
    return statistics.median(times), store.series_count, top


def split_of(name: str) -> str:
    """``heldout`` or ``tuning``: the parity of the name's SHA-256, fixed by the name alone."""
    return "heldout" if int(hashlib.sha256(name.encode()).hexdigest(), 16) % 2 else "tuning"


def write_heldout(directory: Path, names: Sequence[str]) -> bool:
    """Write ``HELDOUT.txt`` (the note and the held-out names); True when it changed."""
    text = HELDOUT_NOTE + "".join(f"{n}\n" for n in sorted(names) if split_of(n) == "heldout")
    path = directory / HELDOUT_FILE
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def score_recording(rec: Recording) -> dict[str, Any]:
    """Diagnose one recording as validate judges it and score it by its kind."""
    label = rec.label
    row: dict[str, Any] = {
        "scenario": rec.name,
        "kind": rec.kind,
        "severity": label.get("severity"),
        "split": split_of(rec.name),
        "expected": list(label["expected"]) or (["healthy"] if rec.kind == "soak" else []),
        "validate_passed": label.get("passed"),
        "size_kb": round(rec.size_bytes / 1024, 1),
        "problems": list(rec.problems),
    }
    if rec.problems:
        return row
    store = rec.store()

    @functools.cache  # the replayed poll at the phase's end is the answer at the end
    def diagnose_at(end: float, window: float) -> Any:
        # what validate's diagnosis at ``end`` had: the alerts and events up to then
        return diagnose(
            store,
            end=end,
            window=window,
            step=rec.tick,
            alerts=[a for a in rec.alerts if a.at <= end],
            events=[e for e in rec.events if e.time <= end],
            rate=rec.diagnosis_rate,
        )

    end, window = rec.diagnosis_window()
    t0 = time.perf_counter()
    d = diagnose_at(end, window)
    found = [f.signature for f in d.findings]
    row["top"] = [f"{f.signature} {f.confidence:.2f}" for f in d.findings[:3]]
    row["shape"] = str(d.shape)
    expected = list(label["expected"])
    if rec.kind == "fault":
        rank = found.index(expected[0]) if expected[0] in found else None
        row["rank"] = rank
        row["top1"] = _fault_matches(d, expected[0], label.get("layer"))
        row["top3"] = rank is not None and rank < 3
    elif rec.kind == "pair":
        both = set(expected) <= set(found[:3])
        row["top3"] = both
        row["top1"] = both and bool(found) and found[0] in expected
    elif rec.kind == "soak":
        high = [f.signature for f in d.findings if f.confidence >= HIGH_CONFIDENCE]
        if rec.polls:
            # judged as the soak judged itself: healthy at every poll it asked
            high, healthy = [], 0
            for p_end, p_window in rec.polls:
                got = diagnose_at(p_end, p_window)
                named = [f.signature for f in got.findings if f.confidence >= HIGH_CONFIDENCE]
                high += named
                healthy += not named
            row["polls_healthy"] = f"{healthy}/{len(rec.polls)}"
        row["high_confidence"] = sorted(set(high))
        row["top1"] = row["top3"] = not high
        row["top1_at_end"] = row["stable"] = row["top1"]  # judged at its polls already
    else:  # unknown: the generic ranking, asked as validate asks it
        hit, layer_ok, ranking = _unknown_matches(rec, store, end)
        row["expected"] = [f"layer {label['layer']}", *rec.suspects]
        row["rank_top"] = [f"{c.metric} ({c.layer})" for c in ranking.changes[:3]]
        row["rank_layer"] = ranking.top_layer
        row["top1"] = hit and layer_ok
        row["top3"] = hit
    if rec.kind != "soak":
        _judge_polls(rec, row, store)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _fault_matches(d: Any, expected: str, layer: object) -> bool:
    """validate's match for a single fault: its signature first, in its layer."""
    if not d.findings:
        return False
    top = d.findings[0]
    return bool(top.signature == expected and (layer is None or str(top.layer).lower() == layer))


def _unknown_matches(rec: Recording, store: Any, end: float) -> tuple[bool, bool, Any]:
    """validate's match for a fault no signature knows: (a suspect in rank_changes' top
    three, its top layer the expected one, the ranking)."""
    label = rec.label
    t_fault = float(label["t_fault"])
    ranking = rank_changes(
        store, baseline=(float(label["t_baseline"]), t_fault), incident=(t_fault, end)
    )
    top3 = [c.metric for c in ranking.changes[:3]]
    return bool(set(top3) & set(rec.suspects)), ranking.top_layer == label["layer"], ranking


def _judge_polls(rec: Recording, row: dict[str, Any], store: Any) -> None:
    """Replay validate's diagnosis polls over the fault phase and judge them with its rule
    (``judge_polls``): named at some poll and on every poll after (``stable``).

    A fault or a pair is replayed as validate polls it (``aivitals.validate.replay``: at
    its recorded poll times, or the validate poll period for an older recording, through
    the case's ``FindingMemory``); ``flips`` counts the top finding's changes after the
    first correct poll. A one-time event (the fault table's ``event``: cold_start) is over
    before its phase ends: validate passes a diagnosis that named it and then went quiet
    (nothing at high confidence), so top1 counts that too (``top1_at_end`` keeps the
    answer at the end alone). A fault's top1 is its last replayed poll (the end of the
    phase, through the memory, as validate reads it); a pair's the bare answer there."""
    label = rec.label
    quick = bool(label.get("quick"))
    t_fault = float(label["t_fault"])
    end, _ = rec.diagnosis_window()
    polls = []
    if rec.kind == "unknown":
        for t in poll_times(t_fault, end, ValidateConfig(quick=quick)):
            # the poll at the phase's end asks what score_recording already asked there
            matched = row["top1"] if t == end else all(_unknown_matches(rec, store, t)[:2])
            polls.append(Poll(t - t_fault, matched, "", quiet=False))
    else:
        replayed = replay(rec)
        row["flips"] = replayed.flips
        row["polls_timed"] = replayed.timed
        polls = [Poll(p.after_s, p.matched, p.top, quiet=p.quiet) for p in replayed.polls]
    faults = [FAULT_TABLE.get(f) for f in label.get("faults", ())]
    event = rec.kind == "fault" and bool(faults) and all(i is not None and i.event for i in faults)
    verdict = judge_polls(polls, event)
    row["stable"] = verdict.passed
    row["polls_agreed"] = f"{verdict.agreed}/{verdict.after}" if verdict.after else "0/0"
    if rec.kind == "fault" and polls:
        # validate's answer at the phase's end is its last poll, through the case's memory
        row["top1"] = polls[-1].matched
        row["top3"] = row["top3"] or row["top1"]  # first in the held order is in its top three
    row["top1_at_end"] = row["top1"]
    if event and not row["top1"]:
        row["top1"] = verdict.passed and polls[-1].quiet


def _share(rows: Sequence[dict[str, Any]], key: str) -> float:
    return sum(bool(r[key]) for r in rows) / len(rows) if rows else math.nan


def test_passed(row: dict[str, Any]) -> bool:
    """A test-set case passes: named at the end of its phase and stable on every poll
    after the first match (a soak: healthy at every poll); an unfit recording fails."""
    if row["problems"]:
        return False
    if row["kind"] == "soak":
        return bool(row["top1"])
    return bool(row["top1"]) and bool(row["stable"])


def testset_figures(rows: Sequence[dict[str, Any]], manifest: Manifest) -> dict[str, Any]:
    """The test set's figures: every recording counts, an unfit one as a failure."""
    ok = [test_passed(r) for r in rows]
    at_end = [not r["problems"] and bool(r["top1_at_end"]) for r in rows]
    n = len(rows)
    kinds = {
        k: {
            "n": sum(r["kind"] == k for r in rows),
            "stable": sum(o for r, o in zip(rows, ok, strict=True) if r["kind"] == k),
        }
        for k in ("fault", "pair", "soak", "unknown")
    }
    return {
        "test_stable": sum(ok) / n if n else math.nan,
        "test_top1_at_end": sum(at_end) / n if n else math.nan,
        "test_cases": n,
        "test_unfit": sum(bool(r["problems"]) for r in rows),
        "manifest": manifest.sha256,
        "testset_commit": manifest.meta.get("git_commit"),
        "testset_dirty": manifest.meta.get("git_dirty"),
        "testset_recorded": [manifest.meta.get("recorded_from"), manifest.meta.get("recorded_to")],
        "test_failed": [r["scenario"] for r, o in zip(rows, ok, strict=True) if not o],
        "by_kind": kinds,
    }


def testset(directory: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The final run on the frozen test set: verify its manifest (``ManifestError``
    naming the files that differ, refused before anything is diagnosed), then score
    every recording; figures and rows."""
    manifest = verify_manifest(directory)
    print(f"manifest {manifest.path}: {len(manifest.files)} files match, sha256 {manifest.sha256}")
    rows = []
    for rec in load_recordings(directory):
        row = score_recording(rec)
        row["split"] = "test"
        row["test_passed"] = test_passed(row)
        rows.append(row)
        print(_fmt_recorded(row), f"stable={_verdict(row.get('stable'))}", flush=True)
    return testset_figures(rows, manifest), rows


def _git_commit() -> str | None:
    """The commit of the code that diagnosed (the set's own is in its manifest)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def run_testset(directory: Path) -> int:
    """``--testset``: the final, reported run; prints the RESULT line and writes
    ``benchmarks/results/diagnosis_testset.json``."""
    print(f"== test set: {directory}")
    try:
        figures, rows = testset(directory)
    except AivitalsError as exc:  # a manifest mismatch, a file that is not a recording
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    t = figures
    for kind, k in t["by_kind"].items():
        if k["n"]:
            print(f"  {kind:<8} n={k['n']:<3} stable={k['stable']}/{k['n']}")
    print(f"  failed: {', '.join(t['test_failed']) or 'none'}")
    doc = {
        **figures,
        "git_commit": _git_commit(),
        "date": time.time(),
        "targets": {"test_stable": 0.9},
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = json.dumps(doc, indent=2, default=str).replace("NaN", "null")
    (RESULTS / "diagnosis_testset.json").write_text(out + "\n")
    print(
        f"RESULT test_stable={_f(t['test_stable'])} test_top1_at_end={_f(t['test_top1_at_end'])} "
        f"test_cases={t['test_cases']} test_unfit={t['test_unfit']} manifest={t['manifest']}"
    )
    return 0


def recorded(directory: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Score every recording in ``directory``; figures and rows."""
    if (directory / MANIFEST_NAME).exists():
        raise SystemExit(
            f"{directory} holds {MANIFEST_NAME}: a frozen test set is read only by --testset"
        )
    if not directory.is_dir():
        print(f"no recordings: {directory} does not exist (make them with validate --record)")
        return _recorded_figures([], [], 0), []
    recs = load_recordings(directory)
    if write_heldout(directory, [r.name for r in recs]):
        print(f"wrote {directory / HELDOUT_FILE}")
    rows = []
    for rec in recs:
        rows.append(score_recording(rec))
        print(_fmt_recorded(rows[-1]), flush=True)
    usable = [r for r in rows if not r["problems"]]
    total = sum(r.size_bytes for r in recs)
    return _recorded_figures(rows, usable, total), rows


def _recorded_figures(
    rows: Sequence[dict[str, Any]], usable: Sequence[dict[str, Any]], total_bytes: int
) -> dict[str, Any]:
    held = [r for r in usable if r["split"] == "heldout"]
    tune = [r for r in usable if r["split"] == "tuning"]
    kinds = {k: [r for r in usable if r["kind"] == k] for k in ("fault", "pair", "soak", "unknown")}
    sev = {
        s: [r for r in usable if r["severity"] == s] for s in ("threshold", "moderate", "severe")
    }
    return {
        "recorded_n": len(usable),
        "recorded_excluded": len(rows) - len(usable),
        "recorded_top1": _share(usable, "top1"),
        "recorded_top3": _share(usable, "top3"),
        "heldout_n": len(held),
        "heldout_top1": _share(held, "top1"),
        "heldout_top3": _share(held, "top3"),
        "tuning_n": len(tune),
        "tuning_top1": _share(tune, "top1"),
        # the answer at the end of the fault phase alone (a one-time event that went quiet
        # after it was named counts as a miss here), and validate's whole poll rule
        "heldout_top1_at_end": _share(held, "top1_at_end"),
        "heldout_stable": _share(held, "stable"),
        "tuning_stable": _share(tune, "stable"),
        "recorded_stable": _share(usable, "stable"),
        # top-finding changes after the first correct poll, validate's polls replayed
        # through the case's memory (every fault and pair recording)
        "recorded_flips": sum(int(r.get("flips", 0)) for r in usable),
        "recorded_flipping": sum(int(r.get("flips", 0)) > 0 for r in usable),
        "by_kind": {
            k: {"n": len(v), "top1": _share(v, "top1"), "top3": _share(v, "top3")}
            for k, v in kinds.items()
        },
        "by_severity": {k: {"n": len(v), "top1": _share(v, "top1")} for k, v in sev.items()},
        "rank_top3": _share(kinds["unknown"], "top3"),
        "recorded_mb": round(total_bytes / 2**20, 2),
        "largest_kb": max((r["size_kb"] for r in rows), default=0.0),
    }


def _fmt_recorded(r: dict[str, Any]) -> str:
    if r["problems"]:
        return f"SKIP {r['scenario']:<40} {'; '.join(r['problems'])}"
    mark = "ok  " if r["top1"] else ("top3" if r["top3"] else "MISS")
    top = r.get("rank_top") if r["kind"] == "unknown" else r.get("top")
    if r.get("polls_healthy") is not None:  # a soak judged at its polls: what they named
        top = [f"{r['polls_healthy']} polls healthy", *r["high_confidence"]]
    return (
        f"{mark} {r['scenario']:<40}{r['split']:<8}{r['kind']:<8}"
        f"expected={','.join(r['expected']):<40} top={'; '.join(top or ['-'])} "
        f"{r['size_kb']} KB {r['seconds']}s validate={_verdict(r['validate_passed'])}"
    )


def _verdict(passed: object) -> str:
    """validate's verdict on the whole scenario (every check, not the diagnosis alone)."""
    return "-" if passed is None else ("pass" if passed else "fail")


def _f(x: float) -> str:
    return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer synthetic variants, no 5k run")
    ap.add_argument(
        "--recordings",
        type=Path,
        default=RECORDINGS,
        metavar="DIR",
        help=f"recorded validate runs [default {RECORDINGS.relative_to(ROOT)}]",
    )
    ap.add_argument("--no-synthetic", action="store_true", help="the recorded corpus only")
    ap.add_argument(
        "--testset",
        type=Path,
        default=None,
        metavar="DIR",
        help="the final run on the frozen test set (its manifest verified first); nothing else",
    )
    args = ap.parse_args(argv)
    if args.testset is not None:
        return run_testset(args.testset)
    quick = args.quick
    t0 = time.perf_counter()

    print(f"== recorded: {args.recordings}")
    rec_figures, rec_rows = recorded(args.recordings)

    rows = []
    ff, ff_names, t5k, n5k, top5k = 0, [], 0.0, 0, "-"
    if not args.no_synthetic:
        print("== synthetic: tests/diagnose/_corpus.py")
        variants = [
            (f, exp, seed, partial)
            for f, (_, exp) in corpus.FAULTS.items()
            for seed, partial in ((1, False), (2, True))
        ]
        if quick:
            variants = [v for v in variants if not v[3]]
        for fault, expected, seed, partial in variants:
            sc = corpus.scenario(fault, seed=seed, partial=partial)
            rows.append(evaluate(sc, expected, quick))
            print(_fmt(rows[-1]), flush=True)
        for sc in corpus.h200_scenarios(H200):  # the recording is in the repository
            assert sc.fault is not None
            rows.append(evaluate(sc, corpus.FAULTS[sc.fault][1], quick))
            print(_fmt(rows[-1]), flush=True)
        ff, ff_names = false_findings(range(3 if quick else 6))
        t5k, n5k, top5k = (0.0, 0, "-") if quick else bench_5k()
    n = len(rows)
    detected = sum(r["rank"] is not None for r in rows) / n if n else math.nan
    top1 = sum(r["rank"] == 0 for r in rows) / n if n else math.nan
    top3 = sum(r["rank"] is not None and r["rank"] < 3 for r in rows) / n if n else math.nan  # type: ignore[operator]
    ttds = [r["ttd_s"] for r in rows if r["ttd_s"] is not None]
    ttd = statistics.median(ttds) if ttds else float("nan")  # type: ignore[type-var]
    figures = {
        **rec_figures,
        "synthetic_top1": top1,
        "detected": round(detected, 3),
        "top1": round(top1, 3),
        "top3": round(top3, 3),
        "ttd_s": ttd,
        "false_findings": ff,
        "diagnose_5k_s": round(t5k, 3),
        "series_5k": n5k,
        "top_5k": top5k,
        "scenarios": n,
        "false_finding_signatures": ff_names,
        "targets": {
            "detected": 1.0,
            "top1": 0.9,
            "top3": 1.0,
            "ttd_s": 60,
            "false_findings": 0,
            "diagnose_5k_s": 2.0,
        },
        "seconds": round(time.perf_counter() - t0, 1),
        "recorded_rows": rec_rows,
        "rows": rows,
    }
    r = rec_figures
    print(
        f"recorded: {r['recorded_n']} scored ({r['recorded_excluded']} excluded for gaps or "
        f"missing families), top1={_f(r['recorded_top1'])} top3={_f(r['recorded_top3'])}; "
        f"held-out {r['heldout_n']} top1={_f(r['heldout_top1'])}; tuning {r['tuning_n']} "
        f"top1={_f(r['tuning_top1'])}; {r['recorded_mb']} MB, largest {r['largest_kb']} KB"
    )
    print(
        f"  held-out top1 at the end alone={_f(r['heldout_top1_at_end'])}; validate's poll "
        f"rule (named, then every poll after): held-out={_f(r['heldout_stable'])} "
        f"tuning={_f(r['tuning_stable'])} all={_f(r['recorded_stable'])}"
    )
    for kind, k in r["by_kind"].items():
        if k["n"]:
            print(f"  {kind:<8} n={k['n']:<3} top1={_f(k['top1'])} top3={_f(k['top3'])}")
    for sev, k in r["by_severity"].items():
        if k["n"]:
            print(f"  {sev:<10} n={k['n']:<3} top1={_f(k['top1'])}")
    if n:
        print(
            f"synthetic: scenarios={n} detected={detected:.3f} top1={top1:.3f} top3={top3:.3f} "
            f"ttd_s={ttd} false_findings={ff} {ff_names} diagnose_5k_s={t5k:.3f} ({n5k} series)"
        )
    if not quick and not args.no_synthetic:
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = json.dumps(figures, indent=2, default=str).replace("NaN", "null")
        (RESULTS / "diagnosis_accuracy.json").write_text(out + "\n")
    print(
        f"RESULT detected={_f(detected)} top1={_f(top1)} top3={_f(top3)} ttd_s={ttd} "
        f"false_findings={ff} diagnose_5k_s={t5k:.3f} recorded_n={r['recorded_n']} "
        f"recorded_top1={_f(r['recorded_top1'])} recorded_top3={_f(r['recorded_top3'])} "
        f"heldout_n={r['heldout_n']} heldout_top1={_f(r['heldout_top1'])} "
        f"heldout_top1_at_end={_f(r['heldout_top1_at_end'])} "
        f"heldout_stable={_f(r['heldout_stable'])} recorded_stable={_f(r['recorded_stable'])} "
        f"tuning_top1={_f(r['tuning_top1'])} synthetic_top1={_f(top1)} "
        f"rank_top3={_f(r['rank_top3'])} recorded_excluded={r['recorded_excluded']} "
        f"recorded_mb={r['recorded_mb']} recorded_flips={r['recorded_flips']} "
        f"recorded_flipping={r['recorded_flipping']}"
    )
    return 0


def _fmt(r: dict[str, object]) -> str:
    mark = "ok " if r["rank"] == 0 else ("top3" if r["rank"] is not None else "MISS")
    return (
        f"{mark:5}{r['scenario']:<40}{r['expected']:<28}top={r['top']:<28}"
        f"conf={r['confidence']:<6} ttd={r['ttd_s']} {r['seconds']}s"
    )


if __name__ == "__main__":
    sys.exit(main())
