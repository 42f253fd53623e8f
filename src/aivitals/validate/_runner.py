"""The validation loop: baseline, fault, checks, revert, resolve; one scenario at a time."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import promql_parser

from ..errors import AivitalsError, ConfigError, ServiceError
from ._cases import PAIRS, Case, case
from ._config import ValidateConfig
from ._load import LoadPhase, LoadPlan, template_requests
from ._lock import RunLock
from ._report import Check, Report, ScenarioResult, fmt_change, fmt_ms
from ._scenarios import SCENARIOS, Scenario, hostable
from ._target import ValidateTarget

if TYPE_CHECKING:
    from ..alerts import AlertEvent
    from ..load import RequestTemplate
    from ._external import ExternalTarget

__all__ = [
    "LOG_FIELDS",
    "Poll",
    "PollVerdict",
    "cases_of",
    "judge_polls",
    "poll_times",
    "run_validate",
]

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
    chosen = cases_of(config)
    external = _external_target(config)
    if external is not None:
        # every refusal of the user's target (no answer, an error answer, no process on
        # its port) comes here: before the lock, the agent and any fault
        echo(f"checking the target {external.options.base} ...")
        external.check()
    with RunLock(config.lock_path):
        report = Report(quick=config.quick, planned=len(chosen))
        stack = external if external is not None else new_stack(config, FAULT_CASE_CACHE_TTL_S)
        relay = Relay()
        try:
            mode = "quick" if config.quick else "full"
            if external is None:
                echo(f"starting Redis, the demo service and the agent ({mode} run)")
            else:
                echo(f"starting the agent on the running service ({mode} run)")
            stack.start()
            calibration = start_calibrated_agent(
                stack,
                dict(config.rule_params),
                FAULT_CASE_TOKENS,
                echo,
                template=None if config.target is None else config.target.request,
            )
            report.environment = _environment(stack, calibration, FAULT_CASE_CACHE_TTL_S)
            if external is not None:
                report.environment.update(_external_environment(external, config))
            if any(_sized_at_run_time(c) for c in chosen):
                capacity = calibrate_capacity(stack, calibration)
                report.environment["capacity"] = capacity
                echo(
                    f"pool capacity: {capacity['embeddings_rps']:g} fresh embeddings/s with "
                    f"{capacity['workers']} in flight; the graded surges are sized to it"
                )
            _warm_up(stack, config, echo, relay)
            _run_all(stack, chosen, config, report, echo, relay=relay)
        except KeyboardInterrupt:
            # the finally blocks below it have reverted the fault and stopped its load;
            # the stack stops next, and the cases run so far are reported
            report.interrupted = True
            echo("interrupted: every fault reverted; stopping the stack")
        finally:
            relay.stop()
            report.ended_at = time.time()
            try:
                stack.stop()
            except AivitalsError as exc:
                echo(f"[fail] cleanup: {exc}")
        return report


def _external_target(config: ValidateConfig) -> ExternalTarget | None:
    """The user's running service, when the run names one (``--target``)."""
    if config.target is None:
        return None
    from ._external import ExternalTarget

    return ExternalTarget(config.target, quick=config.quick, workdir=config.workdir)


def _external_environment(target: ExternalTarget, config: ValidateConfig) -> dict[str, Any]:
    """The target as the report states it, and for every fault whether it applies to
    it (``"applies"``) or why it is not tested."""
    from ._external import why_not

    assert config.target is not None
    gpu = target.config.gpu_backend != "none"
    return {
        "target": target.describe(),
        "cache_ttl_s": None,  # the service's cache, if any, is the user's
        "applicability": {
            name: why_not(name, config.target, gpu=gpu) or "applies" for name in SCENARIOS
        },
    }


def why_not_here(config: ValidateConfig, s: Scenario) -> str | None:
    """Why the run cannot test ``s``: what this machine cannot host for the demo, what
    the user's service does not offer for ``--target`` (``_external.why_not``)."""
    if config.target is None:
        return hostable(s)
    from ._external import why_not

    return why_not(s.fault, config.target)


def _overrides(config: ValidateConfig) -> dict[str, dict[str, Any]]:
    """The ``-p`` overrides, on the parameters a fault must take against a service the
    run did not start (``_external.external_params``) when it runs with ``--target``."""
    if config.target is None:
        return config.params
    from ._external import external_params

    out = {f: external_params(f) for f in SCENARIOS if external_params(f)}
    for fault, values in config.params.items():
        out[fault] = {**out.get(fault, {}), **values}
    return out


def _load(config: ValidateConfig, url: str, **kw: Any) -> LoadPhase:
    """The drill's load on ``url``: the demo's two routes, or the user's request template."""
    template = None if config.target is None else config.target.request
    return LoadPhase(url, LoadPlan(), template=template, **kw)


def warm_up_seconds(config: ValidateConfig) -> float:
    """How long a run loads its fresh stack before the first baseline (its time scale's
    ``warm_up``: the rates ramp up from zero, and the signatures' usual levels look back
    minutes)."""
    return config.scale.warm_up


def cases_of(config: ValidateConfig) -> list[Case]:
    """The cases a run makes, in order: the named ones, else every fault then the pairs;
    a sweep runs each single fault at each of its severities (``_severity.severities``:
    a fault with one magnitude once) and a named pair at its own values."""
    if config.scenarios:
        base = [case(n) for n in config.scenarios]
    else:
        base = [Case((s,)) for s in SCENARIOS.values()]
        if not config.sweep:
            base += [Case(tuple(SCENARIOS[f] for f in pair)) for pair in PAIRS]
    if not config.sweep:
        return base
    from ._severity import severities

    return [
        Case(c.scenarios, sev) if not c.is_pair else c
        for c in base
        for sev in (severities(c.faults[0]) if not c.is_pair else (None,))
    ]


class Relay:
    """The clients' load never pauses: each phase's load starts before the previous
    phase's stops (a warm-up, a baseline, a fault, a recovery, the next baseline).

    Stopping one phase and starting the next left a gap of a second or more with no
    requests; the 8 s rate windows of quick runs then read the baseline's request rate
    low, the fault's as "traffic rose by half", and that contradicted true findings
    (cpu_burn's, worker_pool_saturated's) on some polls and not others.
    """

    def __init__(self) -> None:
        self.current: LoadPhase | None = None

    def hand_to(self, phase: LoadPhase, *, max_seconds: float) -> LoadPhase:
        """Start ``phase``, then stop the one running (its reports are then complete)."""
        phase.start(max_seconds=max_seconds)
        old, self.current = self.current, phase
        if old is not None:
            old.stop()
        return phase

    def stop(self) -> None:
        old, self.current = self.current, None
        if old is not None:
            old.stop()


def _warm_up(stack: ValidateTarget, config: ValidateConfig, echo: Echo, relay: Relay) -> None:
    seconds = warm_up_seconds(config)
    stack.service.wait_ready(60.0)
    echo(f"warming up for {seconds:g} s (steady load before the first baseline)")
    relay.hand_to(_load(config, stack.service.url), max_seconds=_CARRY_S)
    time.sleep(seconds)


#: How long a phase's load may run at most: it is normally stopped when the next starts;
#: this bounds it if the run dies between the two.
_CARRY_S = 3600.0


