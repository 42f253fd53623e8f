"""The severity sweep's table, the reached check on a real store, and the sweep's summary."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aivitals.chaos import FAULT_TABLE, get_fault
from aivitals.demo import IN_PROCESS_FAULTS
from aivitals.errors import ConfigError
from aivitals.tsdb import Store
from aivitals.validate import SCENARIOS
from aivitals.validate._severity import (
    SEVERITIES,
    SINGLE,
    _asked,
    beyond_reach,
    knob,
    magnitude,
    reached,
    severities,
    severity_params,
    severity_table,
    summarize_sweep,
)
from tests._paths import load_script

REPO = Path(__file__).resolve().parents[2]
MIB = float(1 << 20)

#: faults whose moderate is not twice the threshold, and why (each knob says so too)
CAPPED = {
    "gpu_cotenant": "twice the share does not fit beside the weights",
    "connection_flood": "a share of the fd limit cannot pass 1",
}
#: faults whose scenario asks less than moderate: the knob sets severe, and why
RAISED = {
    "gpu_cotenant": "the most that fits beside the weights",
    "connection_flood": "the fd limit",
    "gpu_contention": "twice moderate's factor",
    "cpu_burn": "twice moderate's demand",
}
#: faults with one magnitude: the sweep runs them once
SINGLES = {
    "gpu_xid",
    "gpu_oom",
    "redis_down",
    "cold_start",
    "disk_io_saturation",
    "worker_pool_saturated",
    "timeouts_not_aborting",
    "slow_dependency",
    "thread_leak",
    "disk_fill",
}


def _defaults(fault: str) -> dict[str, float]:
    cls = get_fault(fault)
    remote = getattr(cls, "remote", None)
    spec = IN_PROCESS_FAULTS[remote].params if remote else cls.params
    return {k: v[0] for k, v in spec.items()}


def test_every_graded_fault_has_three_severities_and_the_others_one() -> None:
    assert set(FAULT_TABLE) == set(SCENARIOS)
    assert {f for f in SCENARIOS if severities(f) == (SINGLE,)} == SINGLES
    for fault in SCENARIOS:
        assert severities(fault) == ((SINGLE,) if fault in SINGLES else SEVERITIES)
        for quick in (True, False):
            got = [severity_params(fault, sev, quick=quick) for sev in severities(fault)]
            assert all(isinstance(p, dict) for p in got), fault


def test_a_sweep_runs_a_single_magnitude_fault_once() -> None:
    from aivitals.validate import ValidateConfig
    from aivitals.validate._runner import cases_of

    names = [c.name for c in cases_of(ValidateConfig(quick=True, sweep=True))]
    assert len(names) == len(set(names)) == 3 * (len(SCENARIOS) - len(SINGLES)) + len(SINGLES)
    assert "gpu_xid@single" in names and "gpu_xid@threshold" not in names
    burn = [n for n in names if n.startswith("cpu_burn@")]
    assert burn == ["cpu_burn@threshold", "cpu_burn@moderate", "cpu_burn@severe"]
    named = cases_of(ValidateConfig(scenarios=("gpu_oom", "network_loss"), sweep=True))
    assert [c.name for c in named] == [
        "gpu_oom@single",
        "network_loss@threshold",
        "network_loss@moderate",
        "network_loss@severe",
    ]


def test_the_sweeps_list_says_which_faults_run_once() -> None:
    from click.testing import CliRunner

    from aivitals.cli import cli

    out = CliRunner().invoke(cli, ["validate", "--sweep", "--list"]).output
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert set(lines) == set(SCENARIOS)  # a sweep runs no pair unless named
    assert lines["gpu_xid"].endswith("(once, at single)")
    assert lines["network_loss"].endswith("(at threshold, moderate, severe)")


@pytest.mark.parametrize("quick", [True, False])
def test_severe_is_todays_scenario_unless_the_knob_sets_it(quick: bool) -> None:
    for fault, s in SCENARIOS.items():
        if fault in SINGLES:
            continue
        today = {**_defaults(fault), **(s.quick_params if quick else s.params)}
        severe = severity_params(fault, "severe", quick=quick)
        if fault not in RAISED:
            assert severe == today, fault
            continue
        assert severe == {**today, **knob(fault).severe} and knob(fault).note, fault
        if fault in CAPPED:
            continue  # severe is the limit, the most the system can take
        # the scenario, tuned for a plain run, asks less than moderate here
        moderate = severity_params(fault, "moderate", quick=quick)
        assert (magnitude(fault, today) or 0.0) < (magnitude(fault, moderate) or 0.0), fault


@pytest.mark.parametrize("quick", [True, False])
def test_severe_is_at_least_moderate_and_moderate_at_least_threshold(quick: bool) -> None:
    graded = [f for f in SCENARIOS if f not in SINGLES]
    for fault in graded:
        params = [severity_params(fault, sev, quick=quick) for sev in SEVERITIES]
        sizes = [magnitude(fault, p) for p in params]
        assert None not in sizes, fault
        th, mod, sev = (float(x or 0.0) for x in sizes)
        assert th <= mod <= sev, (fault, sizes)
        # and what ``reached`` asks of each run (a loop past saturation asks a figure)
        asked = [_asked(fault, s, p, 60.0) for s, p in zip(SEVERITIES, params, strict=True)]
        assert asked[0] <= asked[1] <= asked[2], (fault, asked)  # type: ignore[operator]
    # by each knob's meaning: the larger the factor, share or count the worse, and the
    # shorter the stampede's interval
    for fault in ("gpu_cotenant", "gpu_contention", "connection_flood", "event_loop_blocked"):
        p = knob(fault).param or ""
        vals = [severity_params(fault, sev, quick=quick)[p] for sev in SEVERITIES]
        assert vals[0] < vals[1] < vals[2], (fault, vals)
    vals = [severity_params("cache_stampede", sev, quick=quick)["interval"] for sev in SEVERITIES]
    assert vals[0] > vals[1] > vals[2]
    burn = [severity_params("cpu_burn", sev, quick=quick) for sev in SEVERITIES]
    cpus = os.cpu_count() or 1
    demand = [(b["workers"] or cpus) * b["load"] for b in burn]
    assert demand[0] < demand[1] < demand[2], demand


def test_a_surge_on_a_larger_pool_is_still_severe_past_moderate() -> None:
    # 200 fresh inputs/s: today's x10 (full) offers less than moderate's load there
    big = {"workers": 2, "embeddings_rps": 200.0, "completion_s": 0.1}
    params = [
        severity_params("traffic_surge", sev, quick=False, capacity=big) for sev in SEVERITIES
    ]
    loads = [magnitude("traffic_surge", p, big) for p in params]
    assert loads[0] <= loads[1] <= loads[2], loads
    assert params[2]["factor"] > 10
    # on the nominal pool it is today's
    assert severity_params("traffic_surge", "severe", quick=False)["factor"] == 10


@pytest.mark.parametrize("quick", [True, False])
def test_params_are_accepted_by_the_fault(quick: bool) -> None:
    for fault in SCENARIOS:
        cls = get_fault(fault)
        remote = getattr(cls, "remote", None)
        for sev in severities(fault):
            params = severity_params(fault, sev, quick=quick)
            if remote is None:
                cls(duration=10.0, **params)  # the class checks names and ranges
                continue
            spec = IN_PROCESS_FAULTS[remote].params  # the service checks these
            assert set(params) <= set(spec), (fault, sev)
            for key, value in params.items():
                low, high = spec[key][1], spec[key][2]
                assert low <= value <= high, f"{fault}@{sev}: {key}={value} not in [{low}, {high}]"


def test_moderate_is_twice_the_threshold() -> None:
    graded = [f for f in SCENARIOS if knob(f).param is not None]
    assert len(graded) == 13
    for fault in graded:
        k = knob(fault)
        th = magnitude(fault, severity_params(fault, "threshold", quick=True))
        mod = magnitude(fault, severity_params(fault, "moderate", quick=True))
        assert th is not None and mod is not None and k.bound is not None
        # the threshold crosses the knowledge's bound, and only just (one step of the
        # parameter, or a bound the fault cannot go below)
        assert th >= k.bound * (1 - 1e-9), fault
        assert th <= k.bound * 1.06, (fault, th, k.bound)
        if fault in CAPPED:
            assert mod < 2 * th and k.note, fault
            continue
        # twice the magnitude, within the parameter's rounding
        assert mod / th == pytest.approx(2.0, rel=0.06), (fault, th, mod)


def test_derivations_follow_the_knowledge() -> None:
    # the examples: a leak of 2e6 B/s at validate's 4 requests/s, P99 over
    # 2 x the 0.25 s SLA at ~0.1 s a call, 5 % loss, 100 ms each way
    leak = severity_params("gpu_memory_leak", "threshold", quick=True)["mib_per_request"]
    assert leak * MIB * 4 == pytest.approx(2e6, rel=0.02) and leak * MIB * 4 >= 2e6
    assert severity_params("gpu_contention", "threshold", quick=True)["factor"] == 5.0
    assert severity_params("network_loss", "threshold", quick=True)["percent"] == 5
    assert severity_params("network_loss", "moderate", quick=True)["percent"] == 10
    assert severity_params("network_latency", "threshold", quick=True)["delay_ms"] == 100
    # 90 % of the 24 GiB sim device minus 14 GiB of weights
    assert severity_params("gpu_cotenant", "threshold", quick=True)["share"] == 0.32
    # 80 % of the stack's 2200 fds
    assert severity_params("connection_flood", "threshold", quick=True)["connections"] == 1760
    # 16 inputs cycled at 2/s: a flush every 16 s halves the hit ratio, every 8 s empties it
    assert severity_params("cache_stampede", "threshold", quick=True)["interval"] == 16.0
    assert severity_params("cache_stampede", "moderate", quick=True)["interval"] == 8.0
    # the M/D/1 model gives 0.5 s outside the model at the threshold's sleep
    loop = severity_params("event_loop_blocked", "threshold", quick=True)["seconds"]
    assert magnitude("event_loop_blocked", {"seconds": loop}) == pytest.approx(0.5, rel=0.01)
    assert math.isinf(magnitude("event_loop_blocked", {"seconds": 0.3}) or 0.0)
    # capped knobs: severe at the limit, moderate halfway to it
    cotenant = [severity_params("gpu_cotenant", s, quick=True)["share"] for s in SEVERITIES]
    assert cotenant == [0.32, 0.36, 0.40]
    flood = [severity_params("connection_flood", s, quick=True)["connections"] for s in SEVERITIES]
    assert flood == [1760, 1980, 2200]
    # the contention factor: x5 crosses 2 x SLA, x10 twice it, x20 twice moderate
    factors = [severity_params("gpu_contention", s, quick=True)["factor"] for s in SEVERITIES]
    assert factors == [5.0, 10.0, 20.0]


def test_one_magnitude_faults_run_todays_values_once() -> None:
    for fault in SINGLES:
        assert knob(fault).param is None
        for quick in (True, False):
            s = SCENARIOS[fault]
            today = {**_defaults(fault), **(s.quick_params if quick else s.params)}
            assert severity_params(fault, SINGLE, quick=quick) == today, fault
        # never three runs of the same values under three names
        for sev in SEVERITIES:
            with pytest.raises(ConfigError, match=f"{fault} runs at single, not '{sev}'"):
                severity_params(fault, sev, quick=True)
    with pytest.raises(ConfigError, match="network_loss runs at threshold, moderate, severe"):
        severity_params("network_loss", SINGLE, quick=True)


def test_unknown_names_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="no severity table for fault 'nope'"):
        severity_params("nope", "threshold", quick=True)
    with pytest.raises(ConfigError, match="unknown severity 'extreme'"):
        severity_params("gpu_oom", "extreme", quick=True)
    with pytest.raises(ConfigError, match="unknown severity"):
        reached(_stack(Store()), "gpu_oom", "mild", {}, quick=True, t_fault=0.0, t_end=1.0)
    with pytest.raises(ConfigError, match="no severity table"):
        reached(_stack(Store()), "nope", "severe", {}, quick=True, t_fault=0.0, t_end=1.0)


def test_the_table_has_a_row_per_fault() -> None:
    rows = severity_table(quick=True)
    assert [r["fault"] for r in rows] == list(SCENARIOS)
    assert all(r["source"] for r in rows)
    by = {r["fault"]: r for r in rows}
    assert by["gpu_xid"]["severities"] == ["single"] and "threshold" not in by["gpu_xid"]
    assert by["gpu_contention"]["severe"] == {"factor": 20.0}


# -- reached, on a real store ------------------------------------------------------------
T0 = 1_000_000.0


def _stack(store: Store, tick: float = 1.0) -> Any:
    # what reached() reads of validate's stack: the agent's store and the tick
    return SimpleNamespace(agent=SimpleNamespace(store=store), config=SimpleNamespace(tick=tick))


def _fill(
    store: Store, name: str, labels: dict[str, str], fn: Any, start: float, end: float
) -> None:
    t = start
    while t <= end:
        value = fn(t)
        if value is not None:
            store.append(name, labels, value, t)
        t += 1.0


def _leak_store(bytes_per_s: float) -> Store:
    store = Store()
    base = 15e9
    _fill(
        store,
        "gpu_process_memory_used_bytes",
        {"pid": "42", "gpu": "0"},
        lambda t: base + max(0.0, t - T0) * bytes_per_s,
        T0 - 30,
        T0 + 40,
    )
    return store


def test_reached_a_leak() -> None:
    params = severity_params("gpu_memory_leak", "threshold", quick=True)
    check = reached(
        _stack(_leak_store(2.2e6)),
        "gpu_memory_leak",
        "threshold",
        params,
        quick=True,
        t_fault=T0,
        t_end=T0 + 40,
    )
    assert check is not None and check.ok is True, check
    assert check.data["achieved"] == pytest.approx(2.2e6, rel=0.02)
    assert check.data["asked"] == pytest.approx(0.48 * MIB * 4)


def test_a_leak_too_slow_is_not_reached() -> None:
    params = severity_params("gpu_memory_leak", "moderate", quick=True)
    check = reached(
        _stack(_leak_store(1.0e6)),
        "gpu_memory_leak",
        "moderate",
        params,
        quick=True,
        t_fault=T0,
        t_end=T0 + 40,
    )
    assert check is not None and check.ok is False
    assert "could not reach the moderate magnitude on this machine: achieved 1.00 MB/s" in (
        check.text
    )


def test_nothing_to_measure_is_said() -> None:
    check = reached(
        _stack(Store()),
        "gpu_memory_leak",
        "severe",
        {"mib_per_request": 48},
        quick=True,
        t_fault=T0,
        t_end=T0 + 40,
    )
    assert check is not None and check.ok is None
    assert "no gpu_process_memory_used_bytes series" in check.text
    # a fault whose magnitude the agent does not collect at all
    assert (
        reached(_stack(Store()), "disk_fill", SINGLE, {}, quick=True, t_fault=T0, t_end=T0 + 40)
        is None
    )


def _loss_store(ratio: float) -> Store:
    store = Store()
    # 200 segments/s on the host, 20 of them on loopback: 180 on real links
    _fill(
        store, "host_tcp_out_segments_total", {}, lambda t: 200.0 * (t - T0 + 100), T0 - 30, T0 + 30
    )
    _fill(
        store,
        "host_network_transmit_packets_total",
        {"interface": "lo"},
        lambda t: 20.0 * (t - T0 + 100),
        T0 - 30,
        T0 + 30,
    )
    _fill(
        store,
        "host_tcp_retransmitted_segments_total",
        {},
        lambda t: 180.0 * ratio * max(0.0, t - T0),
        T0 - 30,
        T0 + 30,
    )
    return store


@pytest.mark.parametrize("ratio", [0.06, 0.02])
def test_a_loss_ratio_is_reported_not_judged(ratio: float) -> None:
    # TCPRetransmitsHigh's ratio under-reads the packets dropped: the value is given
    params = severity_params("network_loss", "threshold", quick=True)
    check = reached(
        _stack(_loss_store(ratio)),
        "network_loss",
        "threshold",
        params,
        quick=True,
        t_fault=T0,
        t_end=T0 + 30,
    )
    assert check is not None and check.ok is None, check
    assert check.data["achieved"] == pytest.approx(ratio, rel=0.1)
    assert "not judged" in check.text and "pure ACKs" in check.text


def _rejections_store(refused_per_s: float) -> Store:
    store = Store()
    # validate's 4 requests/s plus the fault's, of which every one is refused
    _fill(
        store,
        "http_request_duration_seconds_count",
        {"job": "demo", "route": "/v1/x"},
        lambda t: 4.0 * (t - T0 + 100) + refused_per_s * max(0.0, t - T0),
        T0 - 30,
        T0 + 30,
    )
    _fill(
        store,
        "input_rejections_total",
        {"job": "demo", "reason": "INPUT_TOO_LARGE"},
        lambda t: refused_per_s * max(0.0, t - T0),
        T0 - 30,
        T0 + 30,
    )
    return store


@pytest.mark.parametrize(("refused", "ok"), [(0.25, True), (0.1, False)])
def test_reached_a_refused_share(refused: float, ok: bool) -> None:
    params = severity_params("overlong_inputs", "threshold", quick=True)  # 0.22/s
    check = reached(
        _stack(_rejections_store(refused)),
        "overlong_inputs",
        "threshold",
        params,
        quick=True,
        t_fault=T0,
        t_end=T0 + 30,
    )
    assert check is not None and check.ok is ok, check
    assert check.data["achieved"] == pytest.approx(refused / (4 + refused), rel=0.1)


def test_an_event_fault_needs_its_event() -> None:
    store = Store()
    _fill(store, "gpu_xid_errors_total", {"gpu": "0", "xid": "79"}, lambda t: 1.0, T0 + 2, T0 + 20)
    check = reached(
        _stack(store), "gpu_xid", SINGLE, {"code": 79}, quick=True, t_fault=T0, t_end=T0 + 20
    )
    assert check is not None and check.ok is True and check.data["achieved"] == 1.0
    # the Xid never reached the collector: the fault did not happen here
    check = reached(
        _stack(Store()), "gpu_xid", SINGLE, {"code": 79}, quick=True, t_fault=T0, t_end=T0 + 20
    )
    assert check is not None and check.ok is False and "achieved 0" in check.text


def test_cpu_busy_share_caps_the_moderate_demand() -> None:
    store = Store()
    # two CPUs, each 95 % busy during the fault (idle 0.05 s/s), 30 % before
    for cpu in ("0", "1"):
        _fill(
            store,
            "host_cpu_seconds_total",
            {"cpu": cpu, "mode": "idle"},
            lambda t: 0.7 * (t - T0 + 100) if t < T0 else 70 + 0.05 * (t - T0),
            T0 - 30,
            T0 + 30,
        )
        _fill(
            store,
            "host_cpu_seconds_total",
            {"cpu": cpu, "mode": "user"},
            lambda t: 0.3 * (t - T0 + 100) if t < T0 else 30 + 0.95 * (t - T0),
            T0 - 30,
            T0 + 30,
        )
    params = severity_params("cpu_burn", "moderate", quick=True)
    check = reached(
        _stack(store), "cpu_burn", "moderate", params, quick=True, t_fault=T0, t_end=T0 + 30
    )
    # moderate asks twice the CPUs' worth of work: a busy share can show at most all of it
    assert check is not None and check.ok is True and check.data["asked"] == 1.0
    assert check.data["achieved"] == pytest.approx(0.95, abs=0.02)


# -- the sweep's summary -----------------------------------------------------------------
def _case(
    fault: str,
    sev: str,
    *,
    alerts: dict[str, float | None],
    diag: float | None,
    reached_ok: bool | None = True,
    false: tuple[str, ...] = (),
    length: float = 30.0,
    skipped: str | None = None,
) -> dict[str, Any]:
    checks: list[dict[str, Any]] = [
        {
            "name": f"alert:{a}",
            "ok": after is not None,
            "text": "",
            "data": {} if after is None else {"after_s": after},
        }
        for a, after in alerts.items()
    ]
    checks.append(
        {
            "name": "diagnosis",
            "ok": diag is not None,
            "text": "",
            "data": {} if diag is None else {"after_s": diag, "stable_share": 1.0},
        }
    )
    if false:
        checks.append(
            {
                "name": "other_alerts",
                "ok": False,
                "text": "",
                "data": {"alerts": list(false), "false_paging": list(false)},
            }
        )
    checks.append({"name": "severity", "ok": reached_ok, "text": "", "data": {}})
    return {
        "fault": f"{fault}@{sev}",
        "faults": [fault],
        "severity": sev,
        "skipped": skipped,
        "error": None,
        "checks": [] if skipped else checks,
        "t_fault": 100.0,
        "t_revert": 100.0 + length,
    }


def _report() -> dict[str, Any]:
    return {
        "quick": True,
        "scenarios": [
            _case("network_loss", "threshold", alerts={"TCPRetransmitsHigh": None}, diag=12.0),
            _case("network_loss", "moderate", alerts={"TCPRetransmitsHigh": 9.0}, diag=6.0),
            _case(
                "network_loss",
                "severe",
                alerts={"TCPRetransmitsHigh": 4.0},
                diag=5.0,
                false=("HostCPUSaturated",),
            ),
            _case(
                "gpu_contention",
                "threshold",
                alerts={"InferenceLatencyHigh": None},
                diag=None,
                reached_ok=False,
            ),
            _case("gpu_contention", "moderate", alerts={"InferenceLatencyHigh": 20.0}, diag=None),
            _case("gpu_contention", "severe", alerts={"InferenceLatencyHigh": 7.0}, diag=3.0),
            _case("redis_down", "severe", alerts={}, diag=None, skipped="needs redis-server"),
            # a pair beside the sweep is not a sweep case
            {"fault": "cpu_burn+gpu_memory_leak", "severity": None, "checks": []},
        ],
    }


def test_summarize_sweep() -> None:
    got = summarize_sweep(_report())
    assert got["not_reached"] == 1 and got["not_tested"] == 1 and got["ran"] == 6
    # threshold: network_loss missed, contention did not reach it: both count, neither
    # caught; the skipped redis_down (one magnitude: single) is not tested
    assert got["caught"] == {"threshold": 0.0, "moderate": 0.5, "severe": 1.0, "single": None}
    assert got["by_severity"]["threshold"] == {
        "caught": 0,
        "tested": 2,
        "not_tested": 0,
        "error": 0,
        "not_reached": 1,
        "missed": 1,
        "diagnosis_only": 0,
    }
    assert got["by_severity"]["single"]["not_tested"] == 1
    assert got["consequences"] == sum(len(i.consequences) for i in FAULT_TABLE.values())
    # first alerts of the caught cases: 9, 4, 7
    assert got["ttd_p50_s"] == 7.0 and got["ttd_p90_s"] == pytest.approx(8.6)
    # one false P0/P1 alert over 6 x 30 s of fault phase
    assert got["false_p0p1_per_h"] == pytest.approx(1 / (180 / 3600))
    by = {c["case"]: c for c in got["cases"]}
    assert by["network_loss@moderate"]["finding_s"] == 6.0
    assert by["gpu_contention@moderate"]["outcome"] == "missed"  # the diagnosis missed
    assert by["gpu_contention@threshold"]["outcome"] == "not reached"
    assert by["redis_down@severe"]["severity"] == SINGLE
    assert by["redis_down@severe"]["outcome"] == "not tested"


def test_every_case_run_counts() -> None:
    rep = {
        "quick": True,
        "scenarios": [
            _case("gpu_contention", "severe", alerts={"InferenceLatencyHigh": 5.0}, diag=4.0),
            # a crash is an error: tested, not caught, never dropped
            _case("cpu_burn", "severe", alerts={"HostCPUSaturated": None}, diag=None),
            # caught, but short of its magnitude: not reached, out of caught
            _case(
                "network_latency",
                "severe",
                alerts={"ProbeLatencyHigh": 6.0},
                diag=9.0,
                reached_ok=False,
            ),
            # no alert to test: the diagnosis alone named it
            _case("slow_dependency", SINGLE, alerts={}, diag=5.0),
        ],
    }
    rep["scenarios"][1]["error"] = "RuntimeError: the stack died"
    got = summarize_sweep(rep)
    assert [c["outcome"] for c in got["cases"]] == [
        "caught",
        "error",
        "not reached",
        "diagnosis only",
    ]
    assert got["caught"]["severe"] == pytest.approx(1 / 3) and got["caught"]["single"] == 0.0
    assert got["errors"] == 1 and got["not_reached"] == 1 and got["diagnosis_only"] == 1
    assert got["ttd_p50_s"] == 5.0  # over the caught case only
    line = _benchmark().result_line(got)
    assert "caught_severe=0.33 " in line and "cases_severe=1/3/0" in line
    assert "errors=1 " in line and "cases_single=0/1/0" in line


def test_an_earlier_results_file_is_counted_again() -> None:
    # what a results file held before outcomes were kept: whether each case was caught
    def old(case: str, caught: bool | None, **more: Any) -> dict[str, Any]:
        fault, sev = case.split("@")
        row = {"case": case, "fault": fault, "severity": sev, "skipped": None, "error": None}
        row.update(caught=caught, first_alert_s=None, finding_s=None, reached=True)
        row.update(false_p0p1=[], beyond_reach=[])
        return {**row, **more}

    earlier = {
        "result": "RESULT caught_moderate=1.00 ...",
        "summary": {
            "fault_hours": 0.5,
            "cases": [
                # both alerts out of reach: only the diagnosis was tested
                old(
                    "gpu_memory_leak@threshold",
                    True,
                    finding_s=40.0,
                    beyond_reach=["GPUMemoryHigh", "GPUProcessMemoryGrowth"],
                ),
                # caught, but short of its magnitude
                old(
                    "overlong_inputs@threshold",
                    True,
                    first_alert_s=9.0,
                    finding_s=11.0,
                    reached=False,
                ),
                # the diagnosis named it, so an alert missed
                old("connection_flood@threshold", False, finding_s=5.0),
                # one magnitude, run under three names
                *(old(f"gpu_xid@{s}", True, first_alert_s=1.0, finding_s=5.0) for s in SEVERITIES),
            ],
        },
    }
    got = summarize_sweep(earlier)
    outcomes = {(c["case"], c["severity"]): c["outcome"] for c in got["cases"]}
    assert outcomes == {
        ("gpu_memory_leak@threshold", "threshold"): "diagnosis only",
        ("overlong_inputs@threshold", "threshold"): "not reached",
        ("connection_flood@threshold", "threshold"): "missed",
        ("gpu_xid@threshold", SINGLE): "caught",
        ("gpu_xid@moderate", SINGLE): "caught",
        ("gpu_xid@severe", SINGLE): "caught",
    }
    assert [c["ran_as"] for c in got["cases"][3:]] == list(SEVERITIES)
    assert got["caught"]["threshold"] == 0.0 and got["caught"]["single"] == 1.0
    assert got["fault_hours"] == 0.5  # the old cases carry no phase length: the total
    # counting the answer again changes nothing
    again = summarize_sweep({"summary": got})
    assert [c["outcome"] for c in again["cases"]] == [c["outcome"] for c in got["cases"]]
    assert again["caught"] == got["caught"]


def test_summarize_an_interrupted_sweep() -> None:
    # Ctrl-C in gpu_contention@severe: that case is neither caught nor missed
    rep = _report()
    rep["interrupted"] = True
    rep["scenarios"][5]["error"] = "interrupted"
    got = summarize_sweep(rep)
    assert got["interrupted"] is True and got["ran"] == 5 and got["not_tested"] == 2
    assert got["caught"]["severe"] == 1.0  # network_loss@severe only
    assert summarize_sweep(_report())["interrupted"] is False


def test_summarize_sweep_bad_input() -> None:
    with pytest.raises(ConfigError, match="not a validate report"):
        summarize_sweep({"cases": []})
    with pytest.raises(ConfigError, match="no sweep case"):
        summarize_sweep({"scenarios": [{"fault": "gpu_oom", "severity": None}]})
    bad = _report()
    bad["scenarios"][0]["severity"] = "extreme"
    with pytest.raises(ConfigError, match="unknown severity 'extreme'"):
        summarize_sweep(bad)


def _benchmark() -> Any:
    # benchmarks/ is not a package: load the script as a module
    return load_script("benchmarks/detection_sweep.py", "detection_sweep")


def test_benchmark_result_line(tmp_path: Path) -> None:
    bench = _benchmark()
    line = bench.result_line(summarize_sweep(_report()))
    n = sum(len(i.consequences) for i in FAULT_TABLE.values())
    assert line == (
        "RESULT caught_moderate=0.50 caught_severe=1.00 caught_threshold=0.00 "
        f"not_reached=1 diagnosis_only=0 consequences={n} ttd_p50_s=7.0 ttd_p90_s=8.6 "
        "false_p0p1_per_h=20.0 caught_single=n/a errors=0 cases_threshold=0/2/0 "
        "cases_moderate=1/2/0 cases_severe=2/2/0 cases_single=0/0/1"
    )


def test_benchmark_from_report(tmp_path: Path) -> None:
    report = tmp_path / "sweep.json"
    report.write_text(json.dumps(_report()))
    out = tmp_path / "out.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "detection_sweep.py"),
            "--from-report",
            str(report),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "RESULT caught_moderate=0.50" in run.stdout
    assert "gpu_contention" in run.stdout and "not reached" in run.stdout
    assert json.loads(out.read_text())["summary"]["not_reached"] == 1
    # a results file is counted again, and says what it read before
    again = tmp_path / "again.json"
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "detection_sweep.py"),
            "--from-report",
            str(out),
            "--output",
            str(again),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    written = json.loads(again.read_text())
    assert written["previous_result"].startswith("RESULT caught_moderate=0.50")
    assert written["counted_from"] == str(out) and written["report"] == str(report)
    assert written["result"] == json.loads(out.read_text())["result"]
    # bad input: a file that is not a report says so and exits 2
    (tmp_path / "bad.json").write_text("[1, 2]")
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "detection_sweep.py"),
            "--from-report",
            str(tmp_path / "bad.json"),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2 and "not a validate report" in run.stderr


def test_a_leak_that_hit_its_bound_is_measured_until_then() -> None:
    # 1 MiB a request at 4 requests/s, capped by max_mib=60 after ~15 s of a 40 s phase
    params = {"mib_per_request": 1.0, "max_mib": 60.0}
    rate = MIB * 4
    store = Store()
    _fill(
        store,
        "service_process_resident_memory_bytes",
        {"pid": "7"},
        lambda t: 5e8 + min(60 * MIB, max(0.0, t - T0) * rate),
        T0 - 30,
        T0 + 40,
    )
    check = reached(
        _stack(store),
        "process_memory_leak",
        "severe",
        params,
        quick=True,
        t_fault=T0,
        t_end=T0 + 40,
    )
    assert check is not None and check.ok is True, check
    assert check.data["achieved"] == pytest.approx(rate, rel=0.05)


def test_a_reload_at_the_injections_first_tick_is_counted() -> None:
    """The agent samples off the injection's instant: the first sample after it already
    holds the new load time. The range must reach the sample before the fault."""
    store = Store()
    _fill(
        store,
        "model_load_time_seconds",
        {"model": "m"},
        lambda t: 2.0 if t < T0 + 0.5 else 1.5,
        T0 - 29.4,  # samples at T0 - 0.4, T0 + 0.6, ...
        T0 + 31,
    )
    check = reached(
        _stack(store), "cold_start", SINGLE, {}, quick=True, t_fault=T0 + 0.1, t_end=T0 + 30.3
    )
    assert check is not None and check.ok is True, check
    assert check.data["achieved"] == 1.0


#: pools as ``calibrate_capacity`` measures them: a loaded 2-core machine (30 fresh
#: embeddings/s saturated), the same machine quiet (47/s), a machine twice as fast
POOLS = [
    {"workers": 2, "embeddings_rps": 30.0, "completion_s": 0.123},
    {"workers": 2, "embeddings_rps": 47.0, "completion_s": 0.1},
    {"workers": 2, "embeddings_rps": 94.0, "completion_s": 0.05},
]


@pytest.mark.parametrize("pool", POOLS)
def test_a_surge_is_sized_against_the_measured_pool(pool: dict[str, float]) -> None:
    """HTTP429RateHigh's 5 % is just crossed at 1/0.95 of the pool's capacity: the
    threshold surge offers that (one 0.1 step of the factor over it), the moderate
    twice it, whatever the machine's speed."""
    limit = knob("traffic_surge").bound
    assert limit == pytest.approx(1 / 0.95)
    th = severity_params("traffic_surge", "threshold", quick=True, capacity=pool)
    mod = severity_params("traffic_surge", "moderate", quick=True, capacity=pool)
    load_th = magnitude("traffic_surge", th, pool)
    load_mod = magnitude("traffic_surge", mod, pool)
    assert load_th is not None and load_mod is not None
    step = 0.1 * 10 * 2 / pool["embeddings_rps"] / 2  # 0.1 of the factor, as load
    assert limit <= load_th <= limit + step + 1e-9, (pool, th, load_th)
    assert 2 * limit <= load_mod <= 2 * limit + step + 1e-9, (pool, mod, load_mod)
    # by hand at 30/s: a completion takes 0.123 s of a worker, an input 2/30 s; the
    # surge adds factor x 10 inputs/s to validate's 2 completions/s
    if pool["embeddings_rps"] == 30.0:
        assert th["factor"] == 2.8 and mod["factor"] == 6.0
        assert load_th == pytest.approx((2 * 0.123 + 28 * 2 / 30) / 2)
    # a faster pool needs a bigger surge for the same load
    assert severity_params("traffic_surge", "severe", quick=True, capacity=pool) == (
        severity_params("traffic_surge", "severe", quick=True)
    )


