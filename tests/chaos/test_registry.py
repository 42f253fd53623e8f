from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from aivitals.chaos import FAULT_TABLE, FAULTS, ChaosRunner, FaultContext, get_fault
from aivitals.cli import main
from aivitals.errors import AlreadyRunning, ConfigError, FaultError, FaultRefused

CONTRACT = [
    "gpu_memory_leak",
    "gpu_oom",
    "gpu_xid",
    "gpu_cotenant",
    "gpu_contention",
    "event_loop_blocked",
    "worker_pool_saturated",
    "connection_flood",
    "overlong_inputs",
    "malformed_inputs",
    "cache_stampede",
    "cpu_burn",
    "process_memory_leak",
    "disk_io_saturation",
    "network_loss",
    "network_latency",
    "redis_down",
    "traffic_surge",
    "cold_start",
    "timeouts_not_aborting",
    "slow_dependency",
    "thread_leak",
    "disk_fill",
]
#: Faults no signature knows: the diagnosis's generic ranking must find them.
UNKNOWN = {"slow_dependency", "thread_leak"}
#: Faults whose signature names the condition, not the fault.
RENAMED = {"disk_fill": "disk_full"}
RULES = Path(__file__).resolve().parents[2] / "src/aivitals/alerts/rules/aivitals-rules.yml"


def test_every_contract_fault_is_registered_with_a_table_row() -> None:
    assert sorted(FAULTS) == sorted(CONTRACT) == sorted(FAULT_TABLE)
    for name, cls in FAULTS.items():
        info = cls.info()
        assert info.layer in {"model", "service", "infrastructure", "business"}
        assert info.description
        if name in UNKNOWN:
            assert info.signature is None and info.suspects, name
        else:
            assert info.signature == RENAMED.get(name, name) and not info.suspects, name


def test_unknown_faults_have_no_signature_and_suspects_the_collectors_export() -> None:
    from aivitals import signals

    kb = RULES.parents[2] / "diagnose" / "signatures"
    ids = {
        sig["id"]
        for path in kb.glob("*.y*ml")
        for sig in (yaml.safe_load(path.read_text()) or [])
        if isinstance(sig, dict)
    }
    for name in UNKNOWN:
        assert name not in ids  # the knowledge base truly does not know it
        for metric in FAULT_TABLE[name].suspects:
            spec = signals.get(metric)  # a catalogue family, KeyError otherwise
            assert str(spec.layer) == FAULT_TABLE[name].layer, (name, metric, spec.layer)


def test_expected_alerts_exist_in_the_shipped_rule_pack() -> None:
    if not RULES.exists():
        pytest.skip("rule pack not present yet")
    doc = yaml.safe_load(RULES.read_text())
    names = {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}
    for info in FAULT_TABLE.values():
        assert set(info.alerts) <= names, (info.name, set(info.alerts) - names)


def test_every_fault_has_an_alert_or_says_why_not() -> None:
    for info in FAULT_TABLE.values():
        assert info.alerts or "No alert:" in info.description, info.name
    # delay outside the service: only the agent's blackbox probe can see it
    assert FAULT_TABLE["network_latency"].alerts == ("ProbeLatencyHigh",)


def test_layers_agree_with_the_diagnosis_knowledge_base() -> None:
    kb = RULES.parents[2] / "diagnose" / "signatures"
    if not kb.is_dir():
        pytest.skip("diagnosis signatures not present yet")
    for path in kb.glob("*.y*ml"):
        doc = yaml.safe_load(path.read_text())
        items = doc.get("signatures", []) if isinstance(doc, dict) else doc
        for sig in items or []:
            info = FAULT_TABLE.get(sig.get("id", ""))
            if info is not None:
                assert info.layer == sig.get("layer"), (info.name, info.layer, sig.get("layer"))


def test_unknown_fault_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown fault 'gpu_melt'.*cpu_burn"):
        get_fault("gpu_melt")


@pytest.mark.parametrize("duration", [-1, 0, math.nan, math.inf, 10_000])
def test_bad_durations_are_refused(duration: float) -> None:
    with pytest.raises(FaultRefused, match="duration"):
        get_fault("cpu_burn")(duration=duration)


def test_configured_maximum_duration(runner_factory) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FaultRefused, match="maximum 5s"):
        get_fault("cpu_burn")(duration=6, max_duration=5)
    with runner_factory(max_duration=5) as runner, pytest.raises(FaultRefused, match="maximum"):
        runner.start("cpu_burn", duration=6)


def test_bad_params_name_the_key() -> None:
    with pytest.raises(ConfigError, match="unknown params"):
        get_fault("cpu_burn")(duration=1, colour=3)
    with pytest.raises(ConfigError, match="percent=500"):
        get_fault("network_loss")(duration=1, percent=500)
    with pytest.raises(ConfigError, match="not a finite number"):
        get_fault("network_loss")(duration=1, percent="lots")


def test_non_loopback_targets_are_refused() -> None:
    with pytest.raises(FaultRefused, match="not on loopback"):
        FaultContext(target="http://10.1.2.3:8000")
    FaultContext(target="http://10.1.2.3:8000", allow_hosts=("10.1.2.3",))


