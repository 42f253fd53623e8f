"""The validation loop: baseline, fault, checks, revert, resolve; one scenario at a time."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import promql_parser

from ..errors import AivitalsError
from ._config import ValidateConfig
from ._load import LoadPhase, LoadPlan
from ._lock import RunLock
from ._report import Check, Report, ScenarioResult, fmt_change, fmt_ms
from ._scenarios import SCENARIOS, Scenario, hostable, scenario

__all__ = ["LOG_FIELDS", "run_validate"]

#: the structured fields every error log line must carry (DOMAIN section 6)
LOG_FIELDS = ("request_id", "model_version", "input_token_count", "gpu_device_id", "error_code")

Echo = Callable[[str], None]


def run_validate(config: ValidateConfig, *, echo: Echo = print) -> Report:
    """Run every selected scenario on a fresh stack; the report says what passed.

    Refuses with ``AlreadyRunning`` while another validate runs on this machine.

    **Usage**::

        report = run_validate(ValidateConfig(quick=True))
        report.write(Path("validate.json")); sys.exit(0 if report.passed else 1)
    """
    from ..demo import Stack, StackConfig

    chosen = (
        [scenario(n) for n in config.scenarios] if config.scenarios else list(SCENARIOS.values())
    )
    with RunLock(config.lock_path):
        report = Report(quick=config.quick)
        stack = Stack(
            StackConfig(
                quick=config.quick,
                workdir=config.workdir,
                gpu=config.gpu,
                rule_params={**_demo_rule_params(), **config.rule_params},
            )
        )
        try:
            echo(
                "starting Redis, the demo service and the agent "
                f"({'quick' if config.quick else 'full'} run)"
            )
            stack.start()
            report.environment = _environment(stack)
            _warm_up(stack, config, echo)
            _run_all(stack, chosen, config, report, echo)
        finally:
            report.ended_at = time.time()
            try:
                stack.stop()
            except AivitalsError as exc:
                echo(f"[fail] cleanup: {exc}")
        return report


#: Load on a fresh stack before the first scenario (quick runs): the request and
#: cache rates ramp up from zero for several seconds, and a 4 s baseline taken on
#: that ramp made the first scenario's fault look like a traffic surge.
QUICK_WARM_UP_S = 15.0


def _warm_up(stack: Any, config: ValidateConfig, echo: Echo) -> None:
    if not config.quick:
        return  # a full run's 60 s baseline already covers the ramp
    stack.service.wait_ready(60.0)
    echo(f"warming up for {QUICK_WARM_UP_S:g} s (steady load before the first baseline)")
    _steady_load(stack.service.url, LoadPlan(), QUICK_WARM_UP_S)


def _steady_load(url: str, plan: LoadPlan, seconds: float) -> LoadPhase:
    """The normal load on ``url`` for ``seconds`` (a warm-up or a baseline), stopped."""
    phase = LoadPhase(url, plan).start(max_seconds=seconds + 60)
    try:
        time.sleep(seconds)
    finally:
        phase.stop()
    return phase


def _demo_rule_params() -> dict[str, Any]:
    # The demo's model answers in ~0.1 s on CPU: its SLA is set to match (DOMAIN:
    # "inference_time_p99 <= model SLA", alert at 2x), not the pack's 1 s default.
    return {"sla_seconds": 0.25}


def _environment(stack: Any) -> dict[str, Any]:
    return {
        "service": stack.service.url,
        "agent": stack.agent.url,
        "redis": None if stack.redis is None else stack.redis.url,
        "sim_gpu_dir": str(stack.sim_gpu_dir),
        "tick_s": stack.config.tick,
        "gpu": stack.config.gpu_backend,
    }


def _run_all(
    stack: Any, chosen: list[Scenario], config: ValidateConfig, report: Report, echo: Echo
) -> None:
    from ..chaos import FAULT_TABLE, ChaosRunner

    with ChaosRunner(stack.fault_context(), max_duration=3600.0) as runner:
        if runner.run is not None:
            report.environment["chaos_run"] = runner.run.run_id
        if stack.ledger is not None:
            report.environment["stack_ledger"] = stack.ledger.run_id
        for s in chosen:
            info = FAULT_TABLE.get(s.fault)
            result = ScenarioResult(
                s.fault,
                info.layer if info else "?",
                info.signature if info else s.fault,
                time.time(),
            )
            report.scenarios.append(result)
            why = hostable(s)
            if why is not None:
                result.skipped = why
                echo(f"\n== {s.fault}: skipped ({why})")
                continue
            echo(f"\n== {s.fault} ({result.layer} layer): {info.description if info else ''}")
            try:
                _scenario(
                    stack, runner, s, tuple(info.alerts) if info else (), config, result, echo
                )
            except Exception as exc:  # one broken scenario is reported; the others still run
                result.error = f"{type(exc).__name__}: {exc}"
                echo(f"[fail] {result.error}")
            finally:
                stack.probe_via(None)
                errors = runner.stop_all()  # idempotent: what _scenario stopped stays stopped
                if errors:
                    echo(result.add(_revert_check(errors, [])).line())
                result.ended_at = time.time()
            if not stack.service.alive():
                _restart(stack, result, echo)


def _restart(stack: Any, result: ScenarioResult, echo: Echo) -> None:
    code = stack.service.exit_code()
    result.add(
        Check(
            "service_alive",
            False,
            f"the demo service died (exit {code}) during the scenario; restarting it",
        )
    )
    echo(result.checks[-1].line())
    stack.start_service()


def _scenario(
    stack: Any,
    runner: Any,
    s: Scenario,
    alerts: tuple[str, ...],
    config: ValidateConfig,
    result: ScenarioResult,
    echo: Echo,
) -> None:
    plan = LoadPlan()
    stack.service.wait_ready(60.0)
    t_base = time.time()
    base = _steady_load(stack.service.url, plan, _baseline(config, s))

    log_offset = _size(stack.service.log_path)
    params = {**(s.quick_params if config.quick else s.params), **config.params.get(s.fault, {})}
    fault_max = _fault_max(config, s)
    span = fault_max + config.phase("recover_max") + 60
    t_fault = time.time()
    # a fresh context: an earlier scenario may have replaced the stack's Redis
    active = runner.start(s.fault, duration=span, context=stack.fault_context(), **params)
    stack.probe_via(active.client_url)  # the agent's probe takes the clients' path
    phase = LoadPhase(
        active.client_url or stack.service.url,
        plan,
        allow_hosts=tuple(active.allow_hosts),
        impatient=s.impatient_client,
    ).start(max_seconds=fault_max + 60)
    try:
        fired, diagnosis, matched_at = _watch(
            stack, alerts, t_base, t_fault, fault_max, config, result
        )
    finally:
        phase.stop()
    t_end = time.time()

    for check in (
        _impact(base, phase),
        *_alert_checks(stack, alerts, fired, t_fault, t_end, fault_max),
        _also_fired(stack, alerts, t_fault),
        _diagnosis_check(diagnosis, result, t_fault, matched_at),
        _log_check(stack.service.log_path, log_offset, s),
    ):
        if check is not None:
            echo(result.add(check).line())
    if not stack.service.alive():
        return

    stack.probe_via(None)
    errors = runner.stop(active)
    if errors or active.fault.replacements:
        echo(result.add(_revert_check(errors, active.fault.replacements)).line())
    _recover(stack, alerts, config, result, echo, fired)


def _revert_check(errors: list[str], replacements: list[Any]) -> Check:
    """The revert failed somewhere, or restarted a process and handed it back."""
    handed = [r.describe() for r in replacements]
    data = {"errors": errors, "replacements": [[r.role, r.pid, r.port] for r in replacements]}
    if errors:
        return Check("revert", False, "revert failed: " + "; ".join(errors + handed), data)
    return Check("revert", None, "; ".join(handed), data)


def _baseline(config: ValidateConfig, s: Scenario) -> float:
    if config.quick and config.baseline is None and s.quick_baseline is not None:
        return s.quick_baseline
    return config.phase("baseline")


def _fault_max(config: ValidateConfig, s: Scenario) -> float:
    if config.quick and config.fault_max is None and s.quick_fault_max is not None:
        return s.quick_fault_max
    return config.phase("fault_max")


def _watch(
    stack: Any,
    alerts: tuple[str, ...],
    t_base: float,
    t_fault: float,
    fault_max: float,
    config: ValidateConfig,
    result: ScenarioResult,
) -> tuple[dict[str, float], Any, float | None]:
    """Poll alerts each second and the diagnosis every 3 s until all is caught or time is up.

    Returns the alerts that fired (seconds after the fault), the diagnosis to
    judge (the first that named the fault, else the last) and when it was made.
    """
    fired: dict[str, float] = {}
    diagnosis: Any = None
    matched_at: float | None = None
    next_diag = t_fault + config.phase("fault_min")
    deadline = t_fault + fault_max
    while time.time() < deadline:
        time.sleep(1.0)
        if not stack.service.alive():
            break
        for ev in stack.engine.history(start=t_fault):
            if ev.state == "firing" and ev.alertname in alerts and ev.fired_at:
                fired.setdefault(ev.alertname, ev.fired_at - t_fault)
        now = time.time()
        if now >= next_diag and matched_at is None:
            diagnosis = _safe_diagnose(stack, t_base, now)
            next_diag = now + 3.0
            if _matches(diagnosis, result):
                matched_at = now - t_fault
        if set(fired) >= set(alerts) and matched_at is not None:
            break
    if diagnosis is None:
        diagnosis = _safe_diagnose(stack, t_base, time.time())
    return fired, diagnosis, matched_at


def _safe_diagnose(stack: Any, t_base: float, now: float) -> Any:
    # this scenario's baseline and fault; at least 30 s for the detector (a 4 s baseline
    # then reaches back into the previous scenario's settle). No further back: the revert
    # of the previous fault (a lossy link's probe) read as a baseline left a deviation unseen
    try:
        return stack.diagnose(window=max(30.0, now - t_base), end=now)
    except Exception as exc:  # the report says the diagnosis failed; the run goes on
        return exc


def _matches(diagnosis: Any, result: ScenarioResult) -> bool:
    top = getattr(diagnosis, "top", None)
    return (
        top is not None
        and str(top.signature) == result.signature
        and str(top.layer).lower() == result.layer
    )


def _impact(base: LoadPhase, fault: LoadPhase) -> Check:
    b = base.reports.get("completions")
    f = fault.reports.get("completions")
    if b is None or f is None:
        errors = "; ".join(base.errors + fault.errors) or "no report"
        return Check("impact", None, f"client-side load report missing ({errors})")
    p99b, p99f = b.e2e.p99_ms / 1000, f.e2e.p99_ms / 1000
    errb, errf = _error_rate(base), _error_rate(fault)
    moved = (p99b == p99b and p99f == p99f and p99f > 1.2 * p99b) or errf > errb + 0.01
    text = (
        f"P99 {fmt_ms(p99b)} -> {fmt_ms(p99f)}{fmt_change(p99b, p99f)}, "
        f"errors {errb:.1%} -> {errf:.1%} (client side, {f.sent} requests)"
    )
    data = {
        "p99_before_s": p99b,
        "p99_during_s": p99f,
        "errors_before": errb,
        "errors_during": errf,
    }
    return Check("impact", True if moved else None, text, data)


def _error_rate(phase: LoadPhase) -> float:
    sent = sum(r.sent for r in phase.reports.values())
    failed = sum(r.failed for r in phase.reports.values())
    return failed / sent if sent else 0.0


def _alert_checks(
    stack: Any,
    alerts: tuple[str, ...],
    fired: dict[str, float],
    t_fault: float,
    t_end: float,
    limit: float,
) -> list[Check]:
    out = []
    for name in alerts:
        if name in fired:
            out.append(
                Check(
                    f"alert:{name}",
                    True,
                    f"{name} fired {fired[name]:.1f} s after the fault (deadline {limit:g} s)",
                    {"after_s": fired[name]},
                )
            )
        else:
            out.append(_never_fired(stack, name, t_fault, t_end, limit))
    return out


def _never_fired(stack: Any, name: str, t_fault: float, t_end: float, limit: float) -> Check:
    rule = next((r for g in stack.engine.groups for r in g.alerting_rules if r.alert == name), None)
    if rule is None:
        return Check(f"alert:{name}", False, f"{name} is not in the rule pack")
    pending = any(e.alertname == name for e in stack.engine.history(start=t_fault))
    peak, threshold, op = _peak(stack, rule.expr, t_fault, t_end)
    if pending:
        why = f"its condition held but not for its full for: {rule.for_:g} s"
    elif peak is None:
        why = "its expression had no data (is the signal collected?)"
    elif threshold is not None:
        why = f"never crossed the threshold (peak {peak:.4g} {_neg(op)} {threshold:.4g}): lower it"
    else:
        why = f"its condition never held (left side peaked at {peak:.4g})"
    return Check(
        f"alert:{name}",
        False,
        f"{name} did not fire within {limit:g} s: {why}",
        {"peak": peak, "threshold": threshold},
    )


def _neg(op: str) -> str:
    return {">": "<=", ">=": "<", "<": ">=", "<=": ">"}.get(op, "vs")


def _peak(
    stack: Any, expr: str, start: float, end: float
) -> tuple[float | None, float | None, str]:
    """The peak of the left side of the rule's top comparison over the fault, and its bound."""
    try:
        node: Any = promql_parser.parse(expr)
        op = str(getattr(node, "op", ""))
        lhs = str(node.lhs) if op in (">", ">=", "<", "<=") else expr
        rhs = node.rhs if op in (">", ">=", "<", "<=") else None
        threshold = float(str(rhs)) if rhs is not None and _is_number(str(rhs)) else None
        res = stack.agent.store.query_range(lhs, start, end, stack.config.tick)
    except Exception:
        return None, None, ""
    values = [v for series in res.matrix for _, v in series.points if v == v]
    if not values:
        return None, threshold, op
    return (min(values) if op.startswith("<") else max(values)), threshold, op


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _also_fired(stack: Any, alerts: tuple[str, ...], t_fault: float) -> Check | None:
    other = sorted(
        {e.alertname for e in stack.engine.history(start=t_fault) if e.state == "firing"}
        - set(alerts)
    )
    if not other:
        return None
    return Check("other_alerts", None, f"also fired: {', '.join(other)}", {"alerts": other})


