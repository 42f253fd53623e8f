from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from aivitals.alerts import default_pack
from aivitals.cli import cli
from aivitals.errors import AlreadyRunning, ConfigError
from aivitals.validate import Check, Report, RunLock, ScenarioResult, ValidateConfig
from aivitals.validate._cases import PAIRS, Case, case
from aivitals.validate._runner import _log_check
from aivitals.validate._scenarios import SCENARIOS, scenario


def _hold_lock(
    path: str, ready: multiprocessing.synchronize.Event, done: multiprocessing.synchronize.Event
) -> None:
    with RunLock(Path(path)):
        ready.set()
        done.wait(20)


def test_second_validate_is_refused_while_one_runs(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    lock = tmp_path / "validate.lock"
    holder = ctx.Process(target=_hold_lock, args=(str(lock), ready, done))
    holder.start()
    try:
        assert ready.wait(20)
        with pytest.raises(AlreadyRunning, match=f"pid {holder.pid}"):
            RunLock(lock).acquire()
    finally:
        done.set()
        holder.join(20)
    with RunLock(lock):  # released when the holder exits
        pass


def test_cli_refuses_a_second_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from aivitals.cli import main

    lock = tmp_path / "aivitals-validate.lock"
    monkeypatch.setenv("AIVITALS_VALIDATE_LOCK", str(tmp_path))
    with RunLock(lock), pytest.raises(SystemExit) as exit_info:
        main(
            ["validate", "--quick", "--scenarios", "cpu_burn", "--report", str(tmp_path / "r.json")]
        )
    assert exit_info.value.code == 1


def test_config_rejects_bad_phases() -> None:
    with pytest.raises(ConfigError, match="baseline"):
        ValidateConfig(baseline=-1)
    with pytest.raises(ConfigError, match="fault_min"):
        ValidateConfig(fault_min=50, fault_max=10)
    with pytest.raises(ConfigError, match="scenarios"):
        ValidateConfig(scenarios=())
    assert ValidateConfig(quick=True).phase("fault_max") < ValidateConfig().phase("fault_max")


def test_unknown_scenario_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="nope"):
        scenario("nope")
    result = CliRunner().invoke(cli, ["validate", "--scenarios", "gpu_oom,nope"])
    assert result.exit_code != 0
    assert "nope" in str(result.exception)


def test_every_scenario_is_a_chaos_fault() -> None:
    from aivitals.chaos import FAULT_TABLE

    assert set(SCENARIOS) == set(FAULT_TABLE)


def test_list_names_every_scenario() -> None:
    result = CliRunner().invoke(cli, ["validate", "--list"])
    assert result.exit_code == 0, result.output
    for name in SCENARIOS:
        assert name in result.output


def test_report_lines_and_json(tmp_path: Path) -> None:
    r = Report(quick=True)
    s = ScenarioResult("gpu_oom", "model", "gpu_oom", 0.0)
    s.add(Check("impact", True, "P99 620 ms -> 2100 ms (+238%)"))
    s.add(Check("alert:X", False, "X did not fire"))
    s.add(Check("other", None, "also fired: Y"))
    r.scenarios.append(s)
    r.scenarios.append(
        ScenarioResult("network_loss", "infrastructure", "network_loss", 0.0, skipped="needs root")
    )
    assert [c.line() for c in s.checks] == [
        "[ok] P99 620 ms -> 2100 ms (+238%)",
        "[fail] X did not fire",
        "[info] also fired: Y",
    ]
    assert not r.passed
    data = json.loads(r.write(tmp_path / "r.json").read_text())
    assert data["passed"] is False
    assert data["scenarios"][1]["skipped"] == "needs root"
    assert data["not_tested"] == [{"case": "network_loss", "reason": "needs root"}]
    assert "0/1 scenarios passed" in data["summary"]
    md = r.to_markdown()
    assert "| `gpu_oom` | model | FAIL | 1 |  |" in md
    assert "[fail] X did not fire" in md and "not tested: needs root" in md
    assert "Model SLA" not in md  # no stack ran: nothing to say
    r.environment["sla_seconds"] = 0.595
    r.environment["sla_calibration"] = {
        "median_s": 0.238, "completed": 50, "concurrency": 2, "sla_per_median": 2.5,
    }  # fmt: skip
    assert (
        "Model SLA of the rules: 0.595 s (2.5 x the model's measured median, 0.238 s over 50 "
        "completions at 2 in flight)." in r.to_markdown()
    )
    r.environment["sla_calibration"] = None
    assert "Model SLA of the rules: 0.595 s (set by the caller)." in r.to_markdown()


def _write_log(path: Path, records: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "not json\n")


def test_log_check_requires_the_structured_fields(tmp_path: Path) -> None:
    full = {
        "request_id": "r1",
        "model_version": "v0.1.0",
        "input_token_count": 3,
        "gpu_device_id": "sim:0",
        "error_code": "CUDA_OOM",
    }
    log = tmp_path / "service.jsonl"
    _write_log(log, [full, {**full, "request_id": None}, {"event": "fine", "error_code": None}])
    check = _log_check(log, {}, SCENARIOS["gpu_oom"].error_codes)
    assert check.ok is False and "1 of 2" in check.text
    _write_log(log, [full])
    assert _log_check(log, {}, SCENARIOS["gpu_oom"].error_codes).ok is True
    _write_log(log, [{**full, "error_code": "TIMEOUT"}])
    missing = _log_check(log, {}, SCENARIOS["gpu_oom"].error_codes)
    assert missing.ok is False and "CUDA_OOM" in missing.text
    _write_log(log, [])
    assert _log_check(log, {}, SCENARIOS["cpu_burn"].error_codes).ok is None


