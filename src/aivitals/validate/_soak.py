"""``aivitals validate --soak DURATION``: the demo stack under its normal, changing load and
no fault; a monitor worth trusting stays quiet.

The demo's replay of the Azure trace (its own bursts, ``aivitals.demo.SoakLoad``) with
a slow ramp of the whole traffic's rate (x0.5 to x1.5 over the run, the same share
every minute), cache churn (the popular
prompts drift, so cached keys stop being asked and expire while new ones are cached;
nothing is flushed) and one planned model reload half-way (new models loaded and warmed
beside the old ones, then swapped, as a deployment does it; the ``ModelReloaded`` P2 it
raises is expected). Every alert that fires is counted by rule
and severity (the pack's ``severity`` label); the diagnosis is asked at a fixed cadence
over a recent window and must find nothing at or above ``HIGH_CONFIDENCE``. It passes
with no P0/P1 alert, every poll healthy, and the load and the stack alive to the end.

**Usage**::

    report = run_soak(ValidateConfig(quick=True), 300.0)
    report.write(Path("soak.json")); sys.exit(0 if report.passed else 1)
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AivitalsError, ConfigError
from ..timescale import TimeScale
from ._config import ValidateConfig
from ._lock import RunLock
from ._target import ValidateTarget

__all__ = [
    "MAX_SOAK_S",
    "PLANNED_RELOAD_ALERTS",
    "PLANNED_RELOAD_FINDINGS",
    "PollResult",
    "SoakPlan",
    "SoakReport",
    "parse_soak_duration",
    "run_soak",
]

Echo = Callable[[str], None]

#: The longest soak: a week (as ``--soak`` takes; a longer one is a deployment, not a check).
MAX_SOAK_S = 7 * 86400.0
#: Alerts a planned model reload legitimately raises (the model was loaded again), and
#: how long after the reload they count as its consequence rather than a false alert.
PLANNED_RELOAD_ALERTS = ("ModelReloaded",)
#: Diagnosis findings that name the planned reload itself (reported apart, still counted).
PLANNED_RELOAD_FINDINGS = ("cold_start",)
#: Severities that page (the rule pack's ``severity`` label).
PAGING = ("P0", "P1")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_soak_duration(text: str | float) -> float:
    """Seconds from ``300``, ``90s``, ``5m``, ``1h``, ``1h30m``: ``ConfigError`` otherwise,
    and for a duration <= 0 or over ``MAX_SOAK_S``."""
    if isinstance(text, bool):
        raise ConfigError(f"soak duration {text!r}: expected seconds or 5m, 1h")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        raw = text.strip().lower()
        parts = _DURATION.findall(raw)
        if not raw or "".join(n + u for n, u in parts) != raw:
            raise ConfigError(
                f"soak duration {text!r}: expected seconds (300) or a duration (90s, 5m, 1h, 1h30m)"
            )
        seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_SOAK_S):
        raise ConfigError(f"soak duration {text!r}: expected more than 0 s and at most a week")
    return seconds


@dataclass(frozen=True)
class SoakPlan:
    """The cadence of one soak: when the diagnosis is asked, over which window, and when
    the reload happens, from the run's time scale (``TimeScale.soak``). Quick runs have
    compressed rule time (1 s ticks) and poll every 10 s over the last minute; full runs
    poll every 30 s over the last 3 minutes."""

    duration: float
    quick: bool
    poll_every: float
    window: float
    min_window: float
    reload_at: float
    cache_ttl: float
    #: load at the ramp's start rate before the soak's clock: one cache TTL, so the soak
    #: starts on a warm cache, not on the stack's first requests
    warm_up: float = 0.0
    swing: tuple[float, float] = (0.5, 1.5)

    @classmethod
    def for_run(cls, duration: float, quick: bool) -> SoakPlan:
        duration = parse_soak_duration(duration)
        c = TimeScale.of(quick).soak
        if duration < 2 * c.min_window:
            raise ConfigError(
                f"soak duration {duration:g} s: at least {2 * c.min_window:g} s "
                f"({'quick' if quick else 'full'} run), so the diagnosis is asked more than once"
            )
        return cls(
            duration=duration,
            quick=quick,
            poll_every=c.poll_every,
            window=c.window,
            min_window=c.min_window,
            reload_at=duration / 2,
            cache_ttl=c.cache_ttl,
            warm_up=c.cache_ttl,
        )

    def poll_times(self) -> list[float]:
        """Seconds into the soak at which the diagnosis is asked."""
        first = math.ceil(self.min_window / self.poll_every) * self.poll_every
        n = math.ceil((self.duration - first) / self.poll_every)  # all before the end
        return [first + i * self.poll_every for i in range(max(0, n))]


@dataclass
class PollResult:
    """One diagnosis poll: ``at`` seconds into the soak, over ``window`` seconds."""

    at: float
    window: float
    healthy: bool
    shape: str
    #: findings at or above the report floor: (signature, layer, confidence)
    findings: list[tuple[str, str, float]] = field(default_factory=list)
    error: str | None = None
    #: where each finding points (its ``where`` labels: ``cache=embeddings``), in order
    where: list[str] = field(default_factory=list)
    #: not healthy, and what it named at or above the threshold is only the planned
    #: reload (``PLANNED_RELOAD_FINDINGS``): still counted as not healthy, told apart
    names_planned_reload: bool = False


@dataclass
class AlertFiring:
    """One alert that fired during the soak (``at``: seconds into the soak)."""

    alertname: str
    severity: str
    at: float
    value: float
    summary: str
    #: a consequence of the planned reload (``PLANNED_RELOAD_ALERTS`` after it)
    expected: bool = False
    resolved_after: float | None = None


@dataclass
class SoakReport:
    quick: bool
    duration: float
    started_at: float = field(default_factory=time.time)
    #: when the replay started (epoch s); the soak's clock counts from it
    soak_started_at: float | None = None
    ended_at: float | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    alerts: list[AlertFiring] = field(default_factory=list)
    #: alerts that fired during start-up (the stack and the capacity probe), not counted
    startup_alerts: list[str] = field(default_factory=list)
    poll_results: list[PollResult] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    #: (seconds into the soak, completions sent per second / the x1 rate) per window
    multiplier: list[tuple[float, float]] = field(default_factory=list)
    #: (seconds into the soak, {cache: hit ratio over the last poll interval})
    cache_hit_ratio: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    reload: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    interrupted: bool = False

    # --- the numbers -------------------------------------------------------------------------
    @property
    def soaked_s(self) -> float:
        """Seconds the soak ran (its load), at most its duration."""
        if self.soak_started_at is None:
            return 0.0
        end = self.ended_at or time.time()
        return max(0.0, min(self.duration, end - self.soak_started_at))

    def per_hour(self, count: int) -> float:
        hours = self.soaked_s / 3600.0
        return count / hours if hours > 0 else 0.0

    @property
    def false_alerts(self) -> list[AlertFiring]:
        return [a for a in self.alerts if not a.expected]

    @property
    def alerts_p0p1(self) -> int:
        return sum(a.severity in PAGING for a in self.alerts)

    def by_rule(self, *, paging_only: bool = False) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.false_alerts:
            if not paging_only or a.severity in PAGING:
                out[a.alertname] = out.get(a.alertname, 0) + 1
        return dict(sorted(out.items()))

    @property
    def polls(self) -> int:
        return len(self.poll_results)

    @property
    def healthy_polls(self) -> int:
        return sum(p.healthy for p in self.poll_results)

    @property
    def polls_naming_planned_reload(self) -> int:
        return sum(p.names_planned_reload for p in self.poll_results)

    @property
    def passed(self) -> bool:
        return (
            not self.interrupted
            and not self.problems
            and self.alerts_p0p1 == 0
            and self.polls > 0
            and self.healthy_polls == self.polls
        )

    def requests(self) -> dict[str, int]:
        keys = ("sent", "answered", "errors", "timeouts")
        return {k: sum(int(c.get(k, 0)) for c in self.clients) for k in keys}

    def multiplier_range(self) -> tuple[float, float] | None:
        values = [m for _, m in self.multiplier]
        return (min(values), max(values)) if values else None

    def summary(self) -> str:
        req = self.requests()
        by = ", ".join(f"{k} x{v}" for k, v in self.by_rule().items()) or "none"
        p0p1 = self.alerts_p0p1
        verdict = "passed" if self.passed else "FAILED"
        why = "" if self.passed else f" ({'; '.join(self._failures())})"
        mode = "quick" if self.quick else "full"
        failed: dict[str, int] = {}
        for c in self.clients:
            for kind, n in (c.get("error_kinds") or {}).items():
                failed[kind] = failed.get(kind, 0) + int(n)
        kinds = f" ({', '.join(f'{k} x{n}' for k, n in sorted(failed.items()))})" if failed else ""
        return (
            f"soak {self.soaked_s:.0f} of {self.duration:g} s ({mode}):"
            f" {p0p1} P0/P1 alerts ({self.per_hour(p0p1):.1f}/h), false alerts by rule: {by}; "
            f"{self.healthy_polls}/{self.polls} polls healthy; {req['sent']} requests sent, "
            f"{req['answered']} answered, {req['errors'] + req['timeouts']} errors{kinds}; "
            f"{verdict}{why}"
        )

    def _failures(self) -> list[str]:
        out = []
        if self.interrupted:
            out.append("interrupted")
        if self.alerts_p0p1:
            out.append(f"{self.alerts_p0p1} P0/P1 alerts fired")
        if not self.polls:
            out.append("no diagnosis poll ran")
        elif self.healthy_polls < self.polls:
            reload = self.polls_naming_planned_reload
            only = f", {reload} of them naming only the planned reload" if reload else ""
            out.append(f"{self.polls - self.healthy_polls} polls not healthy{only}")
        out += self.problems
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        p0p1 = self.alerts_p0p1
        rng = self.multiplier_range()
        out.update(
            passed=self.passed,
            summary=self.summary(),
            soaked_s=self.soaked_s,
            alerts_p0p1=p0p1,
            false_p0p1_per_h=self.per_hour(sum(self.by_rule(paging_only=True).values())),
            false_per_h=self.per_hour(len(self.false_alerts)),
            false_per_h_by_rule={k: self.per_hour(v) for k, v in self.by_rule().items()},
            false_p0p1_per_h_by_rule={
                k: self.per_hour(v) for k, v in self.by_rule(paging_only=True).items()
            },
            polls=self.polls,
            healthy_polls=self.healthy_polls,
            polls_naming_planned_reload=self.polls_naming_planned_reload,
            requests=self.requests(),
            multiplier_range=list(rng) if rng else None,
        )
        return out

    def to_markdown(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.started_at))
        mode = "--quick" if self.quick else "full"
        req = self.requests()
        rng = self.multiplier_range()
        w = self.workload
        out = [
            "# aivitals validate --soak report",
            "",
            f"Run {when}, mode `{mode}`, {self.duration:g} s of soak: **{self.summary()}**.",
            "",
            f"- load: {w.get('why', 'not started')}",
            f"- requests: {req['sent']} sent, {req['answered']} answered, {req['errors']} "
            f"errors, {req['timeouts']} timeouts",
            "- rate multiplier achieved (completions sent / the x1 rate, per "
            f"{w.get('multiplier_window_s', 0):g} s window): "
            + (f"x{rng[0]:.2f} .. x{rng[1]:.2f}" if rng else "not measured")
            + f" (planned x{w.get('swing', [0, 0])[0]:g} .. x{w.get('swing', [0, 0])[1]:g})",
            f"- planned model reload: {self._reload_text()}",
            f"- model SLA of the rules: {w['sla_seconds']:g} s"
            if "sla_seconds" in w
            else "- model SLA of the rules: not set",
            f"- diagnosis polls healthy: {self.healthy_polls}/{self.polls}",
            "",
            "## Alerts",
            "",
        ]
        if self.alerts:
            out += ["| alert | severity | at (s) | resolved after (s) | counted | summary |"]
            out += ["|---|---|---|---|---|---|"]
            for a in self.alerts:
                res = "" if a.resolved_after is None else f"{a.resolved_after:.0f}"
                counted = "no (planned reload)" if a.expected else "false alert"
                out.append(
                    f"| {a.alertname} | {a.severity} | {a.at:.0f} | {res} | {counted} | "
                    f"{a.summary.replace('|', '/')} |"
                )
            out += ["", "False alerts per hour by rule:", ""]
            out += [f"- {k}: {self.per_hour(v):.1f}/h" for k, v in self.by_rule().items()]
        else:
            out.append("No alert fired.")
        if self.startup_alerts:
            out += ["", f"During start-up (not counted): {', '.join(self.startup_alerts)}."]
        out += ["", "## Diagnosis polls", ""]
        bad = [p for p in self.poll_results if not p.healthy]
        if not bad:
            out.append(f"All {self.polls} polls healthy (no finding at or above the threshold).")
        for p in bad:
            named = ", ".join(
                f"{s} ({lay}{'; ' + w if w else ''}) {c:.2f}"
                for (s, lay, c), w in zip(
                    p.findings, p.where or [""] * len(p.findings), strict=False
                )
            )
            note = "; names only the planned reload" if p.names_planned_reload else ""
            out.append(f"- {p.at:.0f} s: {p.error or named} (shape {p.shape}{note})")
        out += ["", "## Cache hit ratio over time", "", "| s | " + " | ".join(self._caches())]
        out[-1] += " |"
        out.append("|---" * (1 + len(self._caches())) + "|")
        for at, ratios in self.cache_hit_ratio:
            cells = [f"{ratios[c]:.2f}" if c in ratios else "" for c in self._caches()]
            out.append(f"| {at:.0f} | " + " | ".join(cells) + " |")
        if self.problems:
            out += ["", "## Problems", "", *(f"- {p}" for p in self.problems)]
        return "\n".join(out) + "\n"

    def _caches(self) -> list[str]:
        return sorted({c for _, r in self.cache_hit_ratio for c in r})

    def _reload_text(self) -> str:
        r = self.reload
        if not r:
            return "not done"
        if r.get("error"):
            return f"failed: {r['error']}"
        ready = r.get("ready_after_s")
        load = r.get("model_load_s") or {}
        loads = ", ".join(f"{m} {v:.2f} s" for m, v in sorted(load.items()))
        return (
            f"at {r.get('at_s', 0):.0f} s (warm swap); new models serving after "
            + ("never" if ready is None else f"{ready:.1f} s")
            + (f" (the service's own model load: {loads})" if loads else "")
        )

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path


# --- the run ---------------------------------------------------------------------------------
def run_soak(config: ValidateConfig, duration: float, *, echo: Echo = print) -> SoakReport:
    """Soak the demo stack for ``duration`` seconds of load with no fault; see the module doc.

    ``config.quick`` compresses rule time as ``validate --quick`` does; ``config.gpu``,
    ``config.workdir``, ``config.rule_params`` and ``config.lock_path`` apply as for
    validate. Ctrl-C ends the soak early: everything is stopped and the report (marked
    interrupted, not passed) is returned.
    """
    plan = SoakPlan.for_run(duration, config.quick)  # bad input fails before anything starts

    from ..demo import MAX_OUTPUT_TOKENS, SoakLoad
    from ._runner import _environment, new_stack, start_calibrated_agent

    with RunLock(config.lock_path):
        report = SoakReport(quick=config.quick, duration=plan.duration)
        stack = new_stack(config, plan.cache_ttl)
        load: Any = None
        try:
            echo(
                f"starting Redis, the demo service and the agent for a {plan.duration:g} s soak "
                f"({'quick' if config.quick else 'full'} run, no fault)"
            )
            stack.start()
            # the trace's generations run up to MAX_OUTPUT_TOKENS, 4x the fault cases':
            # the SLA grows with them (see _demo_rule_params)
            calibration = start_calibrated_agent(
                stack, dict(config.rule_params), MAX_OUTPUT_TOKENS, echo
            )
            report.environment = _environment(stack, calibration, plan.cache_ttl)
            if stack.ledger is not None:
                report.environment["stack_ledger"] = stack.ledger.run_id
            load = SoakLoad(
                stack,
                duration=plan.duration,
                cache_ttl=plan.cache_ttl,
                swing=plan.swing,
                warm_up=plan.warm_up,
                # the trace's own drift levelled over windows of half the report's at the
                # swing's lowest rate (a report window then holds two or more whole ones),
                # so the rate sent follows the plan; shorter bursts keep their shape
                level_window=plan.swing[0] * _multiplier_window(plan) / 2,
            )
            echo("measuring the service's capacity (5 s) ...")
            load.start()
            echo(load.why())
            echo(
                f"the x{plan.swing[1]:g} peak asks {load.utilization:.0%} of the measured capacity"
            )
            echo(f"warming up for {plan.warm_up:g} s at x{plan.swing[0]:g} (a warm cache)")
            while load.seconds < 0:
                load.check()
                time.sleep(0.5)
            report.soak_started_at = load.started_at
            report.startup_alerts = sorted(
                {
                    e.alertname
                    for e in stack.engine.history(end=load.started_at)
                    if e.state == "firing"
                }
            )
            report.workload = _workload(load, plan)
            report.workload["sla_seconds"] = stack.pack.params.sla_seconds
            _soak(stack, load, plan, report, echo)
        except KeyboardInterrupt:
            report.interrupted = True
            echo("interrupted: stopping everything")
        except AivitalsError as exc:
            report.problems.append(f"{type(exc).__name__}: {exc}")
            echo(f"[fail] {report.problems[-1]}")
        finally:
            report.ended_at = time.time()
            if load is not None:
                load.stop()
                report.clients = _clients(load)
            if report.soak_started_at is not None and stack.engine is not None:
                report.alerts = _firings(stack, report.soak_started_at, report.reload)
                if config.record is not None:
                    _record(stack, config, report, plan, echo)
            try:
                stack.stop()
            except AivitalsError as exc:
                report.problems.append(f"cleanup: {exc}")
                echo(f"[fail] cleanup: {exc}")
        return report


def _clients(load: Any) -> list[dict[str, Any]]:
    """Each load stream's counters, and what its failed requests were (``error_kinds``:
    the load generator's own reasons, e.g. a connection reset or an HTTP status), so a
    soak that lost one request of thousands says which kind it was."""
    out = []
    for stream, counts in zip(load.streams, load.clients(), strict=True):
        row = asdict(counts)
        kinds: dict[str, int] = {}
        for rep in stream.reports:
            for kind, n in rep.errors.items():
                kinds[str(kind)] = kinds.get(str(kind), 0) + int(n)
        row["error_kinds"] = kinds
        out.append(row)
    return out


def _record(
    stack: ValidateTarget, config: ValidateConfig, report: SoakReport, plan: SoakPlan, echo: Echo
) -> None:
    """Save the soak (warm-up included) as a ``soak`` recording: nothing injected, healthy.

    The label's ``polls`` holds each poll's ``[end, window]`` (epoch s), so a change to
    the diagnosis can be judged offline at the moments the soak asked it.
    """
    from ._record import save_stack_window

    assert report.soak_started_at is not None and config.record is not None
    start = report.soak_started_at - plan.warm_up
    end = report.ended_at or time.time()
    label = {
        "name": f"soak-{plan.duration:g}s{'-quick' if config.quick else ''}",
        "kind": "soak",
        "faults": [],
        "expected": [],
        "layer": None,
        "severity": None,
        "params": {"swing": list(plan.swing), "reload_at_s": plan.reload_at},
        "t_baseline": start,
        "t_fault": None,
        "t_revert": None,
        "quick": config.quick,
        "tick": stack.config.tick,
        "passed": report.passed,
        "polls": [[report.soak_started_at + p.at, p.window] for p in report.poll_results],
        "reload_at": (
            None
            if report.reload.get("at_s") is None
            else report.soak_started_at + float(report.reload["at_s"])
        ),
    }
    try:
        path = save_stack_window(stack, config.record, label, start=start, end=end)
    except Exception as exc:  # a failed recording is reported; the soak's verdict stands
        report.problems.append(f"recording failed: {exc}")
        echo(f"[fail] recording failed: {exc}")
        return
    echo(f"recorded to {path}")


def _workload(load: Any, plan: SoakPlan) -> dict[str, Any]:
    w = load.workload
    cap = w.capacity
    return {
        "why": load.why(),
        "trace": load.trace,
        "capacity_rps": None if cap is None else cap.rps,
        "base_rps": w.target_rps,
        "utilization": w.utilization,
        # the share of the capacity the swing's busiest point asks (x1 asks ``utilization``)
        "peak_utilization": w.utilization * max(1.0, plan.swing[1]),
        "swing": list(plan.swing),
        "pool_size": w.pool_size,
        "expected_hit_ratio": w.expected_hit_ratio,
        "cache_ttl_s": plan.cache_ttl,
        "warm_up_s": plan.warm_up,
        "churn_every_s": load.churn_every,
        "embeddings_rps": w.embeddings_rps,
        "length_scale": w.length_scale,
        "poll_every_s": plan.poll_every,
        "poll_window_s": plan.window,
        "multiplier_window_s": _multiplier_window(plan),
    }


def _multiplier_window(plan: SoakPlan) -> float:
    # a tenth of the run: long enough to average the trace's own bursts, short enough to
    # follow the swing (one period over the run)
    return max(plan.poll_every, plan.duration / 10)


def _soak(stack: ValidateTarget, load: Any, plan: SoakPlan, report: SoakReport, echo: Echo) -> None:
    from ..diagnose import FindingMemory

    polls = plan.poll_times()
    # the polls are successive looks at one service: a finding held across them is
    # judged as held, as an operator watching the agent would read it
    memory = FindingMemory(TimeScale.of(plan.quick).hold)
    # from the soak's start: the counters also hold the warm-up's requests
    sent: list[tuple[float, int]] = [(load.seconds, _completions_sent(load))]
    reload = _Reload(plan.reload_at)
    last_status = 0.0
    try:
        while (now := load.seconds) < plan.duration:
            try:
                load.check()
            except AivitalsError as exc:
                report.problems.append(str(exc))
                echo(f"[fail] {exc}")
                return
            sent.append((now, _completions_sent(load)))
            reload.step(stack, now, report, echo)
            if polls and now >= polls[0]:
                polls.pop(0)
                _poll(stack, load, plan, report, echo, memory)
            if now - last_status >= 60.0:
                last_status = now
                echo(_status(load, now))
            time.sleep(0.5)
    finally:
        reload.finish(stack, report, echo)
        reload.measure(stack, report)
        report.multiplier = _achieved(sent, load.base_rps, _multiplier_window(plan))


def _completions_sent(load: Any) -> int:
    return sum(c.sent for c in load.clients() if c.name == "completions")


def _status(load: Any, now: float) -> str:
    c = {x.name: x for x in load.clients()}
    comp = c.get("completions")
    sent = comp.sent if comp else 0
    return (
        f"[{now:4.0f} s] planned rate x{load.multiplier(now):.2f}; completions sent {sent}, "
        f"errors {comp.errors + comp.timeouts if comp else 0}"
    )


def _achieved(
    sent: list[tuple[float, int]], base_rps: float, window: float
) -> list[tuple[float, float]]:
    """Completions sent per second over consecutive ``window``-second windows, divided by
    the x1 rate: the multiplier the clients actually sent (the trace's bursts included)."""
    if base_rps <= 0 or len(sent) < 2:
        return []
    out = []
    start_t, start_n = sent[0]
    for t, n in sent[1:]:
        if t - start_t >= window:
            out.append((t, (n - start_n) / (t - start_t) / base_rps))
            start_t, start_n = t, n
    return out


class _Reload:
    """The planned reload, half-way, done as a deployment does it: the service loads and
    warms new models beside the old ones and swaps them in (``POST`` to the demo's
    ``RELOAD_PATH``; requests go on being served meanwhile). Run in a thread, so the
    soak's load checks and polls go on; ``ready_after_s`` is how long the swap took.

    Not the ``cold_start`` fault (drop the models, the next request pays the load): that
    is a fault validate injects and the diagnosis must name, not a routine operation.
    """

    def __init__(self, at: float) -> None:
        self.at = at
        self.thread: threading.Thread | None = None
        self.result: dict[str, Any] = {}
        self.done = False
        self.before: dict[str, float] = {}

    def step(self, stack: ValidateTarget, now: float, report: SoakReport, echo: Echo) -> None:
        if self.done or now < self.at:
            return
        if self.thread is None:
            echo(f"[{now:4.0f} s] planned model reload: new models loaded and warmed, then swapped")
            report.reload = {"at_s": now}
            self.before = _load_times(stack)
            self.thread = threading.Thread(
                target=self._post, args=(stack,), name="aivitals-soak-reload", daemon=True
            )
            self.thread.start()
            return
        if self.thread.is_alive():
            return
        self.done = True
        if "error" in self.result:
            report.reload["error"] = self.result["error"]
            report.problems.append(f"planned reload: {self.result['error']}")
            echo(f"[fail] {report.problems[-1]}")
        else:
            took = float(self.result["took"])
            report.reload["ready_after_s"] = took
            echo(f"[{now:4.0f} s] the new models serve {took:.1f} s after the reload began")

    def _post(self, stack: ValidateTarget) -> None:
        import httpx

        from ..demo import RELOAD_PATH

        t0 = time.time()
        try:
            r = httpx.post(
                stack.service.url + RELOAD_PATH,
                headers={"X-Aivitals-Token": stack.chaos_token},
                timeout=120.0,
            )
            r.raise_for_status()
        except Exception as exc:  # said in the report; the soak goes on
            self.result = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            self.result = {"took": time.time() - t0}

    def finish(self, stack: ValidateTarget, report: SoakReport, echo: Echo) -> None:
        if self.thread is not None and not self.done:
            self.thread.join(timeout=120.0)
            self.step(stack, self.at, report, echo)

    def measure(self, stack: ValidateTarget, report: SoakReport) -> None:
        """The service's own timing of the reload: the load-time gauges that changed
        (read at the soak's end: the reload's value reaches the store with a scrape)."""
        if self.thread is None:
            return
        changed = {k: v for k, v in _load_times(stack).items() if self.before.get(k) != v}
        if changed:
            report.reload["model_load_s"] = changed


def _load_times(stack: ValidateTarget) -> dict[str, float]:
    """``model_load_time_seconds`` now, by model."""
    return {
        str(dict(s.labels).get("model", "?")): float(s.value)
        for s in stack.query("model_load_time_seconds")
    }


def _poll(
    stack: ValidateTarget,
    load: Any,
    plan: SoakPlan,
    report: SoakReport,
    echo: Echo,
    memory: Any = None,
) -> None:
    """Ask the diagnosis over the last ``plan.window`` seconds (never before the warm-up),
    through the soak's ``memory`` (a ``FindingMemory``) when given."""
    from ..diagnose import HIGH_CONFIDENCE

    now = time.time()
    at = now - load.started_at
    window = min(plan.window, at + plan.warm_up)
    try:
        d = stack.diagnose(window=window, end=now)
        if memory is not None:
            d = memory.update(d)
    except Exception as exc:  # a broken diagnosis is an unhealthy poll, said so
        poll = PollResult(at, window, False, "error", error=f"{type(exc).__name__}: {exc}")
    else:
        named = [(str(f.signature), str(f.layer), float(f.confidence)) for f in d.findings]
        high = [f for f in named if f[2] >= HIGH_CONFIDENCE]
        poll = PollResult(at, window, not high, str(d.shape), named[:5])
        poll.where = [
            ",".join(f"{k}={v}" for k, v in sorted(dict(getattr(f, "where", {}) or {}).items()))
            for f in list(d.findings)[:5]
        ]
        reloaded = report.reload.get("at_s")
        poll.names_planned_reload = bool(
            high
            and reloaded is not None
            and at >= reloaded
            and all(f[0] in PLANNED_RELOAD_FINDINGS for f in high)
        )
    report.poll_results.append(poll)
    report.cache_hit_ratio.append((at, _hit_ratios(stack, plan.poll_every)))
    alerts = sorted({a.alertname for a in stack.engine.firing()})
    head = f"[{at:4.0f} s] rate x{load.multiplier(at):.2f}, firing: {', '.join(alerts) or 'none'}; "
    if poll.healthy:
        echo(head + f"diagnosis healthy ({poll.shape})")
    else:
        what = poll.error or ", ".join(f"{s} ({lay}) {c:.2f}" for s, lay, c in poll.findings)
        echo(head + f"[fail] diagnosis not healthy: {what}")


def _hit_ratios(stack: ValidateTarget, over: float) -> dict[str, float]:
    w = f"{max(1, int(over))}s"
    expr = (
        f'sum by (cache) (rate(cache_requests_total{{result="hit"}}[{w}])) '
        f"/ sum by (cache) (rate(cache_requests_total[{w}]))"
    )
    out = {}
    for s in stack.query(expr):
        v = float(s.value)
        if math.isfinite(v):
            out[str(dict(s.labels).get("cache", "all"))] = v
    return out


def _firings(stack: ValidateTarget, t0: float, reload: dict[str, Any]) -> list[AlertFiring]:
    """Every alert that fired since the soak started, with its severity and resolve time."""
    events = stack.engine.history(start=t0)
    resolved: dict[tuple[str, str], list[float]] = {}
    out = []
    reload_at = reload.get("at_s")
    for e in events:
        if e.state == "resolved" and e.resolved_at is not None:
            resolved.setdefault(_key(e), []).append(e.resolved_at)
    for e in events:
        if e.state != "firing" or e.fired_at is None:
            continue
        at = e.fired_at - t0
        expected = (
            e.alertname in PLANNED_RELOAD_ALERTS and reload_at is not None and at >= reload_at
        )
        end = min((r for r in resolved.get(_key(e), []) if r >= e.fired_at), default=None)
        out.append(
            AlertFiring(
                e.alertname,
                str(e.labels.get("severity", "?")),
                at,
                float(e.value),
                str(e.annotations.get("summary", "")),
                expected,
                None if end is None else end - e.fired_at,
            )
        )
    return out


def _key(e: Any) -> tuple[str, str]:
    return (e.alertname, json.dumps(dict(e.labels), sort_keys=True))