def _diagnosis_check(
    diagnosis: Any, result: ScenarioResult, t_fault: float, matched_at: float | None
) -> Check:
    expected = f"{result.signature} ({result.layer} layer)"
    if isinstance(diagnosis, Exception):
        return Check(
            "diagnosis", False, f"the diagnosis failed: {type(diagnosis).__name__}: {diagnosis}"
        )
    top = getattr(diagnosis, "top", None)
    if top is None:
        return Check("diagnosis", False, f"the diagnosis found nothing; expected {expected}")
    ranked = [f"{f.signature} {f.confidence:.2f}" for f in list(diagnosis.findings)[:3]]
    data = {
        "top": top.signature,
        "layer": str(top.layer),
        "confidence": top.confidence,
        "ranked": ranked,
    }
    first = ""
    if top.first_deviation is not None:
        first = f", first deviation {top.first_deviation - t_fault:+.0f} s from the fault"
    if _matches(diagnosis, result):
        when = "" if matched_at is None else f", {matched_at:.0f} s after the fault"
        data["after_s"] = matched_at
        text = (
            f"diagnosis: {top.signature} ({top.layer} layer){when}, "
            f"confidence {top.confidence:.2f}{first}"
        )
        return Check("diagnosis", True, text, data)
    text = (
        f"diagnosis named {top.signature} ({top.layer} layer), expected {expected}; "
        f"ranked: {', '.join(ranked)}"
    )
    return Check("diagnosis", False, text, data)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _log_check(path: Path, offset: int, s: Scenario) -> Check:
    lines = _error_lines(path, offset)
    codes: dict[str, int] = {}
    incomplete = 0
    background = 0
    for record in lines:
        if not record.get("request_id") and "check" in record:
            background += 1  # a health check's own failure: no request to name
            continue
        codes[str(record["error_code"])] = codes.get(str(record["error_code"]), 0) + 1
        if any(f not in record for f in LOG_FIELDS) or not record.get("request_id"):
            incomplete += 1
    lines = [r for r in lines if r.get("request_id") or "check" not in r]
    seen = ", ".join(f"{c} x{n}" for c, n in sorted(codes.items()))
    data = {
        "error_lines": len(lines),
        "codes": codes,
        "incomplete": incomplete,
        "health_check_lines": background,
    }
    if s.error_codes and not set(s.error_codes) & set(codes):
        want = " or ".join(s.error_codes)
        return Check(
            "logs", False, f"no error log line carried {want} (saw: {seen or 'none'})", data
        )
    if not lines:
        return Check("logs", None, "no error log lines during the fault", data)
    if incomplete:
        return Check(
            "logs",
            False,
            f"{incomplete} of {len(lines)} error log lines lack request_id or a structured field",
            data,
        )
    return Check(
        "logs", True, f"{len(lines)} error log lines carry {', '.join(LOG_FIELDS)} ({seen})", data
    )