class _FakeService:
    def __init__(self) -> None:
        self.alive_now = False

    def alive(self) -> bool:
        return self.alive_now

    def exit_code(self) -> int:
        return -9


class _FakeStack:
    def __init__(self) -> None:
        self.service = _FakeService()
        self.restarts = 0
        self.ledger = None

    def fault_context(self) -> None:
        return None

    def start_service(self) -> None:
        self.restarts += 1
        self.service.alive_now = True

    def probe_via(self, base_url: str | None) -> None:
        self.probed = base_url


class _FakeRunner:
    stopped = 0
    run = None

    def __init__(self, ctx: object, **kw: object) -> None:
        pass

    def __enter__(self) -> _FakeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def stop_all(self) -> list[str]:
        _FakeRunner.stopped += 1
        return []


def test_a_service_that_dies_is_reported_reverted_and_restarted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import aivitals.chaos
    from aivitals.validate import _runner

    def dies(*args: object) -> None:
        raise RuntimeError("connection refused: the service is gone")

    monkeypatch.setattr(aivitals.chaos, "ChaosRunner", _FakeRunner)
    monkeypatch.setattr(_runner, "_scenario", dies)
    stack = _FakeStack()
    report = Report(quick=True)
    lines: list[str] = []
    config = ValidateConfig(quick=True)
    _runner._run_all(stack, [Case((SCENARIOS["gpu_xid"],))], config, report, lines.append)
    result = report.scenarios[0]
    assert not result.passed
    assert result.error is not None and "service is gone" in result.error
    assert any("died (exit -9)" in c.text for c in result.checks)
    assert _FakeRunner.stopped == 1  # the fault was reverted
    assert stack.restarts == 1
    assert any(line.startswith("[fail]") for line in lines)