#: The demo SLA for validate's fault cases, whose completions are ``LoadPlan.max_tokens``
#: (12) tokens long, as a multiple of the demo model's median time on them, measured on
#: this machine when the run starts (``calibrate_sla``). DOMAIN: "inference_time_p99 <=
#: model SLA", alert at 2x. 2.5 is the ratio validate was designed with: an SLA of 0.25 s
#: for a model that answered in ~0.1 s. A fixed 0.25 s assumes that machine: on one 1.8x
#: slower (a capacity probe of 11 completions/s, not 20) the healthy model's median is
#: 0.17-0.19 s, its P99 over a rate window of quick mode's ~20 inferences 0.45-0.50 s, at
#: the 0.5 s bound, and one slow inference pages InferenceLatencyHigh in any case.
SLA_PER_MEDIAN = 2.5
#: The model's median assumed when nothing was measured (the sweep's planning, the unit
#: tests): the ~0.1 s the 2.5 ratio was set on, so its SLA is the former 0.25 s.
NOMINAL_MEDIAN_S = 0.1
FAULT_CASE_SLA_S = SLA_PER_MEDIAN * NOMINAL_MEDIAN_S
FAULT_CASE_TOKENS = LoadPlan().max_tokens
#: The demo cache's TTL in the fault cases: longer than any run, so no key expires on
#: its own while they run. The load's 16 embeddings inputs fill the cache together (at
#: the start, after cache_stampede's flushes, after redis_down) and so expire together
#: 300 +- 30 s later, the demo's TTL: 1-6 misses in an 8 s window of ~15 lookups, which
#: quick mode's 8 s windows and 1 s ``for:`` read as a stampede: CacheHitRatioDrop is
#: active while they trickle in, in 11 fault recordings of the corpus whose fault is not
#: the cache's (gpu_oom@moderate: hits 16 -> 7, misses 0 -> 5 a window). A cache's own churn is the
#: soak's subject, with its own TTL; here the faults are (cache_stampede flushes itself).
FAULT_CASE_CACHE_TTL_S = 86400.0
#: How long the calibration's closed loop runs, and the least it must complete.
CALIBRATION_S = 6.0
CALIBRATION_MIN_COMPLETED = 10
#: Distinct prompts of the calibration on a user's template: more than it sends, so no
#: response cache of the service answers one of them.
CALIBRATION_POOL = 512


def _demo_rule_params(
    max_tokens: int = FAULT_CASE_TOKENS, median_s: float = NOMINAL_MEDIAN_S
) -> dict[str, Any]:
    """The rule parameters validate runs the demo with, for generations of up to
    ``max_tokens``, on a model whose 12-token completions take ``median_s`` (median).

    The SLA is ``SLA_PER_MEDIAN`` times that median, and the inference time grows with
    the tokens generated, so a workload of longer ones (the soak replays the trace's, up
    to 48) gets the same budget per token, for its longest generation: an SLA the
    healthy service can hold for every request it is sent. At the nominal 0.1 s: 12
    tokens 0.25 s, 48 tokens 1.0 s (the pack's default)."""
    if max_tokens < 1:
        raise ConfigError(f"max_tokens {max_tokens!r}: expected at least 1")
    if not median_s > 0:
        raise ConfigError(f"median_s {median_s!r}: expected a time above 0 s")
    sla = SLA_PER_MEDIAN * median_s * max_tokens / FAULT_CASE_TOKENS
    return {"sla_seconds": round(sla, 3)}


def _closed_loop(
    stack: ValidateTarget, path: str, seconds: float, what: str, **request: Any
) -> Any:
    """Fresh requests to ``path`` (every input new: no cache hit) in a closed loop at one
    per worker for ``seconds``; the load report. ``ServiceError`` ("<what>: N of M ...")
    when fewer than ``CALIBRATION_MIN_COMPLETED`` were answered."""
    from ..errors import ServiceError
    from ..load import LoadConfig, run_load

    report = run_load(
        LoadConfig(
            url=stack.service.url.rstrip("/") + path,
            concurrency=int(stack.config.workers),
            duration=seconds,
            input_pool=0,
            timeout=10.0,
            **request,
        )
    )
    if report.completed < CALIBRATION_MIN_COMPLETED:
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(report.errors.items())) or "none"
        raise ServiceError(
            f"{what}: {report.completed} of {report.sent} requests answered in "
            f"{seconds:g} s (errors: {errors}); the service cannot serve"
        )
    return report


def calibrate_sla(
    stack: ValidateTarget,
    *,
    seconds: float = CALIBRATION_S,
    template: RequestTemplate | None = None,
) -> dict[str, Any]:
    """Measure the demo model's speed on this machine: the fault cases' completions
    (``LoadPlan``'s tokens, every prompt new so none is a cache hit) in a closed loop
    at one per worker for ``seconds``. Returns ``median_s`` (the clients' median time),
    ``completed`` and ``seconds``; ``_demo_rule_params(median_s=...)`` turns it into the
    SLA. A service that completes fewer than ``CALIBRATION_MIN_COMPLETED`` cannot be
    measured: ``ServiceError`` says what the client saw. ``template``: the user's service
    (``--target``), measured on its own request, each prompt new."""
    plan = LoadPlan()
    if template is not None:
        report = _closed_loop(
            stack,
            template.path,
            seconds,
            f"measuring the target's speed on {template.describe()}",
            requests=template_requests(template, CALIBRATION_POOL),
        )
    else:
        report = _closed_loop(
            stack,
            "/v1/completions",
            seconds,
            "measuring the demo model's speed",
            max_tokens=plan.max_tokens,
            prompt_tokens=plan.prompt_tokens,
        )
    return {
        "median_s": round(report.e2e.median_ms / 1000.0, 4),
        "completed": report.completed,
        "seconds": seconds,
        "concurrency": stack.config.workers,
        "sla_per_median": SLA_PER_MEDIAN,
    }


#: How long ``calibrate_capacity``'s closed loop runs.
CAPACITY_S = 5.0


def _sized_at_run_time(c: Case) -> bool:
    """A case whose fault is sized against the capacity a run measures: a graded fault
    whose spec computes a severity's parameters itself (``Grading.at``: a surge)."""
    from ..chaos import FAULT_SPECS

    return c.severity in ("threshold", "moderate") and any(
        FAULT_SPECS[f].grading.at is not None for f in c.faults
    )


def calibrate_capacity(
    stack: ValidateTarget, calibration: Mapping[str, Any] | None, *, seconds: float = CAPACITY_S
) -> dict[str, Any]:
    """Measure the worker pool's capacity for the surge's work on this machine: fresh
    embeddings inputs (none a cache hit) in a closed loop at one per worker for
    ``seconds``. Returns ``workers``, ``embeddings_rps`` (inputs answered a second) and
    ``completion_s`` (a worker's time per validate completion: the SLA calibration's
    median, else the nominal figure), the figures the traffic surge's spec sizes a
    surge with. ``ServiceError`` when the service answers too few to measure."""
    from ._severity import DEMO_INFERENCE_S

    workers = int(stack.config.workers)
    report = _closed_loop(
        stack,
        "/v1/embeddings",
        seconds,
        "measuring the pool's capacity",
        prompt_tokens=LoadPlan().prompt_tokens,
    )
    median = (calibration or {}).get("median_s")
    return {
        "workers": workers,
        "embeddings_rps": round(report.completed / seconds, 2),
        "completion_s": float(median) if median else DEMO_INFERENCE_S,
        "completed": report.completed,
        "seconds": seconds,
    }