def test_missing_context_is_refused_and_leaves_nothing(runner_factory) -> None:  # type: ignore[no-untyped-def]
    with runner_factory() as runner:
        with pytest.raises(FaultRefused, match="redis_port"):
            runner.start("redis_down", duration=5)
        with pytest.raises(FaultRefused, match="chaos_token"):
            runner.start("cold_start", duration=5)
        assert runner.run is not None and runner.run.journal.pending() == []


def test_a_fault_starts_only_through_a_runner() -> None:
    with pytest.raises(FaultError, match="ChaosRunner"):
        get_fault("cpu_burn")(duration=1).start(FaultContext())


def test_a_second_runner_is_refused(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    with runner_factory(), pytest.raises(AlreadyRunning, match="another chaos run"):
        ChaosRunner(FaultContext(), root=chaos_root, handle_signals=False).open()
    # Once the first is closed, the next may run.
    with runner_factory():
        pass


def test_cli_list_and_bad_input(capsys: pytest.CaptureFixture[str], chaos_root: Path) -> None:
    main(["chaos", "list"])
    out = capsys.readouterr().out
    assert all(name in out for name in CONTRACT)
    for argv, err in (
        (["chaos", "run", "gpu_melt", "--duration", "1s"], "ConfigError: unknown fault"),
        (["chaos", "run", "cpu_burn", "--duration", "-5s"], "FaultRefused:"),
        (["chaos", "run", "cpu_burn", "--duration", "2h"], "FaultRefused:"),
        (["chaos", "run", "cpu_burn", "--target", "http://8.8.8.8/"], "FaultRefused:"),
        (["chaos", "run", "cpu_burn", "-p", "percent=3"], "ConfigError:"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 1
        assert err in capsys.readouterr().err


def test_run_for_starts_waits_and_reverts(runner_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import time

    with runner_factory(FaultContext(sim_gpu_dir=tmp_path / "sim")) as runner:
        t0 = time.monotonic()
        ticks: list[float] = []
        done = runner.run_for(["gpu_xid"], duration=1.0, on_tick=ticks.append)
        assert 1.0 <= time.monotonic() - t0 < 5
        assert [a.name for a in done] == ["gpu_xid"] and done[0].stopped_at is not None
        assert ticks and runner.run.journal.pending() == []


def test_the_docs_fault_table_names_the_alerts_of_the_code_table() -> None:
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "chaos.md").read_text()
    for name, info in FAULT_TABLE.items():
        row = re.search(rf"\| `{name}` \|[^\n]*\| ([^|\n]*) \|\n", doc)
        assert row is not None, f"docs/chaos.md has no row for {name}"
        assert row.group(1).strip() == (", ".join(info.alerts) or "-"), name


def test_every_choice_value_says_what_it_touches_and_who_owns_it_after() -> None:
    for name, cls in FAULTS.items():
        assert cls.touches, f"{name}: no touches rows"
        for key, values in cls.choices.items():
            _, low, high = cls.params[key]
            assert set(values) == set(range(int(low), int(high) + 1)), (name, key)
            for v in values:
                rows = cls.touches_for(**{key: v})
                assert rows, f"{name}: nothing says what {key}={v} touches"
                assert all(r.touches and r.afterwards for r in rows)
        whens = {t.when for t in cls.touches}
        known = {""} | {f"{k}={v}" for k, vs in cls.choices.items() for v in vs}
        assert whens <= known, (name, whens - known)
    # the one fault that replaces a process someone else started says who owns it
    [kill] = get_fault("redis_down").touches_for(method=1)
    assert kill.processes and "owner" in kill.afterwards


def test_cli_list_prints_each_value_and_its_owner(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    main(["chaos", "list"])
    out = capsys.readouterr().out
    assert "method=1: kills the redis-server" in out
    assert "real=0:" in out and "completions=1:" in out
    assert out.count("afterwards:") == sum(len(c.touches) for c in FAULTS.values())
    main(["chaos", "list", "--json"])
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    touches = {t["when"]: t for t in rows["redis_down"]["touches"]}
    assert touches["method=1"]["starts_processes"] is True
    assert touches["method=0"]["starts_processes"] is False


def test_strict_columns_name_real_alerts_and_no_expected_one_twice() -> None:
    doc = yaml.safe_load(RULES.read_text())
    names = {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}
    for info in FAULT_TABLE.values():
        assert set(info.consequences) <= names, (info.name, set(info.consequences) - names)
        # an expected alert is checked as such; listing it as a consequence would hide a miss
        assert not set(info.consequences) & set(info.alerts), info.name
    hurting = {n for n, i in FAULT_TABLE.items() if i.hurts_clients}
    assert {"traffic_surge", "network_latency", "gpu_contention"} <= hurting
    # faults that only build up or that the service absorbs need not hurt
    assert not hurting & {"gpu_memory_leak", "process_memory_leak", "malformed_inputs"}


def test_every_allowed_consequence_states_its_mechanism() -> None:
    for info in FAULT_TABLE.values():
        assert set(info.reasons) == set(info.consequences), info.name
        for alert, reason in info.reasons.items():
            assert reason.strip() and "\n" not in reason, (info.name, alert)
    # the count the severity sweep's RESULT line prints as consequences=N
    assert sum(len(i.consequences) for i in FAULT_TABLE.values()) == 39