def test_ctrl_c_in_a_case_reverts_it_marks_it_and_stops_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import aivitals.chaos
    from aivitals.validate import _runner

    def pressed(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(aivitals.chaos, "ChaosRunner", _FakeRunner)
    monkeypatch.setattr(_runner, "_scenario", pressed)
    stopped = _FakeRunner.stopped
    stack = _FakeStack()
    stack.service.alive_now = True
    report = Report(quick=True, planned=2)
    cases = [Case((SCENARIOS["cpu_burn"],)), Case((SCENARIOS["gpu_xid"],))]
    with pytest.raises(KeyboardInterrupt):
        _runner._run_all(stack, cases, ValidateConfig(quick=True), report, [].append)
    assert [s.fault for s in report.scenarios] == ["cpu_burn"]  # the next never began
    assert report.scenarios[0].error == "interrupted"
    assert _FakeRunner.stopped == stopped + 1  # its fault was reverted
    report.interrupted = True
    assert not report.passed
    assert report.summary().endswith("; interrupted after 1 of 2 cases")
    assert report.to_dict()["interrupted"] is True


def test_param_overrides_are_checked_before_anything_starts() -> None:
    cfg = ValidateConfig(scenarios=("redis_down",), params={"redis_down": {"method": 1}})
    assert cfg.params == {"redis_down": {"method": 1}}
    with pytest.raises(ConfigError, match="has no nope"):
        ValidateConfig(params={"redis_down": {"nope": 1}})
    with pytest.raises(ConfigError, match="not among the scenarios"):
        ValidateConfig(scenarios=("cpu_burn",), params={"redis_down": {"method": 1}})
    with pytest.raises(ConfigError, match="unknown fault"):
        ValidateConfig(params={"redis_melt": {"method": 1}})
    for bad in ("redis_down=1", "method=1", ".method=1", "redis_down.method"):
        result = CliRunner().invoke(cli, ["validate", "--scenarios", "redis_down", "-p", bad])
        assert result.exit_code != 0
        assert "FAULT.KEY=VALUE" in str(result.exception), bad


# --- cases: single faults and pairs -------------------------------------------------------


def test_cases_name_one_fault_or_two_at_once() -> None:
    from aivitals.validate._runner import cases_of

    pair = case("redis_down+traffic_surge")
    assert pair.is_pair and pair.faults == ("redis_down", "traffic_surge")
    assert pair.name == "redis_down+traffic_surge"
    for bad, why in (
        ("a+b+c", "at most two"),
        ("cpu_burn+cpu_burn", "same fault twice"),
        ("cpu_burn+nope", "unknown scenario 'nope'"),
    ):
        with pytest.raises(ConfigError, match=why):
            case(bad)
    default = [c.name for c in cases_of(ValidateConfig(quick=True))]
    assert default[: len(SCENARIOS)] == list(SCENARIOS)
    assert default[len(SCENARIOS) :] == ["+".join(p) for p in PAIRS]
    named = cases_of(ValidateConfig(scenarios=("gpu_oom", "cpu_burn+gpu_memory_leak")))
    assert [c.name for c in named] == ["gpu_oom", "cpu_burn+gpu_memory_leak"]
    # -p applies to a fault named inside a pair
    cfg = ValidateConfig(
        scenarios=("redis_down+traffic_surge",), params={"redis_down": {"method": 1}}
    )
    assert pair.params(True, cfg.params)["redis_down"]["method"] == 1
    result = CliRunner().invoke(cli, ["validate", "--list"])
    assert "cpu_burn+gpu_memory_leak" in result.output


def test_soak_takes_no_fault() -> None:
    result = CliRunner().invoke(cli, ["validate", "--soak", "5m", "--scenarios", "cpu_burn"])
    assert result.exit_code != 0 and "--soak runs no fault" in str(result.exception)
    result = CliRunner().invoke(cli, ["validate", "--soak", "five minutes"])
    assert result.exit_code != 0 and "soak duration" in str(result.exception)


def test_the_sla_keeps_the_fault_cases_budget_per_token_for_longer_generations() -> None:
    """Fault cases send 12-token completions (SLA 0.25 s); the soak replays the trace's, up
    to 48 tokens: the same budget per token for its longest one is the pack's 1 s."""
    from aivitals.demo import MAX_OUTPUT_TOKENS
    from aivitals.validate._load import LoadPlan
    from aivitals.validate._runner import _demo_rule_params

    assert LoadPlan().max_tokens == 12 and MAX_OUTPUT_TOKENS == 48
    assert _demo_rule_params() == {"sla_seconds": 0.25}
    assert _demo_rule_params(MAX_OUTPUT_TOKENS) == {"sla_seconds": 1.0}
    assert _demo_rule_params(MAX_OUTPUT_TOKENS)["sla_seconds"] == default_pack().params.sla_seconds
    with pytest.raises(ConfigError, match="max_tokens 0"):
        _demo_rule_params(0)


def test_the_sla_follows_the_models_measured_speed() -> None:
    """A model 1.8x slower than the nominal 0.1 s gets an SLA 1.8x longer: a fixed 0.25 s
    sat at the slower healthy model's P99 (one slow inference paged). The sweep's
    contention factors (2 x SLA over the model's time) are then the same everywhere."""
    from aivitals.demo import MAX_OUTPUT_TOKENS
    from aivitals.validate._runner import NOMINAL_MEDIAN_S, SLA_PER_MEDIAN, _demo_rule_params
    from aivitals.validate._severity import DEMO_INFERENCE_S, knob

    assert _demo_rule_params(median_s=0.18) == {"sla_seconds": 0.45}
    assert _demo_rule_params(MAX_OUTPUT_TOKENS, median_s=0.18) == {"sla_seconds": 1.8}
    assert DEMO_INFERENCE_S == NOMINAL_MEDIAN_S
    at = knob("gpu_contention")
    assert at.threshold == {"factor": 2 * SLA_PER_MEDIAN}  # P99 at 2 x SLA: x5
    for bad in (0.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match="median_s"):
            _demo_rule_params(median_s=bad)


# --- strict checks -------------------------------------------------------------------------


class _Event:
    def __init__(self, name: str, severity: str, state: str = "firing") -> None:
        self.alertname, self.state, self.labels = name, state, {"severity": severity}
        self.fired_at = 1.0


class _Engine:
    def __init__(self, events: list[_Event]) -> None:
        self.events = events

    def history(self, start: float | None = None, end: float | None = None) -> list[_Event]:
        return self.events


def _expect(*faults: str) -> object:
    from aivitals.chaos import FAULT_TABLE
    from aivitals.validate._runner import _Expect

    return _Expect.of([FAULT_TABLE[f] for f in faults])


def test_a_page_after_the_revert_is_a_false_page_even_when_listed() -> None:
    from aivitals.validate._runner import _recovery_pages

    class Stack:
        engine = _Engine(
            [_Event("ProbeLatencyHigh", "P2"), _Event("DiskSaturated", "P1", "pending")]
        )

    quiet = _recovery_pages(Stack(), _expect("traffic_surge"), 100.0, 112.0)  # type: ignore[arg-type]
    assert quiet.ok is True and "12 s after the revert" in quiet.text
    Stack.engine = _Engine([_Event("QueueWaitHigh", "P0"), _Event("GPUMemoryHigh", "P1")])
    late = _recovery_pages(Stack(), _expect("traffic_surge"), 100.0, 112.0)  # type: ignore[arg-type]
    assert late.ok is False
    assert late.data == {
        "false_paging": ["GPUMemoryHigh", "QueueWaitHigh"],
        "late": ["QueueWaitHigh"],
    }
    assert "QueueWaitHigh: a listed consequence, firing after the fault ended" in late.text


class _Clock:
    """Virtual time for ``_watch``: its 1 s sleeps cost nothing."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


_HOLD_RULES = """
groups:
  - name: g
    interval: 1s
    rules:
      - alert: ProbeFailing
        expr: vector(1)
        for: 2s
        labels: {severity: P1}
      - alert: DiskSaturated
        expr: vector(1)
        for: 2s
        labels: {severity: P1}
"""


def _watched(monkeypatch: pytest.MonkeyPatch, first_match_s: float | None) -> tuple[Any, float]:
    """``_watch`` on a case whose diagnosis first names the fault ``first_match_s`` after
    the injection (None: never), its alert firing at once; the polls and the phase's end."""
    from aivitals.validate import _runner

    clock = _Clock()
    monkeypatch.setattr(_runner, "time", clock)
    t_fault = clock.now

    def poll(stack: Any, expect: Any, w: Any, t_base: float, t_f: float, now: float) -> None:
        hit = first_match_s is not None and now - t_f >= first_match_s
        w.polls.append(_runner.Poll(now - t_f, hit, "gpu_oom 0.9" if hit else "nothing"))

    monkeypatch.setattr(_runner, "_poll", poll)

    class Stack:
        class service:
            @staticmethod
            def alive() -> bool:
                return True

        class engine:
            @staticmethod
            def history(start: float | None = None) -> list[Any]:
                ev = _Event("GPUOutOfMemoryErrors", "P0")
                ev.fired_at = t_fault + 1.0
                return [ev]

    expect = _expect("gpu_oom")
    config = ValidateConfig(quick=True)
    w = _runner._watch(Stack(), expect, t_fault - 10, t_fault, 25.0, config)  # type: ignore[arg-type]
    return w, clock.now - t_fault


@pytest.mark.parametrize("first", [6.0, 20.0])
def test_the_fault_phase_watches_the_diagnosis_for_stable_for_after_its_first_match(
    monkeypatch: pytest.MonkeyPatch, first: float
) -> None:
    from aivitals.timescale import QUICK

    w, ended = _watched(monkeypatch, first)
    # never three polls and out: the whole window, past fault_max (25 s) when it must be
    assert w.held_s() >= QUICK.stable_for
    assert ended >= first + QUICK.stable_for
    assert ended <= first + QUICK.stable_for + QUICK.poll_every + 2


def test_a_fault_never_named_ends_at_fault_max(monkeypatch: pytest.MonkeyPatch) -> None:
    w, ended = _watched(monkeypatch, None)
    assert w.first_match is None and w.held_s() == 0.0
    assert 25.0 <= ended <= 27.0


def _pending(name: str, since: float) -> Any:
    ev = _Event(name, "P1", "pending")
    ev.active_at = since
    return ev


def _hold(
    monkeypatch: pytest.MonkeyPatch, fault: str, pending: Callable[[float], list[Any]]
) -> tuple[Any, float]:
    """``_hold_for_pending`` on a case of ``fault`` whose engine has ``pending(now)``
    pending (rules of ``_HOLD_RULES``), in virtual time: its check and how long it held."""
    from aivitals.alerts import load_rules
    from aivitals.validate import _runner

    clock = _Clock()
    monkeypatch.setattr(_runner, "time", clock)
    start = clock.now

    class Stack:
        class config:
            tick = 1.0

        class engine:
            groups = load_rules(_HOLD_RULES)

            @staticmethod
            def active() -> list[Any]:
                return pending(clock.now)

    check = _runner._hold_for_pending(Stack(), _expect(fault), ValidateConfig(quick=True))  # type: ignore[arg-type]
    return check, clock.now - start


def test_a_listed_consequence_pending_at_the_revert_holds_it_until_it_fires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ProbeFailing (a listed consequence of a blocked loop, P1, for: 2s) pended 1 s
    # before the revert was due and fires 1 s after: the revert waits instead of racing
    def probe(now: float) -> list[Any]:
        return [_pending("ProbeFailing", 999.0)] if now < 1001.0 else []

    check, held = _hold(monkeypatch, "event_loop_blocked", probe)
    assert held == 1.0
    assert check is not None and check.ok is None
    assert check.data == {"alerts": ["ProbeFailing"], "held_s": 1.0}
    assert "the revert waited 1.0 s for ProbeFailing" in check.text


def test_only_a_listed_paging_alert_within_its_for_holds_the_revert(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # an unlisted alert is judged as a false alert, not waited for
    check, held = _hold(
        monkeypatch, "event_loop_blocked", lambda now: [_pending("DiskSaturated", now - 0.5)]
    )
    assert check is None and held == 0.0
    # one pending far past its for: 2s is not waiting on it
    check, held = _hold(
        monkeypatch, "event_loop_blocked", lambda now: [_pending("ProbeFailing", now - 10.0)]
    )
    assert check is None and held == 0.0
    check, held = _hold(monkeypatch, "event_loop_blocked", lambda now: [])
    assert check is None and held == 0.0


def test_a_pending_page_holds_the_revert_no_longer_than_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a consequence that keeps pending anew (always 0.5 s into its for:) cannot hold
    # the fault for ever: at most the longest for: the case allows (ProbeFailing's 2 s
    # among this engine's rules) plus two evaluations of 1 s
    check, held = _hold(
        monkeypatch, "event_loop_blocked", lambda now: [_pending("ProbeFailing", now - 0.5)]
    )
    assert check is not None and held == 4.0


def test_an_unlisted_paging_alert_fails_the_case() -> None:
    from aivitals.validate._runner import _also_fired

    class Stack:
        engine = _Engine(
            [
                _Event("HTTP429RateHigh", "P1"),  # expected for a surge
                _Event("QueueWaitHigh", "P0"),  # a listed consequence of a surge
                _Event("ProbeLatencyHigh", "P2"),  # not paging
                _Event("GPUMemoryHigh", "P1"),  # nothing of a surge: a false alert
                _Event("DiskSaturated", "P1", state="pending"),  # never fired
            ]
        )

    check = _also_fired(Stack(), _expect("traffic_surge"), 0.0)
    assert check is not None and check.ok is False
    assert check.data["false_paging"] == ["GPUMemoryHigh"]
    assert check.data["consequences"] == ["QueueWaitHigh"]
    assert "ProbeLatencyHigh [P2]" in check.text and "DiskSaturated" not in check.text
    Stack.engine = _Engine([_Event("QueueWaitHigh", "P0"), _Event("ProbeLatencyHigh", "P2")])
    ok = _also_fired(Stack(), _expect("traffic_surge"), 0.0)
    assert ok is not None and ok.ok is None
    # in a pair, either fault's consequences are allowed
    Stack.engine = _Engine([_Event("GPUUtilizationLow", "P1")])
    pair = _also_fired(Stack(), _expect("cpu_burn", "gpu_memory_leak"), 0.0)
    assert pair is not None and pair.ok is None


def test_the_diagnosis_must_hold_on_every_poll_after_it_first_names_the_fault() -> None:
    from aivitals.validate._runner import Poll, _diagnosis_check, _Watched

    expect = _expect("gpu_oom")
    w = _Watched(polls=[Poll(5, False, "nothing"), Poll(8, True, "gpu_oom 0.7")])
    w.polls += [Poll(11, True, "gpu_oom 0.7"), Poll(14, True, "gpu_oom 0.8")]
    ok = _diagnosis_check(w, expect)
    assert ok.ok is True and ok.data["stable_share"] == 1.0 and ok.data["after_s"] == 8
    w.polls.append(Poll(17, False, "traffic_surge 0.9"))
    flipped = _diagnosis_check(w, expect)
    assert flipped.ok is False and flipped.data["stable_share"] == 0.75
    assert "then traffic_surge 0.9 at 17 s (3 of 4 polls agreed)" in flipped.text
    never = _diagnosis_check(_Watched(polls=[Poll(5, False, "cpu_burn 0.9")]), expect)
    assert never.ok is False and "never named gpu_oom" in never.text


def test_after_a_one_time_event_a_quiet_diagnosis_agrees_and_another_fault_does_not() -> None:
    from aivitals.validate._runner import Poll, _diagnosis_check, _Watched

    # cold_start is an event: the load is paid, the service warm again, nothing to name
    event = _expect("cold_start")
    assert event.event and not _expect("gpu_oom").event
    named = [Poll(5, True, "cold_start 0.9"), Poll(8, True, "cold_start 0.8")]
    over = _Watched(polls=[*named, Poll(11, False, "anomaly_service 0.45", quiet=True)])
    ok = _diagnosis_check(over, event)
    assert ok.ok is True and ok.data["quiet_after_event"] == 1, ok.text
    assert "after the one-time event had passed" in ok.text
    # quiet, then another fault named: a flip, and the quiet poll before it does not count
    other = _Watched(polls=[*over.polls, Poll(14, False, "cpu_burn 0.8")])
    flipped = _diagnosis_check(other, event)
    assert flipped.ok is False and flipped.data["stable_share"] == 0.5, flipped.text
    # an ongoing fault that goes quiet was lost, not over
    lost = _Watched(polls=[Poll(5, True, "gpu_oom 0.9"), Poll(8, False, "nothing", quiet=True)])
    assert _diagnosis_check(lost, _expect("gpu_oom")).ok is False


def test_a_replay_polls_when_the_live_run_did_and_judges_with_the_same_rule() -> None:
    from aivitals.validate import ValidateConfig
    from aivitals.validate._runner import Poll, judge_polls, poll_times

    quick = ValidateConfig(quick=True)
    # from fault_min (5 s) every 3 s, and at the end when the last poll is > 1.5 s before it
    assert poll_times(100.0, 120.0, quick) == [105.0, 108.0, 111.0, 114.0, 117.0, 120.0]
    assert poll_times(100.0, 118.0, quick) == [105.0, 108.0, 111.0, 114.0, 117.0]
    assert poll_times(100.0, 103.0, quick) == [103.0]  # a phase shorter than fault_min
    assert poll_times(0.0, 60.0, ValidateConfig(quick=False)) == [30.0, 40.0, 50.0, 60.0]
    named, quiet = Poll(5, True, "cold_start 0.8"), Poll(8, False, "anomaly 0.3", quiet=True)
    assert judge_polls([named, quiet], event=True).passed
    assert not judge_polls([named, quiet], event=False).passed
    assert not judge_polls([quiet], event=True).passed  # never named: not "over", missed
    flip = judge_polls([named, quiet, Poll(11, False, "cpu_burn 0.8")], event=True)
    assert not flip.passed and flip.flip is not None and flip.flip.after_s == 8


def test_a_pair_needs_both_signatures_in_the_top_three() -> None:
    from aivitals.validate._runner import _matches

    class F:
        def __init__(self, sig: str) -> None:
            self.signature, self.layer, self.confidence = sig, "x", 0.5

    class D:
        def __init__(self, *sigs: str) -> None:
            self.findings = [F(s) for s in sigs]

    pair = _expect("cpu_burn", "gpu_memory_leak")
    assert _matches(D("gpu_memory_leak", "x", "cpu_burn"), pair)
    assert not _matches(D("gpu_memory_leak", "x", "y", "cpu_burn"), pair)
    assert not _matches(D(), pair)


def test_impact_fails_only_for_a_fault_that_must_hurt_clients() -> None:
    from aivitals.validate._runner import _impact

    class E2E:
        def __init__(self, p99: float) -> None:
            self.p99_ms = p99

    class R:
        def __init__(self, p99: float) -> None:
            self.e2e, self.sent, self.failed = E2E(p99), 20, 0

    class Phase:
        main = "completions"

        def __init__(self, p99: float) -> None:
            self.reports, self.errors = {"completions": R(p99)}, []

    calm, same, slow = Phase(100), Phase(105), Phase(900)
    assert _impact(calm, same, _expect("gpu_contention")).ok is False
    assert "must feel" in _impact(calm, same, _expect("gpu_contention")).text
    assert _impact(calm, slow, _expect("gpu_contention")).ok is True
    assert _impact(calm, same, _expect("gpu_memory_leak")).ok is None
    missing = Phase(0)
    missing.reports = {}
    assert _impact(calm, missing, _expect("network_latency")).ok is False


def test_a_full_run_holds_the_fault_for_each_expected_alerts_for_and_rate_window() -> None:
    from types import SimpleNamespace

    from aivitals.chaos import FAULT_TABLE
    from aivitals.validate._runner import FULL_FOR_MARGIN_S, _Expect, _fault_phase

    rules = [
        SimpleNamespace(alert="GPUProcessMemoryGrowth", for_=600.0, expr="leak:deriv > 2e6"),
        SimpleNamespace(alert="GPUMemoryHigh", for_=300.0, expr="used / total > 0.9"),
        SimpleNamespace(alert="HostCPUSaturated", for_=300.0, expr="busy > 0.9"),
        SimpleNamespace(alert="DiskSaturated", for_=120.0, expr="io > 0.95"),
        SimpleNamespace(alert="GPUOutOfMemoryErrors", for_=0.0, expr="ooms > 0"),
    ]
    records = [SimpleNamespace(record="leak:deriv", expr="deriv(used[30m])")]

    def stack(**params: str) -> Any:
        group = SimpleNamespace(alerting_rules=rules, recording_rules=records)
        return SimpleNamespace(engine=SimpleNamespace(groups=[group]), pack=default_pack(**params))

    leak = case("gpu_memory_leak")
    expect = _Expect.of([FAULT_TABLE["gpu_memory_leak"]])
    # the longest for: (10m) plus the 30m its growth is fitted over (through the recording
    # rule), longer than the pack's 5m rate window, plus the margin
    assert (
        _fault_phase(stack(), ValidateConfig(), leak, expect) == 600.0 + 1800.0 + FULL_FOR_MARGIN_S
    )
    # DiskSaturated averages a busy share over the rate window: 2m + 5m + margin, not 240 s
    disk = case("disk_io_saturation")
    disk_expect = _Expect.of([FAULT_TABLE["disk_io_saturation"]])
    assert _fault_phase(stack(), ValidateConfig(), disk, disk_expect) == 120.0 + 300.0 + 120.0
    assert _fault_phase(stack(rate_window="1m"), ValidateConfig(), disk, disk_expect) == 300.0
    # quick runs divide for: by 60 and keep their phase; a --fault-max given is the user's
    assert _fault_phase(stack(), ValidateConfig(quick=True), leak, expect) == 60.0  # its own
    assert _fault_phase(stack(), ValidateConfig(fault_max=90.0), leak, expect) == 90.0
    # a fault no alert expects keeps the default phase
    unknown = case("thread_leak")
    assert (
        _fault_phase(stack(), ValidateConfig(), unknown, _Expect.of([FAULT_TABLE["thread_leak"]]))
        == 120.0
    )


def test_the_longest_range_an_alert_reads_up_to_now() -> None:
    from aivitals.validate._runner import _longest_range_s

    records = {
        "a:rate": "rate(x[5m])",
        "b:loop": "c:loop",
        "c:loop": "b:loop + max_over_time(y[2m])",
    }
    assert _longest_range_s("predict_linear(rss[30m], 14400) > 1", {}) == 1800.0
    assert _longest_range_s("a:rate > 1 and rate(z[1m]) > 0", records) == 300.0
    # a baseline before the fault (offset) is not a range the fault must fill
    assert _longest_range_s("x > quantile_over_time(0.5, x[15m:] offset 1m)", {}) == 0.0
    assert _longest_range_s("avg_over_time(x[10m] offset 5m) > 1", {}) == 0.0
    assert _longest_range_s("b:loop > 0", records) == 120.0  # a cycle ends
    assert _longest_range_s("up", {}) == 0.0 and _longest_range_s("((", {}) == 0.0
    # every expected alert of the shipped pack: the leaks fit their growth over 30m
    from aivitals.alerts import default_pack

    pack = default_pack()
    known = {r.record: r.expr for g in pack.groups for r in g.recording_rules}
    ranges = {
        r.alert: _longest_range_s(r.expr, known) for g in pack.groups for r in g.alerting_rules
    }
    assert ranges["ProcessMemoryGrowth"] == ranges["GPUProcessMemoryGrowth"] == 1800.0
    assert ranges["DiskSaturated"] == 300.0


def test_a_full_run_waits_for_the_packs_rate_window_to_resolve() -> None:
    from types import SimpleNamespace

    from aivitals.validate._runner import _recover_phase

    def stack(**params: object) -> Any:
        return SimpleNamespace(pack=default_pack(**params))

    assert _recover_phase(stack(), ValidateConfig()) == 300.0 + 60.0  # the pack's 5m
    assert _recover_phase(stack(rate_window="1m"), ValidateConfig()) == 180.0  # the phase's
    assert _recover_phase(stack(rate_window="10m"), ValidateConfig()) == 660.0
    assert _recover_phase(stack(), ValidateConfig(quick=True)) == 20.0
    assert _recover_phase(stack(), ValidateConfig(recover_max=30.0)) == 30.0  # as asked


def test_the_calm_after_a_revert_is_one_rate_window_of_the_rules_the_stack_runs() -> None:
    """A full run that moves on 40 s (8 ticks) after a revert while its rules read 5m
    windows pages in the next case on the previous one's tail."""
    from types import SimpleNamespace

    from aivitals.demo import QUICK_RULES
    from aivitals.timescale import QUICK
    from aivitals.validate._runner import _settle_s

    def stack(tick: float, **params: object) -> Any:
        config = SimpleNamespace(tick=tick, scale=QUICK)  # 8 ticks at both scales
        return SimpleNamespace(config=config, pack=default_pack(**params))

    assert _settle_s(stack(5.0)) == 300.0  # a full run: the pack's 5m
    assert _settle_s(stack(1.0, **QUICK_RULES)) == 8.0  # a quick run: 8 s, as before
    assert _settle_s(stack(5.0, rate_window="1m")) == 60.0
    assert _settle_s(stack(15.0, rate_window="1m", scrape_interval="15s")) == 120.0  # 8 ticks


def test_a_full_run_warms_up_for_the_longest_usual_level_the_signatures_read() -> None:
    """Without a warm-up a full run's first case is judged against the stack's cold start:
    the signatures' 5-minute median "usual level" holds only the 60 s baseline and the
    cold cache's ramp, and the diagnosis loses cache_stampede 90 s into it. The warm-up must
    cover the longest such look-back, whatever the signatures come to read."""
    import re

    import promql_parser

    import aivitals.diagnose
    from aivitals.validate._runner import warm_up_seconds

    yaml_dir = Path(aivitals.diagnose.__file__).parent / "signatures"
    # a count over a look-back (gpu_memory_leak's minutes of growth in the last 15) can
    # only be smaller over a shorter history: it never holds for the lack of one
    ranges = [
        promql_parser.parse_duration(m).total_seconds()
        for f in yaml_dir.glob("*.yaml")
        for line in f.read_text().splitlines()
        if "count_over_time((" not in line
        for m in re.findall(r"\[(\d+[smhd]):", line)
    ]
    assert ranges, "no subquery look-back found: the test reads the wrong files"
    assert warm_up_seconds(ValidateConfig()) >= max(ranges)
    assert warm_up_seconds(ValidateConfig(quick=True)) == 15.0  # quick keeps its own


def test_a_periodic_full_run_fault_holds_long_enough_for_its_alerts_for() -> None:
    """gpu_cotenant's batch job took the memory 5 s of every 10 in a full run, so
    GPUMemoryHigh (for: 5m) held its condition and never fired: a periodic fault's
    full-run "on" time must outlast each expected alert's ``for:``."""
    from aivitals.alerts import default_pack
    from aivitals.chaos import FAULT_TABLE, FAULTS

    fors = {r.alert: float(r.for_) for g in default_pack().groups for r in g.alerting_rules}
    periodic = [s for s in SCENARIOS.values() if "on_seconds" in FAULTS[s.fault].params]
    assert periodic, "no periodic fault found: the test reads the wrong parameters"
    for s in periodic:
        # the scenario's full-run value, else the fault's own default
        on = s.params.get("on_seconds", FAULTS[s.fault].params["on_seconds"][0])
        longest = max(fors[a] for a in FAULT_TABLE[s.fault].alerts)
        assert on > longest, (s.fault, on, longest)


def test_a_callers_sla_skips_the_measurement_and_wins() -> None:
    from aivitals.validate._runner import start_calibrated_agent

    started: list[dict[str, object]] = []

    class _NoService:  # calibrating would send requests to it: it must not be asked
        config = None

        def start_agent(self, params: dict[str, object]) -> None:
            started.append(params)

    lines: list[str] = []
    got = start_calibrated_agent(_NoService(), {"sla_seconds": 0.8}, 48, lines.append)
    assert got is None and started == [{"sla_seconds": 0.8}] and lines == []


def test_the_fault_cases_run_the_demo_with_a_cache_ttl_longer_than_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load's 16 embeddings inputs, filled together, would expire together within
    the run (300 +- 30 s) and quick mode's 8 s windows would read it as a stampede."""
    import aivitals.demo
    from aivitals.validate import run_validate
    from aivitals.validate._runner import FAULT_CASE_CACHE_TTL_S

    seen: list[Any] = []

    class _Stack:
        def __init__(self, config: Any) -> None:
            seen.append(config)

        def start(self) -> None:
            raise KeyboardInterrupt  # stop here: the stack's config is what is checked

        def stop(self) -> None:
            pass

    monkeypatch.setattr(aivitals.demo, "Stack", _Stack)
    report = run_validate(
        ValidateConfig(quick=True, scenarios=("cpu_burn",), lock_path=tmp_path / "v.lock")
    )
    assert report.interrupted
    args = list(seen[0].service_args)
    ttl = float(args[args.index("--cache-ttl") + 1])
    assert ttl == FAULT_CASE_CACHE_TTL_S
    assert ttl >= 24 * 3600  # a day: no run of every case comes near it


def _embeddings_server(seconds: float, status: int) -> Any:
    """A stand-in service on 127.0.0.1 answering /v1/embeddings after ``seconds``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class _Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(seconds)
            body = b'{"data": [{"embedding": [0.1, 0.2]}]}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.slow
def test_a_sweep_measures_the_pool_before_sizing_a_surge() -> None:
    """calibrate_capacity counts fresh embeddings answered with one in flight per worker;
    only a graded surge asks for it; a service that cannot answer is a ServiceError."""
    from types import SimpleNamespace

    from aivitals.errors import ServiceError
    from aivitals.validate._cases import Case
    from aivitals.validate._runner import _sized_at_run_time, calibrate_capacity

    srv = _embeddings_server(0.05, 200)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        stack = SimpleNamespace(config=SimpleNamespace(workers=2), service=SimpleNamespace(url=url))
        got = calibrate_capacity(stack, {"median_s": 0.12}, seconds=1.5)
    finally:
        srv.shutdown()
    # two in flight at 50 ms each: at most 40 a second, less the round trips
    assert 15 <= got["embeddings_rps"] <= 40, got
    assert got["workers"] == 2 and got["completion_s"] == 0.12 and got["seconds"] == 1.5
    surge = SCENARIOS["traffic_surge"]
    assert _sized_at_run_time(Case((surge,), "threshold"))
    assert _sized_at_run_time(Case((surge,), "moderate"))
    assert not _sized_at_run_time(Case((surge,), "severe"))  # today's values
    assert not _sized_at_run_time(Case((surge,)))
    assert not _sized_at_run_time(Case((SCENARIOS["cpu_burn"],), "threshold"))
    # the case's parameters follow the pool measured
    fast = Case((surge,), "threshold").params(True, {}, {**got, "embeddings_rps": 90.0})
    slow = Case((surge,), "threshold").params(True, {}, {**got, "embeddings_rps": 20.0})
    assert fast["traffic_surge"]["factor"] > slow["traffic_surge"]["factor"]
    # -p overrides still win
    assert (
        Case((surge,), "threshold").params(True, {"traffic_surge": {"factor": 3}}, got)[
            "traffic_surge"
        ]["factor"]
        == 3
    )

    broken = _embeddings_server(0.0, 503)
    try:
        url = f"http://127.0.0.1:{broken.server_address[1]}"
        stack = SimpleNamespace(config=SimpleNamespace(workers=2), service=SimpleNamespace(url=url))
        with pytest.raises(ServiceError, match="measuring the pool's capacity: 0 of"):
            calibrate_capacity(stack, None, seconds=0.5)
    finally:
        broken.shutdown()


def test_log_check_reads_every_workers_file_from_where_it_ended(tmp_path: Path) -> None:
    """A --log directory: each worker's file after its size at the fault's start, and a
    file that appeared since from its beginning."""
    from aivitals.validate._runner import log_offsets_of

    full = {
        "request_id": "r1",
        "model_version": "v0.1.0",
        "input_token_count": 3,
        "gpu_device_id": "sim:0",
        "error_code": "TIMEOUT",
    }
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "w1.jsonl").write_text(json.dumps(full) + "\n")  # before the fault
    (logs / "notes.txt").write_text(json.dumps({**full, "error_code": "CUDA_OOM"}) + "\n")
    offsets = log_offsets_of(logs)
    # the old line and the file that is not a log are not read: nothing new yet
    nothing = _log_check(logs, offsets, SCENARIOS["gpu_oom"].error_codes)
    assert nothing.ok is False and "saw: none" in nothing.text
    (logs / "w2.jsonl").write_text(json.dumps({**full, "error_code": "CUDA_OOM"}) + "\n")
    check = _log_check(logs, offsets, SCENARIOS["gpu_oom"].error_codes)
    assert check.ok is True and check.data["codes"] == {"CUDA_OOM": 1}
    with (logs / "w1.jsonl").open("a") as f:
        f.write(json.dumps({**full, "request_id": None}) + "\n")
    check = _log_check(logs, offsets, SCENARIOS["gpu_oom"].error_codes)
    assert check.ok is False and "1 of 2" in check.text


def test_an_alert_active_before_the_fault_is_explained_as_such_not_as_a_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A miss whose alert already fired in the baseline (a host saturated by other work)
    says so: its peak crossed, its condition held, and neither is the fault's doing."""
    from types import SimpleNamespace

    from aivitals.alerts import AlertEvent
    from aivitals.validate import _runner

    rule = SimpleNamespace(alert="HostCPUSaturated", expr="x > 0.9", for_=5.0)
    labels = {"alertname": "HostCPUSaturated", "severity": "P1"}
    history: list[AlertEvent] = []

    def event(state: Any, at: float) -> AlertEvent:
        resolved = at if state == "resolved" else None
        return AlertEvent("HostCPUSaturated", labels, {}, state, 90.0, 95.0, resolved, 1.0)

    def in_range(start: float | None = None, end: float | None = None) -> list[AlertEvent]:
        return [
            e for e in history if (start is None or e.at >= start) and (end is None or e.at <= end)
        ]

    stack: Any = SimpleNamespace(
        engine=SimpleNamespace(groups=[SimpleNamespace(alerting_rules=[rule])], history=in_range)
    )
    monkeypatch.setattr(_runner, "_peak", lambda *a, **k: (0.5, 0.9, ">"))
    history += [event("pending", 90.0), event("firing", 95.0)]
    check = _runner._never_fired(stack, "HostCPUSaturated", 100.0, 130.0, 25.0)
    assert check.ok is False
    assert "already active when the fault began (since 10 s before it)" in check.text
    assert check.data == {"active_before_s": 10.0}
    # resolved before the fault: the usual explanation follows (here from the peak)
    history.append(event("resolved", 98.0))
    check = _runner._never_fired(stack, "HostCPUSaturated", 100.0, 130.0, 25.0)
    assert check.ok is False
    assert "never crossed the threshold (peak 0.5 <= 0.9)" in check.text


def test_a_misses_peak_reads_the_comparison_left_of_a_guard_and_its_arithmetic_bound() -> None:
    """InferenceLatencyHigh's P99 sits left of an ``and`` guard, against ``2 * SLA``: the
    miss still says how far the peak was from that bound."""
    from types import SimpleNamespace

    from aivitals.tsdb import Store
    from aivitals.validate._runner import _peak

    store = Store(retention=1e9)
    for i, v in enumerate([0.2, 0.3, 0.25]):
        store.append("p99", {"job": "svc"}, v, 100.0 + i)
    stack: Any = SimpleNamespace(
        agent=SimpleNamespace(store=store), config=SimpleNamespace(tick=1.0)
    )
    expr = "p99 > 2 * 0.19 and on (job) (count_over_time(p99[8s]) >= 100 or p99 offset 8s > 0.38)"
    assert _peak(stack, expr, 100.0, 102.0) == (0.3, 0.38, ">")
    assert _peak(stack, "(p99 < 0.25)", 100.0, 102.0) == (0.2, 0.25, "<")
    assert _peak(stack, "p99 > on (job) other", 100.0, 102.0)[1] is None