def _error_lines(path: Path, offset: int) -> list[dict[str, Any]]:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            raw = f.read()
    except OSError:
        return []
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("error_code"):
            out.append(record)
    return out


def _recover(
    stack: Any,
    alerts: tuple[str, ...],
    config: ValidateConfig,
    result: ScenarioResult,
    echo: Echo,
    fired: dict[str, float],
) -> None:
    t_rev = time.time()
    watch = set(fired)
    # at least one rate window of calm, so the next scenario's baseline starts clean
    settle = 8.0 * stack.config.tick
    resolved_at: float | None = None
    phase = LoadPhase(stack.service.url, LoadPlan()).start(
        max_seconds=config.phase("recover_max") + 60
    )
    still: set[str] = set()
    try:
        while time.time() - t_rev < config.phase("recover_max"):
            time.sleep(1.0)
            still = {a.alertname for a in stack.engine.active()} & watch
            if still:
                resolved_at = None
            elif resolved_at is None:
                resolved_at = time.time()
            if not still and time.time() - t_rev >= settle:
                break
    finally:
        phase.stop()
    took = (resolved_at or time.time()) - t_rev
    if not watch:
        check = Check("resolved", None, "no expected alert fired, so none to resolve")
    elif still:
        check = Check(
            "resolved",
            False,
            f"{', '.join(sorted(still))} still active {took:.0f} s after the revert",
            {"still": sorted(still)},
        )
    else:
        check = Check(
            "resolved", True, f"alerts resolved {took:.1f} s after the revert", {"after_s": took}
        )
    echo(result.add(check).line())
