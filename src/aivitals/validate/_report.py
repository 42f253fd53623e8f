"""Checks, scenario results and the run's report (terminal lines, JSON, Markdown and
JUnit XML)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

__all__ = ["Check", "Report", "ScenarioResult", "fmt_change", "fmt_ms"]


@dataclass(slots=True)
class Check:
    """One line of the report. ``ok`` None is information, not a pass or a fail."""

    name: str
    ok: bool | None
    text: str
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        mark = "info" if self.ok is None else ("ok" if self.ok else "fail")
        return f"[{mark}] {self.text}"


@dataclass(slots=True)
class ScenarioResult:
    """One case: ``fault`` is its name (``gpu_oom``, ``cpu_burn+gpu_memory_leak``,
    ``gpu_contention@threshold``); ``faults`` what it injected; ``signature`` None
    for a pair or a fault the knowledge base does not know. The phase times are
    epoch seconds (baseline start, injection, revert)."""

    fault: str
    layer: str
    signature: str | None
    started_at: float
    checks: list[Check] = field(default_factory=list)
    ended_at: float | None = None
    skipped: str | None = None
    error: str | None = None
    faults: list[str] = field(default_factory=list)
    severity: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    t_baseline: float | None = None
    t_fault: float | None = None
    t_revert: float | None = None

    @property
    def passed(self) -> bool:
        return (
            self.skipped is None
            and self.error is None
            and all(c.ok is not False for c in self.checks)
        )

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check


@dataclass(slots=True)
class Report:
    quick: bool
    started_at: float = field(default_factory=time.time)
    scenarios: list[ScenarioResult] = field(default_factory=list)
    ended_at: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    #: Stopped by Ctrl-C (or SIGTERM) before every case ran: the report holds the cases
    #: that did (the one cut short with ``error`` "interrupted") and never passes.
    interrupted: bool = False
    #: How many cases were asked for (``scenarios`` lists those begun).
    planned: int | None = None

    @property
    def passed(self) -> bool:
        ran = [s for s in self.scenarios if s.skipped is None]
        return not self.interrupted and bool(ran) and all(s.passed for s in ran)

    def summary(self) -> str:
        ran = [s for s in self.scenarios if s.skipped is None]
        ok = sum(s.passed for s in ran)
        skipped = len(self.scenarios) - len(ran)
        checks = [c for s in ran for c in s.checks if c.ok is not None]
        failed = sum(not c.ok for c in checks)
        took = (self.ended_at or time.time()) - self.started_at
        cut = ""
        if self.interrupted:
            of = "" if self.planned is None else f" of {self.planned}"
            cut = f"; interrupted after {len(self.scenarios)}{of} cases"
        return (
            f"{ok}/{len(ran)} scenarios passed, {failed} of {len(checks)} checks failed, "
            f"{skipped} not tested, {took:.0f} s{cut}"
        )

    @property
    def not_tested(self) -> list[dict[str, str]]:
        """The cases the run could not test, each with the reason: never a pass."""
        return [
            {"case": s.fault, "reason": s.skipped} for s in self.scenarios if s.skipped is not None
        ]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        out["summary"] = self.summary()
        out["not_tested"] = self.not_tested
        for s, d in zip(self.scenarios, out["scenarios"], strict=True):
            d["passed"] = s.passed
        return out

    def to_junit(self) -> str:
        """The report as JUnit XML, for a CI's test view: one testsuite, one testcase per
        case; a failed check or a case error is a ``failure``, a case that could not be
        tested is ``skipped`` with its reason (never a pass)."""
        ran = [s for s in self.scenarios if s.skipped is None]
        took = (self.ended_at or time.time()) - self.started_at
        suite = ET.Element(
            "testsuite",
            name="aivitals validate",
            tests=str(len(self.scenarios)),
            failures=str(sum(not s.passed for s in ran)),
            errors="0",
            skipped=str(len(self.scenarios) - len(ran)),
            time=f"{took:.1f}",
            timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.started_at)),
        )
        for s in self.scenarios:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"aivitals.validate.{s.layer}",
                name=s.fault,
                time=f"{(s.ended_at or s.started_at) - s.started_at:.1f}",
            )
            if s.skipped is not None:
                ET.SubElement(case, "skipped", message=f"not tested: {s.skipped}")
                continue
            failed = [c for c in s.checks if c.ok is False]
            if s.error:
                failed.append(Check("error", False, s.error))
            if failed:
                fail = ET.SubElement(
                    case,
                    "failure",
                    message="; ".join(c.text for c in failed)[:1000],
                    type=",".join(c.name for c in failed),
                )
                fail.text = "\n".join(c.line() for c in failed)
            out = ET.SubElement(case, "system-out")
            out.text = "\n".join(c.line() for c in s.checks)
        if self.interrupted:
            ET.SubElement(suite, "system-err").text = "interrupted before every case ran"
        ET.indent(suite)
        return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"

    def _sla_lines(self) -> list[str]:
        """The model SLA the rules ran with, and the measurement it came from."""
        sla = self.environment.get("sla_seconds")
        if sla is None:
            return []
        cal = self.environment.get("sla_calibration")
        if not cal:
            how = "set by the caller"
        elif cal.get("request"):
            how = (
                f"{cal['sla_per_median']:g} x the service's measured median, "
                f"{cal['median_s']:g} s over {cal['completed']} requests {cal['request']} at "
                f"{cal['concurrency']} in flight"
            )
        else:
            how = (
                f"{cal['sla_per_median']:g} x the model's measured median, {cal['median_s']:g} s "
                f"over {cal['completed']} completions at {cal['concurrency']} in flight"
            )
        return [f"Model SLA of the rules: {sla:g} s ({how}).", ""]

    def to_markdown(self) -> str:
        """The report as Markdown: a summary table, then every check of every scenario."""
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.started_at))
        mode = "--quick" if self.quick else "full"
        out = [
            "# aivitals validate report",
            "",
            f"Run {when}, mode `{mode}`: **{self.summary()}**.",
            "",
            *self._sla_lines(),
            *self._target_lines(),
            "| case | layer | result | failed checks | diagnosis stable |",
            "|---|---|---|---|---|",
        ]
        for s in self.scenarios:
            verdict = "not tested" if s.skipped else ("pass" if s.passed else "FAIL")
            failed = sum(c.ok is False for c in s.checks) + (1 if s.error else 0)
            data = next((c.data for c in s.checks if c.name == "diagnosis"), {})
            share = data.get("stable_share")
            stable = "" if share is None else f"{share:.0%} of {data.get('polls_after', 0)}"
            out.append(f"| `{s.fault}` | {s.layer} | {verdict} | {failed} | {stable} |")
        for s in self.scenarios:
            took = f", {s.ended_at - s.started_at:.0f} s" if s.ended_at else ""
            out += ["", f"## {s.fault} ({s.layer} layer{took})", ""]
            if s.skipped:
                out.append(f"not tested: {s.skipped}")
                continue
            out += ["```", *(c.line() for c in s.checks)]
            if s.error:
                out.append(f"[fail] {s.error}")
            out.append("```")
        return "\n".join(out) + "\n"

    def _target_lines(self) -> list[str]:
        """The user's service (``--target``) and the faults that do not apply to it."""
        target = self.environment.get("target")
        if not target:
            return []
        out = [f"Target: {target['url']}, {target['request']}, pid {target['pid']}.", ""]
        why = {k: v for k, v in self.environment.get("applicability", {}).items() if v != "applies"}
        if why:
            out += ["Faults that cannot apply to this target (not tested):", ""]
            out += [f"- `{name}`: {reason}" for name, reason in why.items()]
            out.append("")
        return out

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path


def fmt_ms(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "n/a"
    return f"{seconds * 1000:.0f} ms"


def fmt_change(before: float | None, after: float | None) -> str:
    if not before or after is None or before != before or after != after:
        return ""
    return f" ({(after - before) / before * 100:+.0f}%)"
