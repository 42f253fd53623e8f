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

**Held-out split**: a recording is held out when the SHA-256 of its name is odd,
tuned on otherwise: a fixed split that no result can move. The held-out names are
written to ``DIR/HELDOUT.txt``; they must never be looked at while changing
thresholds or signatures (tune on the ``tuning`` half; report ``heldout_top1``).

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
from aivitals.tsdb import Store  # noqa: E402
from aivitals.validate import Recording, ValidateConfig, load_recordings, replay  # noqa: E402
from aivitals.validate._runner import Poll, judge_polls, poll_times  # noqa: E402

H200 = ROOT / "tests" / "fixtures" / "gpu" / "h200" / "scenarios.csv"
RESULTS = ROOT / "benchmarks" / "results"
RECORDINGS = ROOT / "benchmarks" / "recordings"
TTD_POINTS = (15, 30, 45, 60, 75, 90, 120, 150, 180)
HELDOUT_FILE = "HELDOUT.txt"
HELDOUT_NOTE = """\
# HELD-OUT recordings of the diagnosis accuracy benchmark (benchmarks/diagnosis_accuracy.py).
# A recording is held out when the SHA-256 of its name is odd. NEVER use these while
# changing thresholds, signatures or the diagnosis engine: do not open them, diagnose them
# or read their rows to decide a change. Tune on the other half ("tuning" in the rows);
# the held-out half says whether a change generalises (heldout_top1, target >= 0.9).
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


def recorded(directory: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Score every recording in ``directory``; figures and rows."""
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
    args = ap.parse_args(argv)
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
            "heldout_top1": 0.9,
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
