"""The fleet's configs and files, without starting anything: scrape configs with one node
label per node, the time-compressed pack, vmalert's copy of it, the receiver's file, and
the synthetic fleet's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aivitals.alerts import load_rules
from aivitals.errors import ConfigError
from aivitals.fleet import Fleet, FleetConfig, FleetNode, read_alerts
from aivitals.fleet._fleet import vmalert_rules
from aivitals.fleet._synth import RecordedShapes, SynthFleet

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "scenarios.csv"


def _fleet(tmp_path: Path, **kw: object) -> Fleet:
    f = Fleet(FleetConfig(nodes=2, workdir=tmp_path, state=tmp_path / "s.json", **kw))  # type: ignore[arg-type]
    f.nodes = [
        FleetNode(
            index=i,
            name=f"sim-node-{i}",
            service_port=9000 + i,
            agent_port=9100 + i,
            sim_gpu_dir=str(tmp_path / f"n{i}"),
            workdir=str(tmp_path),
        )
        for i in (1, 2)
    ]
    return f


def test_every_target_carries_its_node_label(tmp_path: Path) -> None:
    jobs = {c["job_name"]: c["static_configs"] for c in _fleet(tmp_path).scrape_configs()}
    assert set(jobs) == {"ai-service", "aivitals-agent"}
    assert jobs["ai-service"] == [
        {"targets": ["127.0.0.1:9001"], "labels": {"node": "sim-node-1"}},
        {"targets": ["127.0.0.1:9002"], "labels": {"node": "sim-node-2"}},
    ]
    assert jobs["aivitals-agent"][1] == {
        "targets": ["127.0.0.1:9102"],
        "labels": {"node": "sim-node-2"},
    }


def test_a_quick_fleet_loads_the_pack_with_short_windows_and_for(tmp_path: Path) -> None:
    quick = {
        r.alert: r for g in load_rules(_fleet(tmp_path).rule_pack_text()) for r in g.alerting_rules
    }
    real = {
        r.alert: r
        for g in load_rules(_fleet(tmp_path, quick=False).rule_pack_text())
        for r in g.alerting_rules
    }
    assert real["GPUProcessMemoryGrowth"].for_ == 600.0
    assert quick["GPUProcessMemoryGrowth"].for_ == 10.0  # 10m / 60
    assert "[10s]" in quick["GPUProcessMemoryGrowth"].expr  # leak_window of QUICK_RULES


def test_vmalert_gets_the_pack_without_keep_firing_for(tmp_path: Path) -> None:
    text = _fleet(tmp_path, quick=False).rule_pack_text()
    assert "keep_firing_for" in text
    stripped = vmalert_rules(text)
    assert "keep_firing_for" not in stripped
    before = sum(len(g["rules"]) for g in yaml.safe_load(text)["groups"])
    after = sum(len(g["rules"]) for g in yaml.safe_load(stripped)["groups"])
    assert before == after


def test_read_alerts_keeps_every_alert_and_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "alerts.jsonl"
    body = {"alerts": [{"labels": {"alertname": "A", "node": "sim-node-2"}, "status": "firing"}]}
    path.write_text(
        json.dumps({"received": 1.0, "body": body})
        + "\n"
        + json.dumps({"received": 2.0, "body": "not json from a sender"})
        + '\n{"received": 3.0, "bo'
    )
    got = read_alerts(path)
    assert got == [{**body["alerts"][0], "received": 1.0}]
    assert read_alerts(tmp_path / "none.jsonl") == []


def test_synthetic_fleet_refuses_what_it_cannot_build(tmp_path: Path) -> None:
    shapes = RecordedShapes.load(RECORDING)
    with pytest.raises(ConfigError, match="fault="):
        SynthFleet(shapes, nodes=2, gpus=1, fault="meteor", faulty_node=1, faulty_gpu=0)
    with pytest.raises(ConfigError, match="outside the fleet"):
        SynthFleet(shapes, nodes=2, gpus=1, faulty_node=3, faulty_gpu=0)
    bad = tmp_path / "x.csv"
    bad.write_text("t,phase,mem_used\n0,normal,1\n")
    with pytest.raises(ConfigError, match="phases"):
        RecordedShapes.load(bad)
    with pytest.raises(ConfigError, match="GPU recording"):
        RecordedShapes.load(tmp_path / "missing.csv")


def test_synthetic_series_follow_the_recording(tmp_path: Path) -> None:
    shapes = RecordedShapes.load(RECORDING)
    sf = SynthFleet(shapes, nodes=2, gpus=2, fault="gpu_memory_leak", faulty_node=2, faulty_gpu=1)
    mem = {
        (lab["node"], lab["gpu"]): v
        for name, lab, v in sf.series()
        if name == "gpu_process_memory_used_bytes"
    }
    leak = mem[("sim-node-2", "1")]
    assert leak[-1] > 10 * leak[0]  # the recorded leak: ~0.75 GB to ~44 GB
    assert abs(leak[-1] - shapes.leak["server_proc_mem"][-1]) / leak[-1] < 0.05
    flat = mem[("sim-node-1", "1")]
    assert flat.max() < 1.1 * shapes.normal["server_proc_mem"].max()
    lines = list(sf.import_lines())
    first = json.loads(lines[0])
    assert first["metric"]["__name__"] == "up" and len(first["values"]) == sf.points