def start_calibrated_agent(
    stack: ValidateTarget,
    user_params: dict[str, Any],
    max_tokens: int,
    echo: Echo,
    *,
    template: RequestTemplate | None = None,
) -> dict[str, Any] | None:
    """Start ``stack``'s agent (the stack started with ``agent=False``) with the demo's
    rule parameters for generations of up to ``max_tokens``: the SLA from the model's
    measured speed (``calibrate_sla``), unless ``user_params`` set ``sla_seconds``;
    ``user_params`` win. Returns the calibration (None when the user's SLA was used).

    ``template``: the user's service (``--target``), whose SLA is ``SLA_PER_MEDIAN``
    times the median time of its own request, as the baseline measures it."""
    calibration, params = None, {}
    if "sla_seconds" not in user_params and template is not None:
        echo(f"measuring the target's speed on {template.describe()} ({CALIBRATION_S:g} s) ...")
        calibration = calibrate_sla(stack, template=template)
        params = {"sla_seconds": round(max(SLA_PER_MEDIAN * calibration["median_s"], 0.001), 3)}
        calibration.update(sla_seconds=params["sla_seconds"], request=template.describe())
        echo(
            f"target speed: {template.describe()} takes {calibration['median_s']:.3f} s "
            f"(median of {calibration['completed']}, {calibration['concurrency']} in flight); "
            f"model SLA {SLA_PER_MEDIAN:g} x that = {params['sla_seconds']:g} s "
            f"(InferenceLatencyHigh above {2 * params['sla_seconds']:g} s)"
        )
    elif "sla_seconds" not in user_params:
        echo(f"measuring the demo model's speed ({CALIBRATION_S:g} s) ...")
        calibration = calibrate_sla(stack)
        params = _demo_rule_params(max_tokens, calibration["median_s"])
        calibration["sla_seconds"] = params["sla_seconds"]
        echo(
            f"model speed: {FAULT_CASE_TOKENS}-token completions take "
            f"{calibration['median_s']:.3f} s (median of {calibration['completed']}, "
            f"{calibration['concurrency']} in flight); model SLA {SLA_PER_MEDIAN:g} x "
            f"that x {max_tokens}/{FAULT_CASE_TOKENS} tokens = {params['sla_seconds']:g} s "
            f"(InferenceLatencyHigh above {2 * params['sla_seconds']:g} s)"
        )
    stack.start_agent({**params, **user_params})
    return calibration


def new_stack(config: ValidateConfig, cache_ttl: float) -> ValidateTarget:
    """The demo stack a run starts (not yet started): the config's mode, workdir and GPU,
    the demo cache's TTL, and no agent: it starts once the model's speed is measured
    (``start_calibrated_agent``), because its rules need the SLA."""
    from ..demo import Stack, StackConfig

    return Stack(
        StackConfig(
            quick=config.quick,
            workdir=config.workdir,
            gpu=config.gpu,
            agent=False,
            service_args=("--cache-ttl", f"{cache_ttl:g}"),
        )
    )


def _environment(
    stack: ValidateTarget, calibration: dict[str, Any] | None, cache_ttl: float
) -> dict[str, Any]:
    """Where the run's stack lives, the SLA its rules ran with (``calibration``: the
    measurement it came from, None when the caller set it) and its demo cache's TTL."""
    return {
        "service": stack.service.url,
        "agent": stack.agent.url,
        "redis": None if stack.redis is None else stack.redis.url,
        "sim_gpu_dir": None if stack.sim_gpu_dir is None else str(stack.sim_gpu_dir),
        "tick_s": stack.config.tick,
        "gpu": stack.config.gpu_backend,
        "sla_seconds": stack.pack.params.sla_seconds,
        "sla_calibration": calibration,
        "cache_ttl_s": cache_ttl,
    }


def _run_all(
    stack: ValidateTarget,
    chosen: list[Case],
    config: ValidateConfig,
    report: Report,
    echo: Echo,
    *,
    relay: Relay | None = None,
) -> None:
    relay = relay if relay is not None else Relay()
    from ..chaos import FAULT_TABLE, ChaosRunner

    # validate owns the signals (its CLI turns SIGTERM and SIGHUP into KeyboardInterrupt):
    # the runner's own handler raised SystemExit(143) on SIGTERM, which skipped the
    # partial report; leaving this ``with`` on the interrupt reverts the faults all the same
    with ChaosRunner(stack.fault_context(), max_duration=3600.0, handle_signals=False) as runner:
        if runner.run is not None:
            report.environment["chaos_run"] = runner.run.run_id
        if stack.ledger is not None:
            report.environment["stack_ledger"] = stack.ledger.run_id
        for i, c in enumerate(chosen):
            infos = [FAULT_TABLE[f] for f in c.faults]
            result = ScenarioResult(
                c.name,
                "+".join(dict.fromkeys(i.layer for i in infos)),
                None if c.is_pair else infos[0].signature,
                time.time(),
                faults=list(c.faults),
                severity=c.severity,
            )
            report.scenarios.append(result)
            why = next((w for s in c.scenarios if (w := why_not_here(config, s))), None)
            if why is not None:
                result.skipped = why
                echo(f"\n== {c.name}: skipped ({why})")
                continue
            what = " + ".join(i.description for i in infos)
            echo(f"\n== {c.name} ({result.layer} layer): {what}")
            try:
                capacity = report.environment.get("capacity")
                result.params = c.params(config.quick, _overrides(config), capacity)
                _scenario(stack, runner, c, infos, config, result, echo, relay, capacity)
            except Exception as exc:  # one broken scenario is reported; the others still run
                result.error = f"{type(exc).__name__}: {exc}"
                echo(f"[fail] {result.error}")
            except KeyboardInterrupt:
                result.error = "interrupted"  # cut short: its checks so far are kept
                raise
            finally:
                stack.probe_via(None)
                if relay.current is not None and relay.current.base_url != stack.service.url:
                    # a case that broke off mid-fault left its load on the fault's path
                    relay.hand_to(_load(config, stack.service.url), max_seconds=_CARRY_S)
                errors = runner.stop_all()  # idempotent: what _scenario stopped stays stopped
                if errors:
                    echo(result.add(_revert_check(errors, [])).line())
                result.ended_at = time.time()
            if config.record is not None:
                _record(stack, config, c, infos, result, echo)
            if not stack.service.alive():
                try:
                    _restart(stack, result, echo)
                except ServiceError as exc:
                    # a service the run did not start is not restarted: the cases left
                    # cannot run, and say why
                    echo(f"[fail] {exc}")
                    result.error = result.error or str(exc)
                    for rest in chosen[i + 1 :]:
                        report.scenarios.append(_not_run(rest, f"not run: {exc}"))
                    break


def _not_run(c: Case, why: str) -> ScenarioResult:
    from ..chaos import FAULT_TABLE

    infos = [FAULT_TABLE[f] for f in c.faults]
    result = ScenarioResult(
        c.name,
        "+".join(dict.fromkeys(i.layer for i in infos)),
        None if c.is_pair else infos[0].signature,
        time.time(),
        faults=list(c.faults),
        severity=c.severity,
    )
    result.skipped = why
    return result


