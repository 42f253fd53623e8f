"""flake: does ``aivitals validate --quick`` give the same verdict every time?

Runs the real CLI, ``aivitals validate --quick --report <json>`` (every fault this machine
can host, then the validated pairs), ``--runs`` times (default 5) in a row, each in a
subprocess, or reads existing reports with ``--from-reports``. Per case it prints the
verdict of each run and the top finding's changes after the first correct poll (flips,
read from the diagnosis check's polls). Then one line:

``RESULT runs=... cases=... flaky_cases=... flip_rate=... miss_rate=...``

- ``flaky_cases``: cases whose verdict (pass or fail) was not the same in every run;
- ``flip_rate``: flips per case-run (every poll after the first correct one that named
  another top finding than the poll before it);
- ``miss_rate``: case-runs that failed, over all case-runs.

A case a run could not host (skipped) is listed as not tested in that run and is in
none of the ratios; a run that crashed before writing its report is an error, counted
and printed, never dropped. Writes benchmarks/results/flake.json (``--output``
elsewhere). Target: ``flaky_cases=0`` over 5 runs.

    .venv/bin/python benchmarks/flake.py [--runs 5] [--scenarios a,b] [--from-reports F ...]

Each quick run takes 20-40 minutes on a 2-core machine: five take hours.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "flake.json"
sys.path.insert(0, str(REPO / "src"))

from aivitals.chaos import FAULT_TABLE  # noqa: E402
from aivitals.validate import ReplayedPoll, count_flips  # noqa: E402


def _polls(case: dict[str, Any]) -> list[ReplayedPoll]:
    for check in case.get("checks", []):
        if check.get("name") == "diagnosis":
            return [
                ReplayedPoll(
                    float(p.get("after_s", 0.0)),
                    str(p.get("named", "")).split(" ")[0].rstrip(","),
                    0.0,
                    bool(p.get("matched")),
                    bool(p.get("quiet")),
                )
                for p in (check.get("data") or {}).get("polls", [])
            ]
    return []


def case_runs(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each case of one report: its verdict (True, False, or None when skipped), flips."""
    out: dict[str, dict[str, Any]] = {}
    for case in report.get("scenarios", []):
        name = str(case.get("fault"))
        if case.get("skipped"):
            out[name] = {"passed": None, "flips": 0, "why": case.get("skipped")}
            continue
        polls = _polls(case)
        faults = [FAULT_TABLE.get(f.split("@")[0]) for f in name.split("+")]
        event = len(faults) == 1 and faults[0] is not None and faults[0].event
        out[name] = {
            "passed": bool(case.get("passed")),
            "flips": count_flips(polls, pair=len(faults) > 1, event=event),
            "failed": [c["name"] for c in case.get("checks", []) if c.get("ok") is False],
        }
    return out


def summarize(runs: Sequence[dict[str, dict[str, Any]] | str]) -> dict[str, Any]:
    """The figures over every run (a str is a run that crashed: its error)."""
    errors = [r for r in runs if isinstance(r, str)]
    good = [r for r in runs if not isinstance(r, str)]
    names = sorted({n for r in good for n in r})
    rows: dict[str, dict[str, Any]] = {}
    case_runs_n = misses = flips = 0
    flaky = []
    for n in names:
        verdicts = [r[n]["passed"] if n in r else None for r in good]
        tested = [v for v in verdicts if v is not None]
        f = sum(int(r[n]["flips"]) for r in good if n in r and r[n]["passed"] is not None)
        case_runs_n += len(tested)
        misses += sum(not v for v in tested)
        flips += f
        if len(set(tested)) > 1:
            flaky.append(n)
        rows[n] = {
            "verdicts": verdicts,
            "flips": f,
            "failed_checks": [r[n].get("failed", []) for r in good if n in r],
        }
    return {
        "runs": len(runs),
        "errors": errors,
        "cases": len(names),
        "case_runs": case_runs_n,
        "flaky_cases": len(flaky),
        "flaky": flaky,
        "flip_rate": flips / case_runs_n if case_runs_n else None,
        "miss_rate": misses / case_runs_n if case_runs_n else None,
        "rows": rows,
    }


def result_line(s: dict[str, Any]) -> str:
    def num(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    return (
        f"RESULT runs={s['runs']} cases={s['cases']} flaky_cases={s['flaky_cases']} "
        f"flip_rate={num(s['flip_rate'])} miss_rate={num(s['miss_rate'])} "
        f"errors={len(s['errors'])}"
    )


def _run_once(i: int, scenarios: str | None, keep: Path) -> dict[str, dict[str, Any]] | str:
    report = keep / f"flake-run{i}.json"
    argv = [str(REPO / ".venv" / "bin" / "aivitals"), "validate", "--quick", "--report",
            str(report)]  # fmt: skip
    if scenarios:
        argv += ["--scenarios", scenarios]
    t0 = time.time()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    print(f"run {i}: exit {proc.returncode} in {time.time() - t0:.0f} s", flush=True)
    if not report.exists():
        tail = (proc.stdout + proc.stderr)[-600:]
        return f"run {i}: no report (exit {proc.returncode}): {tail}"
    return case_runs(json.loads(report.read_text()))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scenarios", default=None, help="validate's --scenarios (default all)")
    ap.add_argument("--from-reports", nargs="+", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the run reports here")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    runs: list[dict[str, dict[str, Any]] | str] = []
    if args.from_reports:
        for path in args.from_reports:
            try:
                runs.append(case_runs(json.loads(path.read_text())))
            except (OSError, ValueError) as exc:
                runs.append(f"{path}: {exc}")
    else:
        keep = args.keep or Path(tempfile.mkdtemp(prefix="aivitals-flake-"))
        keep.mkdir(parents=True, exist_ok=True)
        for i in range(1, args.runs + 1):
            runs.append(_run_once(i, args.scenarios, keep))
    s = summarize(runs)
    for name, row in s["rows"].items():
        marks = " ".join("-" if v is None else ("ok" if v else "FAIL") for v in row["verdicts"])
        flag = "FLAKY " if name in s["flaky"] else "      "
        print(f"{flag}{name:<36} {marks:<24} flips={row['flips']}")
    for err in s["errors"]:
        print(f"error: {err}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(s, indent=2) + "\n")
    print(result_line(s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
