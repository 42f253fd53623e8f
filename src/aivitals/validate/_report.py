"""Checks, scenario results and the run's report (terminal lines and JSON)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
            f"{skipped} skipped, {took:.0f} s{cut}"
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        out["summary"] = self.summary()
        for s, d in zip(self.scenarios, out["scenarios"], strict=True):
            d["passed"] = s.passed
        return out

    def _sla_lines(self) -> list[str]:
        """The model SLA the rules ran with, and the measurement it came from."""
        sla = self.environment.get("sla_seconds")
        if sla is None:
            return []
        cal = self.environment.get("sla_calibration")
        how = (
            "set by the caller"
            if not cal
            else f"{cal['sla_per_median']:g} x the model's measured median, {cal['median_s']:g} s "
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
            "| case | layer | result | failed checks | diagnosis stable |",
            "|---|---|---|---|---|",
        ]
        for s in self.scenarios:
            verdict = "skipped" if s.skipped else ("pass" if s.passed else "FAIL")
            failed = sum(c.ok is False for c in s.checks) + (1 if s.error else 0)
            data = next((c.data for c in s.checks if c.name == "diagnosis"), {})
            share = data.get("stable_share")
            stable = "" if share is None else f"{share:.0%} of {data.get('polls_after', 0)}"
            out.append(f"| `{s.fault}` | {s.layer} | {verdict} | {failed} | {stable} |")
        for s in self.scenarios:
            took = f", {s.ended_at - s.started_at:.0f} s" if s.ended_at else ""
            out += ["", f"## {s.fault} ({s.layer} layer{took})", ""]
            if s.skipped:
                out.append(f"skipped: {s.skipped}")
                continue
            out += ["```", *(c.line() for c in s.checks)]
            if s.error:
                out.append(f"[fail] {s.error}")
            out.append("```")
        return "\n".join(out) + "\n"

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