def _record(
    stack: ValidateTarget,
    config: ValidateConfig,
    c: Case,
    infos: list[Any],
    result: ScenarioResult,
    echo: Echo,
) -> None:
    """Save the case's window (baseline to the end of the recovery) with its label."""
    if result.t_baseline is None or config.record is None:
        return
    from ._record import save_stack_window

    unknown = [i for i in infos if i.signature is None]
    label = {
        "name": c.name,
        "kind": "pair" if c.is_pair else ("unknown" if unknown else "fault"),
        "faults": list(c.faults),
        "expected": [i.signature for i in infos if i.signature is not None],
        "layer": None if c.is_pair else infos[0].layer,
        "suspects": sorted({m for i in infos for m in i.suspects}),
        "severity": c.severity,
        "params": result.params,
        "t_baseline": result.t_baseline,
        "t_fault": result.t_fault,
        "t_revert": result.t_revert,
        "quick": config.quick,
        "tick": stack.config.tick,
        "passed": result.passed,
    }
    least, rate = config.scale.diagnosis_window, config.scale.diagnosis_rate
    label["diagnosis"] = {"min_window_s": least, "rate_s": rate}
    polls = _poll_offsets(result)
    if polls and result.t_fault is not None:
        # the times validate asked, so a replay asks at the same ones (not the nominal
        # period: each live poll waits for the one before it)
        label["polls"] = [
            [result.t_fault + after, max(least, result.t_fault + after - result.t_baseline)]
            for after in polls
        ]
    start, end = result.t_baseline, result.ended_at or time.time()
    try:
        path = save_stack_window(stack, config.record, label, start=start, end=end)
    except Exception as exc:  # a failed recording is reported; the check results stand
        echo(result.add(Check("recorded", False, f"recording failed: {exc}")).line())
        return
    echo(result.add(Check("recorded", None, f"recorded to {path}", {"path": str(path)})).line())


def _poll_offsets(result: ScenarioResult) -> list[float]:
    """Seconds after the fault of each diagnosis poll the case made (its diagnosis check's)."""
    for check in result.checks:
        if check.name == "diagnosis" and isinstance(check.data, dict):
            polls = check.data.get("polls") or []
            return [float(p["after_s"]) for p in polls if isinstance(p, dict) and "after_s" in p]
    return []


def _restart(stack: ValidateTarget, result: ScenarioResult, echo: Echo) -> None:
    code = stack.service.exit_code()
    result.add(
        Check(
            "service_alive",
            False,
            f"the service died (exit {code}) during the scenario; restarting it",
        )
    )
    echo(result.checks[-1].line())
    stack.start_service()


def _scenario(
    stack: ValidateTarget,
    runner: Any,
    c: Case,
    infos: list[Any],
    config: ValidateConfig,
    result: ScenarioResult,
    echo: Echo,
    relay: Relay,
    capacity: Mapping[str, Any] | None = None,
) -> None:
    expect = _Expect.of(infos)
    stack.service.wait_ready(60.0)
    t_base = result.t_baseline = time.time()
    base = relay.hand_to(_load(config, stack.service.url), max_seconds=_CARRY_S)
    time.sleep(max(_baseline(config, s) for s in c.scenarios))

    log_path = stack.service.log_path
    log_offsets = {} if log_path is None else log_offsets_of(log_path)
    fault_max = _fault_phase(stack, config, c, expect)
    beyond = _beyond_reach(stack, c, result, fault_max)
    if beyond:
        # out of this magnitude's reach in this phase: said, not expected (still allowed)
        expect = replace(expect, alerts=tuple(a for a in expect.alerts if a not in beyond))
    # the fault outlives the longest phase: a late first match extends it by stable_for
    span = fault_max + config.scale.stable_for + _recover_phase(stack, config) + 60
    t_fault = result.t_fault = time.time()
    # a fresh context for each: an earlier scenario may have replaced the stack's Redis
    actives = [
        runner.start(f, duration=span, context=stack.fault_context(), **result.params[f])
        for f in c.faults
    ]
    # the clients' path: a fault that moves them (a lossy link, a delaying proxy) wins
    paths = [a.client_url for a in actives if a.client_url]
    client_url = next((u for u in paths if u != stack.service.url), None) or stack.service.url
    stack.probe_via(client_url)  # the agent's probe takes the clients' path
    phase = _load(
        config,
        client_url,
        allow_hosts=tuple(h for a in actives for h in a.allow_hosts),
        impatient=any(s.impatient_client for s in c.scenarios),
    )
    relay.hand_to(phase, max_seconds=_CARRY_S)  # the baseline's report is complete now
    watch = _watch(stack, expect, t_base, t_fault, fault_max, config)
    t_end = time.time()
    # the recovery's load, straight to the service, takes over; the fault's report completes
    relay.hand_to(_load(config, stack.service.url), max_seconds=_CARRY_S)

    alert_checks: list[Check | None] = [
        _impact(base, phase, expect),
        *_alert_checks(stack, expect.alerts, watch.fired, t_fault, t_end, fault_max),
        *(
            Check(f"beyond_reach:{name}", None, f"{name} not expected at {c.severity}: {why}")
            for name, why in beyond.items()
        ),
    ]
    checks: list[Check | None] = [
        _diagnosis_check(watch, expect),
        _log_check(
            log_path,
            log_offsets,
            tuple(code for s in c.scenarios for code in s.error_codes),
        ),
    ]
    if c.severity is not None:
        from ._severity import reached

        for f in c.faults:
            checks.append(
                reached(
                    stack,
                    f,
                    c.severity,
                    result.params[f],
                    quick=config.quick,
                    t_fault=t_fault,
                    t_end=t_end,
                    capacity=capacity,
                )
            )
    if stack.service.alive():
        checks.append(_hold_for_pending(stack, expect, config))
    # judged after the hold, reported with the other alert checks
    for check in [*alert_checks, _also_fired(stack, expect, t_fault), *checks]:
        if check is not None:
            echo(result.add(check).line())
    if not stack.service.alive():
        return

    stack.probe_via(None)
    result.t_revert = time.time()
    for active in actives:
        errors = runner.stop(active)
        if errors or active.fault.replacements:
            echo(result.add(_revert_check(errors, active.fault.replacements)).line())
    _recover(stack, expect, config, result, echo, watch.fired, t_fault)  # the load runs on


def _beyond_reach(
    stack: ValidateTarget, c: Case, result: ScenarioResult, fault_s: float
) -> dict[str, str]:
    """A sweep case's expected alerts its magnitude cannot make fire in ``fault_s``
    (``_severity.beyond_reach``): alert -> why."""
    if c.severity is None:
        return {}
    from ._severity import beyond_reach

    pack = stack.pack.params
    out: dict[str, str] = {}
    for f in c.faults:
        out.update(beyond_reach(f, c.severity, result.params[f], pack=pack, fault_s=fault_s))
    return out


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


#: a full run's fault phase beyond an expected alert's ``for:``: the time the default
#: phase gives a ``for: 0s`` alert to see its condition hold (its rate window partly filled)
FULL_FOR_MARGIN_S = 120.0


