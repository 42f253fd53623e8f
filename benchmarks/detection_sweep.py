"""detection_sweep: is every fault caught at threshold, moderate and severe magnitude?

Runs the real CLI, ``aivitals validate --sweep [--quick] --report <json>`` (every
graded fault at the three severities of ``aivitals.validate._severity``, each derived
from the rule pack's or the diagnosis's bound, and every fault with one magnitude once,
as ``fault@single``; see docs/validate.md "Severity sweep"), in a subprocess, or reads
an existing report with ``--from-report``: a validate report, or a results file this
script wrote (its cases are counted again under the rules below). Prints per case its
outcome, the time from injection to the first expected alert, the time to a correct and
stable top finding, and whether the fault reached the magnitude asked on this machine;
per severity the cases caught, tested and not tested; then one line:

``RESULT caught_moderate=... caught_severe=... caught_threshold=... not_reached=N
diagnosis_only=N consequences=N ttd_p50_s=... ttd_p90_s=... false_p0p1_per_h=...
caught_single=... errors=N cases_threshold=C/T/U cases_moderate=... cases_severe=...
cases_single=...``

Every case run counts. ``caught_*`` are shares (0..1) over every case tested at that
severity: one caught has every expected alert fired and the diagnosis naming the fault
and keeping it named, at the magnitude it asked. A case that did not reach its
magnitude on this machine is ``not_reached``, one with no expected alert to test (the
fault has none, or the magnitude cannot make them fire in its phase) and a correct
diagnosis is ``diagnosis_only``, and a crashed one is an error: each counts as tested
and not caught. ``cases_<severity>`` is caught/tested/not tested (skipped, or cut short
by Ctrl-C). ``consequences`` is the number of allowed consequence entries in the fault
table. ``ttd_*`` are percentiles of the time to the first expected alert over the
caught cases. ``false_p0p1_per_h`` is the number of P0/P1 alerts that neither the case
expected nor the fault table lists as a consequence, per hour of fault phase. Writes
benchmarks/results/detection_sweep.json (``--output`` elsewhere).

Run (it starts the demo stack and every fault; minutes to hours):
``.venv/bin/python benchmarks/detection_sweep.py --quick [--scenarios a,b] [--record DIR]``.
Count an earlier results file again (here, the last one):
``.venv/bin/python benchmarks/detection_sweep.py --from-report RESULTS_JSON``.
Targets (issue #14): caught_moderate=1.0, caught_severe=1.0, false_p0p1_per_h=0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "detection_sweep.json"


def _num(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def result_line(summary: dict[str, Any]) -> str:
    """The RESULT line of a ``summarize_sweep`` answer."""
    caught = summary["caught"]
    counts = " ".join(
        f"cases_{sev}={n['caught']}/{n['tested']}/{n['not_tested']}"
        for sev, n in summary["by_severity"].items()
    )
    return (
        f"RESULT caught_moderate={_num(caught['moderate'], '.2f')} "
        f"caught_severe={_num(caught['severe'], '.2f')} "
        f"caught_threshold={_num(caught['threshold'], '.2f')} "
        f"not_reached={summary['not_reached']} "
        f"diagnosis_only={summary['diagnosis_only']} "
        f"consequences={summary['consequences']} "
        f"ttd_p50_s={_num(summary['ttd_p50_s'], '.1f')} "
        f"ttd_p90_s={_num(summary['ttd_p90_s'], '.1f')} "
        f"false_p0p1_per_h={_num(summary['false_p0p1_per_h'], '.1f')} "
        f"caught_single={_num(caught['single'], '.2f')} "
        f"errors={summary['errors']} {counts}"
    )


def table(summary: dict[str, Any]) -> list[str]:
    """One line per case: its outcome, the times, whether it reached its magnitude."""
    out = [
        f"{'fault':<24} {'severity':<10} {'outcome':<15} {'1st alert':>9} {'finding':>8}  reached"
    ]
    for c in summary["cases"]:
        sev = c["severity"]
        # a report from before single-magnitude faults ran once: three runs under three names
        ran_as = f"  (ran as {c['ran_as']})" if c.get("ran_as") else ""
        if c.get("skipped"):
            out.append(f"{c['fault']:<24} {sev:<10} not tested: skipped: {c['skipped']}{ran_as}")
            continue
        if c["outcome"] == "not tested":  # cut short by Ctrl-C
            out.append(f"{c['fault']:<24} {sev:<10} not tested: interrupted{ran_as}")
            continue
        outcome = {"caught": "caught", "missed": "MISSED", "error": "ERROR"}.get(
            c["outcome"], c["outcome"]
        )
        reached = {True: "yes", False: "not reached", None: "not judged"}[c.get("reached")]
        alert = "-" if c.get("first_alert_s") is None else f"{c['first_alert_s']:.1f} s"
        finding = "-" if c.get("finding_s") is None else f"{c['finding_s']:.0f} s"
        false = f"  false P0/P1: {', '.join(c['false_p0p1'])}" if c["false_p0p1"] else ""
        beyond = c.get("beyond_reach") or []
        out_of_reach = f"  out of reach: {', '.join(beyond)}" if beyond else ""
        error = f"  error: {c['error']}" if c.get("error") else ""
        out.append(
            f"{c['fault']:<24} {sev:<10} {outcome:<15} {alert:>9} {finding:>8}  "
            f"{reached}{false}{out_of_reach}{error}{ran_as}"
        )
    return out


def per_severity(summary: dict[str, Any]) -> list[str]:
    """One line per severity: caught / tested / not tested, and what the others were."""
    out = [
        f"{'severity':<10} {'caught':>6} {'tested':>6} {'not tested':>10} {'not reached':>11} "
        f"{'diag. only':>10} {'missed':>6} {'error':>5}"
    ]
    for sev, n in summary["by_severity"].items():
        out.append(
            f"{sev:<10} {n['caught']:>6} {n['tested']:>6} {n['not_tested']:>10} "
            f"{n['not_reached']:>11} {n['diagnosis_only']:>10} {n['missed']:>6} {n['error']:>5}"
        )
    return out


def _run_sweep(args: argparse.Namespace, report: Path) -> int:
    exe = shutil.which("aivitals", path=str(Path(sys.executable).parent)) or "aivitals"
    cmd = [exe, "validate", "--sweep", "--report", str(report)]
    if args.quick:
        cmd.append("--quick")
    if args.scenarios:
        cmd += ["--scenarios", args.scenarios]
    if args.record:
        cmd += ["--record", str(args.record)]
    print("running:", " ".join(cmd), flush=True)
    # validate's exit status is 1 when any check failed: the report says which
    proc = subprocess.Popen(cmd)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached validate too (same process group): it reverts the fault,
            # stops the stack and writes its partial report; killing it would not
            print("interrupted: waiting for validate to revert and write its report", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="validate's compressed time")
    parser.add_argument("--scenarios", default=None, metavar="A,B", help="only these faults")
    parser.add_argument("--from-report", type=Path, default=None, help="read this report")
    parser.add_argument(
        "--record", type=Path, default=None, help="keep every case as a recording here"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from aivitals.errors import ConfigError
    from aivitals.validate import summarize_sweep

    started = time.time()
    if args.from_report is not None:
        path = args.from_report
        code = None
    else:
        path = Path(tempfile.mkdtemp(prefix="aivitals-sweep-")) / "sweep.json"
        code = _run_sweep(args, path)
    try:
        report = json.loads(path.read_text())
        summary = summarize_sweep(report)
    except (OSError, ValueError, ConfigError) as exc:
        print(f"detection_sweep: {path}: {exc}", file=sys.stderr)
        return 2
    for line in [*table(summary), "", *per_severity(summary)]:
        print(line)
    if summary.get("interrupted"):
        print(f"PARTIAL: the sweep was interrupted; {summary['ran']} cases ran to the end")
    line = result_line(summary)
    earlier = report.get("result") if "scenarios" not in report else None
    if earlier:
        print(f"counted again from {path}; it read: {earlier}")
    print(line)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "result": line,
                "summary": summary,
                # a results file counted again names the report it came from
                "report": str(report.get("report", path)) if earlier else str(path),
                "counted_from": str(path) if earlier else None,
                "previous_result": report.get("previous_result") or earlier,
                "note": (
                    "counted again under the current counting rules; its cases ran at the "
                    "severity values of the sweep that wrote the report"
                )
                if earlier
                else None,
                "quick": report.get("quick"),
                "validate_exit": report.get("validate_exit") if earlier else code,
                "took_s": round(time.time() - started, 1),
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