def test_a_pool_too_slow_for_the_smallest_surge_runs_the_floor() -> None:
    slow = {"workers": 2, "embeddings_rps": 8.0, "completion_s": 0.3}
    th = severity_params("traffic_surge", "threshold", quick=True, capacity=slow)
    assert th["factor"] == get_fault("traffic_surge").params["factor"][1] == 1.1
    load = magnitude("traffic_surge", th, slow)
    assert load is not None and load > 1.5 * knob("traffic_surge").bound  # said, not hidden
    assert "smallest surge is factor 1.1" in knob("traffic_surge").note


def _surge_store(embeddings_per_s: float, hits_per_s: float) -> Store:
    store = Store()
    counters = (
        ("http_request_duration_seconds_count", {"route": "/v1/completions", "status": "200"}, 2.0),
        ("http_request_duration_seconds_count", {"route": "/v1/embeddings", "status": "200"}, 2.0),
        ("cache_requests_total", {"cache": "embeddings", "result": "hit"}, 2.0),
    )
    for name, labels, calm in counters:
        during = hits_per_s if name == "cache_requests_total" else calm
        _fill(
            store,
            name,
            {"job": "demo", **labels},
            lambda t, calm=calm, during=during: (
                calm * (t - T0 + 30) + (during - calm) * max(0.0, t - T0)
            ),
            T0 - 30,
            T0 + 30,
        )
    # the surge: answered and refused alike arrived
    for status, share in (("200", 0.6), ("429", 0.4)):
        _fill(
            store,
            "http_request_duration_seconds_count",
            {"job": "demo", "route": "/v1/embeddings", "status": status, "surge": "1"},
            lambda t, share=share: share * embeddings_per_s * max(0.0, t - T0),
            T0 - 30,
            T0 + 30,
        )
    return store