def _fault_phase(stack: ValidateTarget, config: ValidateConfig, c: Case, expect: _Expect) -> float:
    """The longest fault phase of a case: the scenarios' own; in a full run with the
    default phases, at least each expected alert's ``for:`` plus the longer of the pack's
    rate window and the longest range its expression reads (``_longest_range_s``), plus
    ``FULL_FOR_MARGIN_S``.

    A full run keeps the pack's real ``for:`` durations (5, 10, 15 minutes), which the
    default 120 s phase cannot hold: GPUProcessMemoryGrowth held its condition and was
    failed for never firing. Nor can ``for:`` alone: a condition on a share averaged over
    the rate window (DiskSaturated's busy share over 5m > 0.95) holds only once the fault
    fills most of that window, so a 240 s phase reads a saturated disk as 0.80 busy. The
    phase ends as soon as the alerts fired and the diagnosis held,
    so the longer bound costs only the cases that miss. ``--fault-max`` given: the
    user's phase, as asked.
    """
    longest = max(_fault_max(config, s) for s in c.scenarios)
    if config.scale.compressed or config.fault_max is not None:
        return longest
    records = {r.record: r.expr for g in stack.engine.groups for r in g.recording_rules}
    holds = [
        float(r.for_) + max(_rate_window_s(stack), _longest_range_s(r.expr, records))
        for g in stack.engine.groups
        for r in g.alerting_rules
        if r.alert in expect.alerts
    ]
    if not holds:
        return longest
    return max(longest, max(holds) + FULL_FOR_MARGIN_S)


def _longest_range_s(
    expr: str, records: dict[str, str], _seen: frozenset[str] = frozenset()
) -> float:
    """The longest range an expression reads up to now, seconds: its ``[range]`` selectors
    and subqueries, through the recording rules it names; a selector with an ``offset``
    (a baseline before the fault) is left out.

    A condition on a regression or an average over a range holds only once the fault has
    filled enough of it: ProcessMemoryGrowth's ``predict_linear(...[30m], 4h)`` crossed
    its bound 405 s into a 3 MB/s leak, so its 15m ``for:`` could end only past 1305 s,
    at the edge of a 1320 s phase sized by the 5m rate window alone.
    """
    try:
        tree = promql_parser.parse(expr)
    except Exception:  # the engine parsed it already; a bound is no place to fail a run
        return 0.0
    longest = 0.0
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        kind = type(node).__name__
        if kind == "MatrixSelector":
            if node.vector_selector.offset is None:
                longest = max(longest, node.range.total_seconds())
            continue
        if kind == "SubqueryExpr":
            if node.offset is None:
                longest = max(longest, node.range.total_seconds())
            continue
        if kind == "VectorSelector":
            name = node.name
            if name in records and name not in _seen and node.offset is None:
                longest = max(longest, _longest_range_s(records[name], records, _seen | {name}))
            continue
        for attr in ("lhs", "rhs", "expr", "param"):
            child = getattr(node, attr, None)
            if child is not None and type(child).__module__.startswith("promql"):
                stack.append(child)
        stack.extend(getattr(node, "args", None) or [])
    return longest


def _rate_window_s(stack: ValidateTarget) -> float:
    """The rate window of the rule pack the stack runs, seconds (the quick time scale's
    in a quick run, its ``rule_params``' or the pack's default in a full one)."""
    return float(promql_parser.parse_duration(stack.pack.params.rate_window).total_seconds())


def _settle_s(stack: ValidateTarget) -> float:
    """The calm after a revert before the next case: one rate window of the rules the
    stack runs (the quick scale's 8 s in a quick run, the pack's 5m in a full one), so the
    next baseline's windows no longer hold the fault, and at least the scale's
    ``settle_ticks``.

    8 ticks is the rate window only in a quick run: a full run that moves on 40 s after
    event_loop_blocked's calm began still has that case in GPUUtilizationLow's 5m
    windows (request P99 19.6 s, 13 requests queued on average at the next fault), which
    then pages in the next case.
    """
    ticks = float(stack.config.scale.settle_ticks)
    return max(ticks * float(stack.config.tick), _rate_window_s(stack))


def _recover_phase(stack: ValidateTarget, config: ValidateConfig) -> float:
    """The longest wait for the alerts to resolve after the revert: ``recover_max``; in a
    full run with the default phases, at least the pack's rate window plus a minute.

    A full run's rules read ``rate(...[5m])`` and ``changes(...[5m])``: an alert holds
    until its last event leaves that window, so a 180 s wait fails GPUXidError,
    ModelReloaded and TimedOutWorkNotAborted for not resolving on time.
    """
    wait = config.phase("recover_max")
    if config.scale.compressed or config.recover_max is not None:
        return wait
    return max(wait, _rate_window_s(stack) + 60.0)


def _fault_max(config: ValidateConfig, s: Scenario) -> float:
    if config.quick and config.fault_max is None and s.quick_fault_max is not None:
        return s.quick_fault_max
    return config.phase("fault_max")


@dataclass(frozen=True, slots=True)
class _Expect:
    """What a case expects, from its faults' rows of the fault table."""

    alerts: tuple[str, ...]
    #: alerts that may fire as a consequence (not false alerts)
    allowed: frozenset[str]
    signatures: tuple[str, ...]
    #: the layer the top finding must name (single faults only)
    layer: str | None
    #: metric names one of which ``rank_changes`` must rank in its top three (unknown faults)
    suspects: tuple[str, ...]
    hurts_clients: bool
    faults: tuple[str, ...]
    #: a one-time event (the fault table's ``event``): once it has passed, polls that
    #: name nothing at high confidence agree; one that names another fault does not
    event: bool = False

    @classmethod
    def of(cls, infos: list[Any]) -> _Expect:
        alerts = tuple(dict.fromkeys(a for i in infos for a in i.alerts))
        return cls(
            alerts=alerts,
            allowed=frozenset(alerts) | {a for i in infos for a in i.consequences},
            signatures=tuple(i.signature for i in infos if i.signature is not None),
            layer=infos[0].layer if len(infos) == 1 else None,
            suspects=tuple(dict.fromkeys(m for i in infos for m in i.suspects)),
            hurts_clients=any(i.hurts_clients for i in infos),
            faults=tuple(i.name for i in infos),
            event=all(i.event for i in infos),
        )

    @property
    def unknown(self) -> bool:
        return not self.signatures

    def describe(self) -> str:
        if self.unknown:
            return f"the {self.layer} layer, with {' or '.join(self.suspects)} in the top three"
        if len(self.faults) > 1:
            return f"{' and '.join(self.signatures)} in the top three"
        return f"{self.signatures[0]} ({self.layer} layer) first"


@dataclass(frozen=True, slots=True)
class Poll:
    """One look at the diagnosis during the fault: seconds after the injection,
    whether it named what the case expects, and what it named."""

    after_s: float
    matched: bool
    named: str
    #: no finding at or above HIGH_CONFIDENCE (the diagnosis names nothing)
    quiet: bool = False


@dataclass(slots=True)
class _Watched:
    fired: dict[str, float] = field(default_factory=dict)
    polls: list[Poll] = field(default_factory=list)
    #: the last diagnosis (or the exception it raised), as the case's memory holds it
    diagnosis: Any = None
    #: the case's findings with memory: its polls are successive looks at one incident
    memory: Any = None

    @property
    def first_match(self) -> int | None:
        return next((i for i, p in enumerate(self.polls) if p.matched), None)

    def held_s(self) -> float:
        """Seconds from the first correct poll to the last poll (0: no correct poll)."""
        first = self.first_match
        return 0.0 if first is None else self.polls[-1].after_s - self.polls[first].after_s


def poll_times(t_fault: float, end: float, config: ValidateConfig) -> list[float]:
    """When ``_watch`` asks the diagnosis during a fault phase that ran from ``t_fault``
    to ``end``: from ``fault_min`` on, every ``poll_every`` of the run's time scale, and
    once more at the end
    when the last poll was more than 1.5 s before it. A replay of a recording asks at
    these times (each live poll also waits for the previous one's diagnosis, so live
    polls drift later by its duration)."""
    times: list[float] = []
    t = t_fault + config.phase("fault_min")
    while t < end:
        times.append(t)
        t += config.scale.poll_every
    if not times or end - times[-1] > 1.5:
        times.append(end)
    return times


