"""detection_sweep: is every fault caught at threshold, moderate and severe magnitude?

Runs the real CLI, ``aivitals validate --sweep [--quick] --report <json>`` (every
fault at the three severities of ``aivitals.validate._severity``, each derived from
the rule pack's or the diagnosis's bound, see docs/validate.md "Severity sweep"),
in a subprocess, or reads an existing report with ``--from-report``. Prints per
fault x severity: caught or not (every expected alert fired, and the diagnosis
named the fault and kept naming it on every poll after), the time from injection
to the first expected alert, the time to a correct and stable top finding, and
whether the fault reached the magnitude asked on this machine. Then one line:

``RESULT caught_moderate=... caught_severe=... caught_threshold=... ttd_p50_s=...
ttd_p90_s=... false_p0p1_per_h=... unreached=N``

``caught_*`` are shares (0..1) over the cases whose severity was reached (or could
not be measured); the cases that could not reach their magnitude here are counted
apart as ``unreached``, neither caught nor missed. ``ttd_*`` are percentiles of the
time to the first expected alert over the caught cases. ``false_p0p1_per_h`` is
the number of P0/P1 alerts that neither the case expected nor the fault table
lists as a consequence, per hour of fault phase. Writes
benchmarks/results/detection_sweep.json (``--output`` elsewhere).

Run (it starts the demo stack and every fault; minutes to hours):
``.venv/bin/python benchmarks/detection_sweep.py --quick [--scenarios a,b] [--record DIR]``.
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
    return (
        f"RESULT caught_moderate={_num(caught['moderate'], '.2f')} "
        f"caught_severe={_num(caught['severe'], '.2f')} "
        f"caught_threshold={_num(caught['threshold'], '.2f')} "
        f"ttd_p50_s={_num(summary['ttd_p50_s'], '.1f')} "
        f"ttd_p90_s={_num(summary['ttd_p90_s'], '.1f')} "
        f"false_p0p1_per_h={_num(summary['false_p0p1_per_h'], '.1f')} "
        f"unreached={summary['unreached']}"
    )


def table(summary: dict[str, Any]) -> list[str]:
    """One line per fault x severity."""
    out = [f"{'fault':<24} {'severity':<10} {'caught':<8} {'1st alert':>9} {'finding':>8}  reached"]
    for c in summary["cases"]:
        if c.get("skipped"):
            out.append(f"{c['fault']:<24} {c['severity']:<10} skipped: {c['skipped']}")
            continue
        if c.get("caught") is None:  # cut short by Ctrl-C
            out.append(f"{c['fault']:<24} {c['severity']:<10} interrupted (not counted)")
            continue
        reached = {True: "yes", False: "not reached", None: "not judged"}[c["reached"]]
        caught = "yes" if c["caught"] else "NO"
        if c.get("error"):
            caught = "ERROR"
        alert = "-" if c["first_alert_s"] is None else f"{c['first_alert_s']:.1f} s"
        finding = "-" if c["finding_s"] is None else f"{c['finding_s']:.0f} s"
        false = f"  false P0/P1: {', '.join(c['false_p0p1'])}" if c["false_p0p1"] else ""
        beyond = c.get("beyond_reach") or []
        out_of_reach = f"  out of reach: {', '.join(beyond)}" if beyond else ""
        out.append(
            f"{c['fault']:<24} {c['severity']:<10} {caught:<8} {alert:>9} {finding:>8}  "
            f"{reached}{false}{out_of_reach}"
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
    for line in table(summary):
        print(line)
    if summary.get("interrupted"):
        print(f"PARTIAL: the sweep was interrupted; {summary['ran']} cases ran to the end")
    line = result_line(summary)
    print(line)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "result": line,
                "summary": summary,
                "report": str(path),
                "quick": report.get("quick"),
                "validate_exit": code,
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
