"""The rule pack on the real promtool, and the embedded engine against Prometheus' evaluation.

Parity: ``promtool test rules`` runs Prometheus' own rule manager over the input
series. For every shipped unit test, the embedded engine (over the embedded
store) evaluates the whole pack at every evaluation step; its firing alerts,
labels and rendered annotations for every alert name at every step are written
as promtool expectations, and promtool must agree with all of them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from aivitals.alerts import default_pack
from aivitals.alerts._export import ExportTargets, export_pack
from aivitals.alerts._params import parse_duration
from aivitals.alerts._promtest import (
    FiringAlert,
    run_engine_on_test,
    run_promtool_tests,
    shipped_test_files,
)
from aivitals.tsdb import Store
from tests._servers import promtool, require_binary


def _docs() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, yaml.safe_load(p.read_text())) for p in shipped_test_files()]


def _store() -> Store:
    return Store(retention=1e9)


@pytest.mark.integration
def test_promtool_catches_a_changed_threshold() -> None:
    # The shipped tests pass on promtool (test_cli runs `aivitals rules test`); they are
    # not vacuous either: a pack with another queue limit fails them.
    require_binary("promtool")
    result = run_promtool_tests(default_pack(queue_limit=40).text)
    assert not result.ok
    assert "QueueBacklog" in result.output


@pytest.mark.integration
def test_the_exported_pack_and_configs_pass_promtool_checks(tmp_path: Path) -> None:
    pack = default_pack(sla_seconds=0.25, queue_limit=50, baseline_window="30m")
    export_pack(pack, tmp_path, ExportTargets(service_targets=("127.0.0.1:8001",)))
    rules = promtool("check", "rules", str(tmp_path / "aivitals-rules.yml"))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "83 rules found" in rules.stdout
    config = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert config.returncode == 0, config.stdout + config.stderr
    text = (tmp_path / "aivitals-rules.yml").read_text()
    assert "> 2 * 0.25" in text and "queue_length > 50" in text and "[30m] offset 3m" in text


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for _, doc in _docs():
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    names = set(default_pack().alert_names)
    assert names - fires == set(), "alerts without a test where they fire"
    assert names - silent == set(), "alerts without a test where they stay silent"


@functools.cache
def _engine_runs(path: Path) -> list[dict[tuple[float, str], list[FiringAlert]]]:
    """The engine's firing alerts for every alert name at every step of each test in ``path``."""
    doc = yaml.safe_load(path.read_text())
    groups = default_pack().groups
    names = default_pack().alert_names
    interval = parse_duration(str(doc["evaluation_interval"]))
    return [
        run_engine_on_test(
            test,
            groups,
            evaluation_interval=interval,
            backend_factory=_store,
            alertnames=names,
            until=max(parse_duration(str(c["eval_time"])) for c in test["alert_rule_test"]),
        )
        for test in doc["tests"]
    ]


@pytest.mark.slow
def test_the_engine_agrees_with_every_expectation_of_the_unit_tests() -> None:
    checked = 0
    for path, doc in _docs():
        for test, got in zip(doc["tests"], _engine_runs(path), strict=True):
            for case in test["alert_rule_test"]:
                t = parse_duration(str(case["eval_time"]))
                want = sorted(
                    (
                        sorted({k: str(v) for k, v in a["exp_labels"].items()}.items()),
                        sorted(a.get("exp_annotations", {}).items()),
                    )
                    for a in case.get("exp_alerts") or []
                )
                have = sorted(
                    (sorted(a.labels.items()), sorted(a.annotations.items()))
                    for a in got[(t, case["alertname"])]
                )
                assert have == want, f"{path.name}: {test['name']}: {case['alertname']} at {t}s"
                checked += 1
    assert checked > 60


def _parity_file(path: Path, doc: dict[str, Any]) -> tuple[dict[str, Any], int]:
    tests = []
    firing = 0
    for test, got in zip(doc["tests"], _engine_runs(path), strict=True):
        cases = []
        for (t, name), alerts in sorted(got.items()):
            firing += len(alerts)
            cases.append(
                {
                    "eval_time": f"{int(t)}s",
                    "alertname": name,
                    "exp_alerts": [
                        {"exp_labels": a.labels, "exp_annotations": a.annotations} for a in alerts
                    ],
                }
            )
        tests.append({**test, "alert_rule_test": cases})
    body = {
        "rule_files": ["aivitals-rules.yml"],
        "evaluation_interval": doc["evaluation_interval"],
        "tests": tests,
    }
    return body, firing


@pytest.mark.integration
@pytest.mark.slow
def test_parity_every_alert_at_every_evaluation_step_matches_prometheus(tmp_path: Path) -> None:
    require_binary("promtool")
    files = []
    total_firing = 0
    for path, doc in _docs():
        body, firing = _parity_file(path, doc)
        total_firing += firing
        out = tmp_path / path.name.replace(".test.yml", ".parity.test.yml")
        out.write_text(json.dumps(body))
        files.append(out)
    result = run_promtool_tests(default_pack().text, files)
    assert result.ok, result.output[-5000:]
    # the comparison covered real alerts, not only silence
    assert total_firing > 500