def _watch(
    stack: ValidateTarget,
    expect: _Expect,
    t_base: float,
    t_fault: float,
    fault_max: float,
    config: ValidateConfig,
) -> _Watched:
    """Poll alerts each second and the diagnosis every few seconds until the fault is
    caught and the diagnosis has been watched for the time scale's ``stable_for`` after its
    first correct poll (a finding that flips a minute later is not one to act on), or
    ``fault_max`` is up with nothing named. A first match late in the phase extends it to
    ``stable_for`` after that poll, so the stability is always judged over that long.

    Every poll is kept: the diagnosis check requires the last one and every one
    after the first match to agree. The fault phase's last poll is taken at its end.
    """
    from ..diagnose import FindingMemory

    scale = config.scale
    w = _Watched(memory=FindingMemory(scale.hold))
    next_diag = t_fault + config.phase("fault_min")
    deadline = t_fault + fault_max
    while time.time() < deadline:
        time.sleep(1.0)
        if not stack.service.alive():
            break
        for ev in stack.engine.history(start=t_fault):
            if ev.state == "firing" and ev.alertname in expect.alerts and ev.fired_at:
                w.fired.setdefault(ev.alertname, ev.fired_at - t_fault)
        now = time.time()
        if now >= next_diag:
            _poll(stack, expect, w, t_base, t_fault, now)
            next_diag = time.time() + scale.poll_every
        first = w.first_match
        if first is not None:
            deadline = max(deadline, t_fault + w.polls[first].after_s + scale.stable_for)
            caught = set(w.fired) >= set(expect.alerts)
            if caught and w.held_s() >= scale.stable_for:
                break
    if not w.polls or time.time() - (t_fault + w.polls[-1].after_s) > 1.5:
        _poll(stack, expect, w, t_base, t_fault, time.time())  # the end of the fault phase
    return w


def _hold_for_pending(
    stack: ValidateTarget, expect: _Expect, config: ValidateConfig
) -> Check | None:
    """Hold the fault, just before its revert, while a paging alert the case allows is
    pending within its ``for:`` (``_pending_pages``), at most ``_hold_cap`` seconds; an
    information line when it held.

    Such an alert reads windows that still hold the fault for a while after the revert,
    so a revert in the middle of its ``for:`` makes whether it pages after the fault a
    race between the two, which says nothing about the monitor; the recovery check then
    judges only the pages the recovery itself brings. Unlisted alerts are not waited
    for, and ``_also_fired`` is judged after the hold, so nothing fires unjudged.
    """
    timing = _rule_timing(stack)
    start = time.time()
    end = start + _hold_cap(stack, timing, expect, config)
    held: set[str] = set()
    while time.time() < end:
        pending = _pending_pages(stack, timing, expect, time.time())
        if not pending:
            break
        held |= pending
        time.sleep(min(1.0, max(0.0, end - time.time())))
    if not held:
        return None
    took = time.time() - start
    names = sorted(held)
    return Check(
        "held_for_pending",
        None,
        f"the revert waited {took:.1f} s for {', '.join(names)}, pending: "
        "a revert in the middle of a for: races the page",
        {"alerts": names, "held_s": round(took, 1)},
    )


def _rule_timing(stack: ValidateTarget) -> dict[str, tuple[float, float]]:
    """Each alerting rule's ``for:`` and its group's evaluation interval, seconds (the
    stack's tick where the group names none)."""
    out: dict[str, tuple[float, float]] = {}
    for group in stack.engine.groups:
        interval = group.interval or float(stack.config.tick)
        for rule in group.alerting_rules:
            out[rule.alert] = (rule.for_, interval)
    return out


def _hold_cap(
    stack: ValidateTarget,
    timing: Mapping[str, tuple[float, float]],
    expect: _Expect,
    config: ValidateConfig,
) -> float:
    """The longest a pending page may hold the fault: the longest ``for:`` of a rule the
    case allows plus two evaluations (``timing``: ``_rule_timing``), and never past the
    wait for recovery (the fault's own time-out leaves room for that wait after the
    longest phase)."""
    longest = max(
        (f + 2 * i for name, (f, i) in timing.items() if name in expect.allowed), default=0.0
    )
    return min(longest, _recover_phase(stack, config))


def _pending_pages(
    stack: ValidateTarget, timing: Mapping[str, tuple[float, float]], expect: _Expect, now: float
) -> set[str]:
    """Paging alerts the case allows that are pending now and due to fire within two
    evaluations of their ``for:`` (``timing``: ``_rule_timing``; one pending longer than
    that is not waiting on it)."""
    out: set[str] = set()
    for e in stack.engine.active():
        if e.state != "pending" or e.alertname not in expect.allowed:
            continue
        if e.labels.get("severity", "") not in PAGING or e.alertname not in timing:
            continue
        for_s, interval = timing[e.alertname]
        if now < e.active_at + for_s + 2 * interval:
            out.add(e.alertname)
    return out


def _poll(
    stack: ValidateTarget, expect: _Expect, w: _Watched, t_base: float, t_fault: float, now: float
) -> None:
    from ..diagnose import HIGH_CONFIDENCE

    w.diagnosis = _safe_diagnose(stack, t_base, now)
    if w.memory is not None and not isinstance(w.diagnosis, Exception):
        w.diagnosis = w.memory.update(w.diagnosis)
    if expect.unknown:
        matched, named = _generic_matches(stack, expect, t_base, t_fault, now)
    else:
        matched, named = _matches(w.diagnosis, expect), _named(w.diagnosis)
    findings = list(getattr(w.diagnosis, "findings", ()))
    quiet = not isinstance(w.diagnosis, Exception) and not any(
        f.confidence >= HIGH_CONFIDENCE for f in findings
    )
    w.polls.append(Poll(now - t_fault, matched, named, quiet))


def _named(diagnosis: Any) -> str:
    if isinstance(diagnosis, Exception):
        return f"error: {type(diagnosis).__name__}: {diagnosis}"
    findings = list(getattr(diagnosis, "findings", ()))[:3]
    if not findings:
        return "nothing"
    return ", ".join(f"{f.signature} {f.confidence:.2f}" for f in findings)


def _safe_diagnose(stack: ValidateTarget, t_base: float, now: float) -> Any:
    """The diagnosis over this case's baseline and fault, never further back, and at
    least the time scale's ``diagnosis_window``; rates over its ``diagnosis_rate``.

    A window that reached past the baseline into the previous case (30 s behind a 4 s
    baseline) let its tail seed the detector, which then missed this case's fault
    (event_loop_blocked read as network_latency once the blocked loop's median was judged
    against gpu_contention's). A compressed run reads rates over its rule pack's rate
    window (8 s), not a quarter of its short window, so they span enough requests; a full
    run leaves the rate to the diagnosis (a minute).
    """
    scale = stack.config.scale
    least, rate = scale.diagnosis_window, scale.diagnosis_rate
    try:
        return stack.diagnose(window=max(least, now - t_base), end=now, rate=rate)
    except Exception as exc:  # the report says the diagnosis failed; the run goes on
        return exc