@pytest.mark.parametrize(("surge", "ok"), [(30.0, True), (20.0, False)])
def test_reached_a_surge_counts_what_arrived_less_the_cache_hits(surge: float, ok: bool) -> None:
    pool = POOLS[0]
    params = severity_params("traffic_surge", "threshold", quick=True, capacity=pool)  # 28/s
    check = reached(
        _stack(_surge_store(surge, 0.5)),
        "traffic_surge",
        "threshold",
        params,
        quick=True,
        t_fault=T0,
        t_end=T0 + 30,
        capacity=pool,
    )
    assert check is not None and check.ok is ok, check
    # 2 completions/s x 0.123 s, and (2 + surge - 0.5 hits) inputs/s x 2/30 s, on 2 workers
    assert check.data["achieved"] == pytest.approx((2 * 0.123 + (1.5 + surge) / 15) / 2, rel=0.05)
    assert check.data["unit"].startswith("offered load")
    if not ok:
        assert check.text == (
            "could not reach the threshold magnitude on this machine: achieved x0.84, "
            "asked x1.06 (offered load on the worker pool (x its measured capacity))"
        )


def _packs() -> tuple[Any, Any]:
    from aivitals.alerts import PackParams
    from aivitals.demo import QUICK_RULES
    from aivitals.validate._runner import _demo_rule_params

    return PackParams(**{**QUICK_RULES, **_demo_rule_params()}), PackParams(**_demo_rule_params())