def _matches(diagnosis: Any, expect: _Expect) -> bool:
    """A single fault: its signature and layer first. A pair: both in the top three."""
    findings = list(getattr(diagnosis, "findings", ()))
    if not findings:
        return False
    if len(expect.signatures) > 1:
        top3 = {str(f.signature) for f in findings[:3]}
        return set(expect.signatures) <= top3
    top = findings[0]
    return str(top.signature) == expect.signatures[0] and str(top.layer).lower() == expect.layer


def _generic_matches(
    stack: ValidateTarget, expect: _Expect, t_base: float, t_fault: float, now: float
) -> tuple[bool, str]:
    """A fault no signature knows: the generic ranking of what changed between the
    baseline and the fault must name its layer first and a suspect in its top three."""
    from ..diagnose import rank_changes

    try:
        ranking = rank_changes(
            stack.agent.store, baseline=(t_base, t_fault), incident=(t_fault, now)
        )
    except Exception as exc:  # reported as this poll's answer; the run goes on
        return False, f"rank_changes failed: {type(exc).__name__}: {exc}"
    top3 = [ch.metric for ch in ranking.changes[:3]]
    named = f"layer {ranking.top_layer}; top changes: {', '.join(top3) or 'none'}"
    ok = ranking.top_layer == expect.layer and bool(set(top3) & set(expect.suspects))
    return ok, named


def _impact(base: LoadPhase, fault: LoadPhase, expect: _Expect) -> Check:
    """What the clients saw. A fault the table says must hurt them fails when nothing moved."""
    must = expect.hurts_clients
    b = base.reports.get(base.main)
    f = fault.reports.get(fault.main)
    if b is None or f is None:
        errors = "; ".join(base.errors + fault.errors) or "no report"
        return Check(
            "impact", False if must else None, f"client-side load report missing ({errors})"
        )
    p99b, p99f = b.e2e.p99_ms / 1000, f.e2e.p99_ms / 1000
    errb, errf = _error_rate(base), _error_rate(fault)
    moved = (p99b == p99b and p99f == p99f and p99f > 1.2 * p99b) or errf > errb + 0.01
    text = (
        f"P99 {fmt_ms(p99b)} -> {fmt_ms(p99f)}{fmt_change(p99b, p99f)}, "
        f"errors {errb:.1%} -> {errf:.1%} (client side, {f.sent} requests)"
    )
    if must and not moved:
        text = f"clients must feel this fault but did not: {text}"
    elif not must:
        text += "; this fault need not hurt clients"
    data = {
        "p99_before_s": p99b,
        "p99_during_s": p99f,
        "errors_before": errb,
        "errors_during": errf,
        "must_hurt": must,
        "moved": moved,
    }
    return Check("impact", moved if must else None, text, data)


def _error_rate(phase: LoadPhase) -> float:
    sent = sum(r.sent for r in phase.reports.values())
    failed = sum(r.failed for r in phase.reports.values())
    return failed / sent if sent else 0.0


def _alert_checks(
    stack: ValidateTarget,
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


def _never_fired(
    stack: ValidateTarget, name: str, t_fault: float, t_end: float, limit: float
) -> Check:
    rule = next((r for g in stack.engine.groups for r in g.alerting_rules if r.alert == name), None)
    if rule is None:
        return Check(f"alert:{name}", False, f"{name} is not in the rule pack")
    since = _active_before(stack.engine.history(end=t_fault), name)
    if since is not None:
        # its peak would read as "crossed" and its pending as "held": neither explains it
        return Check(
            f"alert:{name}",
            False,
            f"{name} did not fire within {limit:g} s: it was already active when the fault "
            f"began (since {max(0.0, t_fault - since):.0f} s before it), so no firing of it "
            "can be told apart from what was there",
            {"active_before_s": max(0.0, t_fault - since)},
        )
    pending = any(e.alertname == name for e in stack.engine.history(start=t_fault))
    peak, threshold, op = _peak(stack, rule.expr, t_fault, t_end)
    if pending:
        why = f"its condition held but not for its full for: {rule.for_:g} s"
    elif peak is None:
        why = "its expression had no data (is the signal collected?)"
    elif threshold is not None:
        # no advice to lower the bound: a threshold moved until a scenario passes hides
        # what users will meet; the miss is the rule's or the fault's to explain
        why = f"never crossed the threshold (peak {peak:.4g} {_neg(op)} {threshold:.4g})"
    else:
        why = f"its condition never held (left side peaked at {peak:.4g})"
    return Check(
        f"alert:{name}",
        False,
        f"{name} did not fire within {limit:g} s: {why}",
        {"peak": peak, "threshold": threshold},
    )


def _active_before(events: Sequence[AlertEvent], name: str) -> float | None:
    """When the earliest of ``name``'s series still pending or firing at the end of
    ``events`` became active (None: none was)."""
    last: dict[tuple[tuple[str, str], ...], AlertEvent] = {}
    for e in events:
        if e.alertname == name:
            last[tuple(sorted(e.labels.items()))] = e
    active = [e.active_at for e in last.values() if e.state in ("pending", "firing")]
    return min(active) if active else None


def _neg(op: str) -> str:
    return {">": "<=", ">=": "<", "<": ">=", "<=": ">"}.get(op, "vs")


def _peak(
    stack: ValidateTarget, expr: str, start: float, end: float
) -> tuple[float | None, float | None, str]:
    """The peak of the left side of the rule's first comparison (left of any ``and`` or
    ``unless``: the guards beside it are not its bound) over the fault, and its bound."""
    from ..console import expr_threshold

    try:
        node: Any = promql_parser.parse(expr)
        while type(node).__name__ == "ParenExpr" or (
            type(node).__name__ == "BinaryExpr" and str(node.op) in ("and", "unless")
        ):
            node = node.expr if type(node).__name__ == "ParenExpr" else node.lhs
        op = str(getattr(node, "op", ""))
        lhs = str(node.lhs) if op in (">", ">=", "<", "<=") else expr
        found = expr_threshold(expr)  # the console's bound: a number or constant arithmetic
        threshold = found[1] if found is not None and found[0] == op else None
        res = stack.agent.store.query_range(lhs, start, end, stack.config.tick)
    except Exception:
        return None, None, ""
    values = [v for series in res.matrix for _, v in series.points if v == v]
    if not values:
        return None, threshold, op
    return (min(values) if op.startswith("<") else max(values)), threshold, op


#: Severities whose unexpected firing fails a case: they page someone.
PAGING = ("P0", "P1")


def _also_fired(stack: ValidateTarget, expect: _Expect, t_fault: float) -> Check | None:
    """Alerts that fired during the fault beyond the expected ones. A paging (P0/P1)
    alert the fault table does not list as a consequence is a false alert: a fail."""
    fired = {
        e.alertname: e.labels.get("severity", "")
        for e in stack.engine.history(start=t_fault)
        if e.state == "firing" and e.alertname not in expect.alerts
    }
    if not fired:
        return None
    false = sorted(a for a, sev in fired.items() if sev in PAGING and a not in expect.allowed)
    known = sorted(a for a in fired if a in expect.allowed)
    quiet = sorted(a for a, sev in fired.items() if sev not in PAGING and a not in expect.allowed)
    parts = []
    if false:
        parts.append(
            "false paging alerts (not a listed consequence of "
            f"{' + '.join(expect.faults)}): " + ", ".join(f"{a} [{fired[a]}]" for a in false)
        )
    if known:
        parts.append("consequences: " + ", ".join(known))
    if quiet:
        parts.append("also fired (not paging): " + ", ".join(f"{a} [{fired[a]}]" for a in quiet))
    data = {"alerts": sorted(fired), "false_paging": false, "consequences": known}
    return Check("other_alerts", False if false else None, "; ".join(parts), data)


@dataclass(frozen=True, slots=True)
class PollVerdict:
    """validate's judgment of a case's diagnosis polls (``judge_polls``)."""

    #: index of the first poll that named what the case expects; None: none did
    first: int | None
    #: polls from the first match on that agreed (named it, or quiet after an event)
    agreed: int
    #: polls from the first match on
    after: int
    #: of ``agreed``, the polls that named nothing after a one-time event had passed
    quiet_after: int
    #: the first poll after the first match that did not agree
    flip: Poll | None

    @property
    def passed(self) -> bool:
        return self.first is not None and self.agreed == self.after

    @property
    def share(self) -> float:
        return self.agreed / self.after if self.after else 0.0


def judge_polls(polls: Sequence[Poll], event: bool) -> PollVerdict:
    """The diagnosis must name the fault at some poll and on every poll after it.

    A one-time event (``event``) that has passed may go quiet: a later poll that names
    nothing at high confidence agrees, but only once the diagnosis has stayed quiet (a
    named fault after that is a flip again). ``benchmarks/diagnosis_accuracy.py`` judges
    replayed polls of a recording with this same rule.
    """
    first = next((i for i, p in enumerate(polls) if p.matched), None)
    if first is None:
        return PollVerdict(None, 0, 0, 0, None)
    after = list(polls[first:])
    over = [
        event and not p.matched and p.quiet and all(q.quiet for q in after[i:] if not q.matched)
        for i, p in enumerate(after)
    ]
    agreed = sum(p.matched or o for p, o in zip(after, over, strict=True))
    flip = next((p for p, o in zip(after, over, strict=True) if not (p.matched or o)), None)
    return PollVerdict(first, agreed, len(after), sum(over), flip)


def _diagnosis_check(w: _Watched, expect: _Expect) -> Check:
    """The diagnosis named what the case expects, and kept naming it on every poll after."""
    polls = [{"after_s": round(p.after_s, 1), "matched": p.matched, "named": p.named,
              "quiet": p.quiet} for p in w.polls]  # fmt: skip
    data: dict[str, Any] = {"polls": polls, "expected": expect.describe()}
    verdict = judge_polls(w.polls, expect.event)
    first = verdict.first
    if isinstance(w.diagnosis, Exception) and first is None:
        text = f"the diagnosis failed: {type(w.diagnosis).__name__}: {w.diagnosis}"
        return Check("diagnosis", False, text, data)
    if first is None:
        last = w.polls[-1].named if w.polls else "no poll"
        text = (
            f"the diagnosis never named {expect.describe()} in {len(w.polls)} polls; last: {last}"
        )
        return Check("diagnosis", False, text, data)
    t_first = w.polls[first].after_s
    data.update(
        after_s=t_first,
        stable_share=verdict.share,
        polls_after=verdict.after,
        held_s=round(w.held_s(), 1),
        top=w.polls[-1].named,
    )
    if verdict.quiet_after:
        data["quiet_after_event"] = verdict.quiet_after
    if verdict.flip is not None:
        flip = verdict.flip
        text = (
            f"the diagnosis named {expect.describe()} {t_first:.0f} s after the fault, then "
            f"{flip.named} at {flip.after_s:.0f} s ({verdict.agreed} of {verdict.after} "
            "polls agreed)"
        )
        return Check("diagnosis", False, text, data)
    text = (
        f"diagnosis: {expect.describe()} {t_first:.0f} s after the fault and on every poll "
        f"after ({verdict.after} of {verdict.after}, over {w.held_s():.0f} s); "
        f"last: {w.polls[-1].named}"
    )
    if verdict.quiet_after:
        text += (
            f" ({verdict.quiet_after} of them after the one-time event had passed, naming "
            "nothing at high confidence)"
        )
    return Check("diagnosis", True, text, data)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


#: What counts as a log file in a ``--log`` directory (a service writing one per worker).
LOG_SUFFIXES = (".jsonl", ".json", ".log")


def log_files(path: Path) -> list[Path]:
    """The JSON-lines logs ``path`` names: itself, or each log file of a directory (a
    service of several workers writes one per process; a worker started mid-run adds
    one)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in LOG_SUFFIXES and p.is_file())
    return [path]


def log_offsets_of(path: Path) -> dict[Path, int]:
    """Where each log file ends now: the fault's lines are the ones written after."""
    return {f: _size(f) for f in log_files(path)}


def _log_check(
    path: Path | None, offsets: Mapping[Path, int], codes_wanted: tuple[str, ...]
) -> Check:
    """The error log lines written during the fault (after ``offsets``; a file that
    appeared since, from its start): structured, and carrying one of ``codes_wanted``
    (the codes the case's faults must produce) when there are any. No log (``--target``
    without ``--log``): not tested, which is neither a pass nor a fail."""
    if path is None:
        return Check(
            "logs",
            None,
            "not tested: no log of the service given (--log FILE or DIRECTORY, its JSON "
            "lines), so its error lines were not checked",
            {"not_tested": True},
        )
    lines = [r for f in log_files(path) for r in _error_lines(f, offsets.get(f, 0))]
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
    if codes_wanted and not set(codes_wanted) & set(codes):
        want = " or ".join(codes_wanted)
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
    stack: ValidateTarget,
    expect: _Expect,
    config: ValidateConfig,
    result: ScenarioResult,
    echo: Echo,
    fired: dict[str, float],
    t_fault: float,
) -> None:
    """After the revert, every alert the fault fired (expected or a consequence) must resolve."""
    t_rev = time.time()
    watch = set(fired) | {
        e.alertname
        for e in stack.engine.history(start=t_fault)
        if e.state == "firing" and e.alertname in expect.allowed
    }
    settle = _settle_s(stack)
    resolved_at: float | None = None
    still: set[str] = set()
    limit = _recover_phase(stack, config)
    while time.time() - t_rev < limit:
        time.sleep(1.0)
        still = {a.alertname for a in stack.engine.active()} & watch
        if still:
            resolved_at = None
        elif resolved_at is None:
            resolved_at = time.time()
        if not still and time.time() - t_rev >= settle:
            break
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
            "resolved",
            True,
            f"{', '.join(sorted(watch))} resolved {took:.1f} s after the revert",
            {"after_s": took, "alerts": sorted(watch)},
        )
    echo(result.add(check).line())
    echo(result.add(_recovery_pages(stack, expect, t_rev, time.time())).line())


def _recovery_pages(stack: ValidateTarget, expect: _Expect, t_rev: float, end: float) -> Check:
    """A paging alert that starts firing after the revert is a false page: whoever it
    wakes finds the fault already gone. A listed consequence of the fault is no exception
    (it is named as one), since the page still comes after the cause has ended."""
    pages = sorted(
        {
            e.alertname
            for e in stack.engine.history(start=t_rev, end=end)
            if e.state == "firing" and e.labels.get("severity", "") in PAGING
        }
    )
    span = f"{end - t_rev:.0f} s after the revert"
    if not pages:
        return Check("recovery_pages", True, f"no paging alert fired in the {span}")
    late = [a for a in pages if a in expect.allowed]
    text = f"false paging alerts in the {span}: " + ", ".join(pages)
    if late:
        text += f" ({', '.join(late)}: a listed consequence, firing after the fault ended)"
    return Check("recovery_pages", False, text, {"false_paging": pages, "late": late})