def test_a_slow_leaks_bytes_are_beyond_its_alerts_reach_in_a_quick_phase() -> None:
    quick, full = _packs()
    for sev in ("threshold", "moderate"):
        params = severity_params("gpu_memory_leak", sev, quick=True)
        got = beyond_reach("gpu_memory_leak", sev, params, pack=quick, fault_s=60.0)
        # 1 GiB over 10 s is 107 MB/s; the device's 90 % is 8.2 GB above the weights
        assert set(got) == {"GPUProcessMemoryGrowth", "GPUMemoryHigh"}, got
        assert "(107 MB/s)" in got["GPUProcessMemoryGrowth"]
        assert "8.2 GB more than the weights" in got["GPUMemoryHigh"]
    # severe is today's scenario: every expected alert is expected
    severe = severity_params("gpu_memory_leak", "severe", quick=True)
    assert beyond_reach("gpu_memory_leak", "severe", severe, pack=quick, fault_s=60.0) == {}
    # full length, moderate (4 MB/s): 1 GiB over 30 m is 0.6 MB/s, and the device's 90 %
    # is 34 minutes away, within a phase of 40 but not of 30
    moderate = severity_params("gpu_memory_leak", "moderate", quick=False)
    assert beyond_reach("gpu_memory_leak", "moderate", moderate, pack=full, fault_s=2400.0) == {}
    assert set(
        beyond_reach("gpu_memory_leak", "moderate", moderate, pack=full, fault_s=1800.0)
    ) == {"GPUMemoryHigh"}
    # other faults' alerts judge a rate or a share, which the sweep sizes them to cross
    loss = severity_params("network_loss", "threshold", quick=True)
    assert beyond_reach("network_loss", "threshold", loss, pack=quick, fault_s=60.0) == {}
    with pytest.raises(ConfigError, match="unknown severity"):
        beyond_reach("gpu_memory_leak", "mild", severe, pack=quick, fault_s=60.0)


def test_an_alert_beyond_reach_is_neither_caught_nor_missed() -> None:
    case = _case("gpu_memory_leak", "moderate", alerts={}, diag=27.0)
    case["checks"].insert(0, {"name": "beyond_reach:GPUMemoryHigh", "ok": None, "text": ""})
    got = summarize_sweep({"quick": True, "scenarios": [case]})
    (row,) = got["cases"]
    # no alert was tested: diagnosis only, reported apart from caught
    assert row["outcome"] == "diagnosis only" and row["caught"] is False
    assert row["beyond_reach"] == ["GPUMemoryHigh"] and got["diagnosis_only"] == 1
    assert row["first_alert_s"] is None and row["finding_s"] == 27.0
    assert got["caught"]["moderate"] == 0.0
    (line,) = _benchmark().table(got)[1:]
    assert "diagnosis only" in line and line.endswith("yes  out of reach: GPUMemoryHigh"), line
    # the diagnosis must still name it
    missed = _case("gpu_memory_leak", "moderate", alerts={}, diag=None)
    got = summarize_sweep({"quick": True, "scenarios": [missed]})
    assert got["cases"][0]["outcome"] == "missed"
