from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from aivitals.alerts import default_pack
from aivitals.cli import main
from aivitals.dashboards import (
    DASHBOARDS,
    alert_threshold,
    build_dashboards,
    configmaps_yaml,
    render_variables,
)
from aivitals.errors import ConfigError

sdk_models = pytest.importorskip("grafana_foundation_sdk.models.dashboard")
VALUES = {
    "node": ".*",
    "instance": ".*",
    "model": ".*",
    "gpu": ".*",
    "namespace": ".*",
    "pod": ".*",
    "__rate_interval": "1m",
    "datasource": "prometheus",
}


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    return build_dashboards()


def _queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (p["title"], t["expr"])
        for p in doc["panels"]
        if p["type"] != "row"
        for t in p.get("targets", [])
    ]


def test_the_six_dashboards_the_issue_names(docs: dict[str, dict[str, Any]]) -> None:
    assert set(docs) == {
        "aivitals-overview",
        "aivitals-model",
        "aivitals-queue",
        "aivitals-gpu",
        "aivitals-host",
        "aivitals-alerts",
    }
    titles = {p["title"] for d in docs.values() for p in d["panels"]}
    for needed in (
        "Request latency P50 / P95 / P99",
        "429 share (load shed)",
        "504 share (caller gave up)",
        "Errors by error code",
        "Requests per second",
        "Time to first token P50 / P99",
        "Time per output token P50 / P99",
        "GPU time vs wall time (P99)",
        "Tokens per second",
        "Input tokens per request",
        "Output tokens per request",
        "KV cache in use",
        "Queue length",
        "Worker pool busy share",
        "Memory per process",
        "Utilization",
        "Power draw and limit",
        "SM clock",
        "Throttle (clock event) reasons active",
        "Xid errors per code",
        "ECC errors and remapped rows",
        "CPU by mode (cores)",
        "Pressure stall (PSI)",
        "Disk await",
        "TCP retransmit share",
        "Open file descriptors share",
        "Firing alerts",
        "Not collected",
    ):
        assert needed in titles, needed


def test_schema_round_trip_through_the_sdk_models(docs: dict[str, dict[str, Any]]) -> None:
    """Grafana's schema as the SDK carries it (typed models generated from the
    dashboard kind's CUE): every key decodes into a model field and encodes back
    unchanged, so nothing is unknown, misspelt or of the wrong shape."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins

    register_default_plugins()
    for uid, doc in docs.items():
        text = json.dumps(doc, sort_keys=True)
        decoded = sdk_models.Dashboard.from_json(json.loads(text))
        again = json.loads(json.dumps(decoded, cls=JSONEncoder))
        assert json.dumps(again, sort_keys=True) == text, uid
        for panel in decoded.panels or []:
            if isinstance(panel, sdk_models.Panel) and panel.type_val != "text":
                # the Prometheus query model decoded, not an untyped dict
                assert all(type(t).__module__.endswith("prometheus") for t in panel.targets or [])


def test_structure_grafana_relies_on(docs: dict[str, dict[str, Any]]) -> None:
    for uid, doc in docs.items():
        assert 8 <= len(uid) <= 40 and doc["uid"] == uid
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), uid
        names = {v["name"] for v in doc["templating"]["list"]}
        pods = {"namespace", "pod"} if uid == "aivitals-gpu" else set()
        assert names == {"datasource", "node", "instance", "model", "gpu"} | pods
        for panel in doc["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, (uid, panel["title"])
            if panel["type"] not in ("row", "text"):
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                refs = [t["refId"] for t in panel["targets"]]
                assert len(refs) == len(set(refs)) and all(refs)
        for title, expr in _queries(doc):
            used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", expr))
            assert used <= names | {"__rate_interval"}, (uid, title, used)


def test_every_query_parses(docs: dict[str, dict[str, Any]]) -> None:
    count = 0
    for doc in docs.values():
        for title, expr in _queries(doc):
            try:
                promql_parser.parse(render_variables(expr, VALUES))
            except ValueError as exc:  # promql_parser raises ValueError with the position
                pytest.fail(f"{title}: {exc}\n{expr}")
            count += 1
    assert count > 50


def test_aliases_fill_the_same_panels(docs: dict[str, dict[str, Any]]) -> None:
    exprs: dict[str, str] = {}
    for doc in docs.values():
        for title, expr in _queries(doc):
            exprs[title] = exprs.get(title, "") + "\n" + expr
    assert "vllm:kv_cache_usage_perc" in exprs["KV cache in use"]
    assert "vllm:time_to_first_token_seconds_bucket" in exprs["Time to first token P50 / P99"]
    assert "tgi_request_duration_bucket" in exprs["Request latency P50 / P95 / P99"]
    assert "DCGM_FI_DEV_GPU_UTIL" in exprs["Utilization"]
    assert "DCGM_FI_DEV_XID_ERRORS" in exprs["Last Xid code (DCGM semantics)"]
    assert "nv_inference_pending_request_count" in exprs["Queue length"]


def test_thresholds_come_from_the_rule_pack() -> None:
    pack = default_pack(queue_limit=7, gpu_memory_ratio=0.8)
    docs = build_dashboards(pack)
    panels = {p["title"]: p for d in docs.values() for p in d["panels"]}
    steps = panels["Queue length"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == 7 and steps[-1]["color"] == "red"  # QueueBacklog is P0
    steps = panels["Memory used share"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps if s["value"] is not None] == [0.8]
    assert "GPUMemoryHigh" in panels["Memory used share"]["description"]
    # every alert a panel names exists in the pack and compares against a constant
    for spec in DASHBOARDS:
        for row in spec.rows:
            for panel in row.panels:
                if panel.alert:
                    alert_threshold(pack, panel.alert)
    assert alert_threshold(pack, "GPUUtilizationLow").op == "<"
    with pytest.raises(ConfigError, match="no alert"):
        alert_threshold(pack, "NoSuchAlert")
    with pytest.raises(ConfigError, match="no constant"):
        alert_threshold(pack, "ServiceMetricsAbsent")


def test_a_missing_metric_says_so(docs: dict[str, dict[str, Any]]) -> None:
    for uid, doc in docs.items():
        first = doc["panels"][0]
        assert first["title"] == "Not collected", uid
        expr = first["targets"][0]["expr"]
        assert "absent(" in expr
        for panel in doc["panels"][1:]:
            if panel["type"] in ("timeseries", "stat", "table", "heatmap"):
                assert panel["fieldConfig"]["defaults"]["noValue"].startswith("No data"), panel
    # an event counter has no series before its first event: its panel shows 0 instead,
    # and the coverage panel does not call a healthy service's missing errors "not collected"
    overview = docs["aivitals-overview"]["panels"][0]["targets"][0]["expr"]
    assert "absent(errors_total{" not in overview
    assert "absent(http_request_duration_seconds_count{" in overview
    gpu = docs["aivitals-gpu"]["panels"][0]["targets"][0]["expr"]
    assert "absent(gpu_xid_errors_total{" not in gpu
    assert 'absent(DCGM_FI_DEV_FB_USED{node=~"$node", instance=~"$instance"})' in gpu


def test_cli_export_and_configmaps(tmp_path: Path) -> None:
    main(
        ["dashboards", "export", "--out", str(tmp_path), "--configmaps", "--param", "queue_limit=9"]
    )
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "aivitals-overview.json" in files and "dashboards-configmaps.yaml" in files
    overview = json.loads((tmp_path / "aivitals-queue.json").read_text())
    queue = next(p for p in overview["panels"] if p["title"] == "Queue length")
    assert queue["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"] == 9
    maps = list(yaml.safe_load_all((tmp_path / "dashboards-configmaps.yaml").read_text()))
    assert len(maps) == 6
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    assert (
        configmaps_yaml(default_pack(queue_limit=9))
        == (tmp_path / "dashboards-configmaps.yaml").read_text()
    )


def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    with pytest.raises(SystemExit) as exit_info:
        main(["dashboards", "export", "--out", str(target)])
    assert exit_info.value.code == 1
    assert "ConfigError: --out" in capsys.readouterr().err
    assert target.read_text() == "keep me"
    with pytest.raises(SystemExit):
        main(["dashboards", "export", "--out", str(tmp_path / "d"), "--param", "nonsense=1"])
    assert "ConfigError" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_without_the_sdk_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    for name in list(sys.modules):
        if name.startswith("grafana_foundation_sdk"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "grafana_foundation_sdk", None)  # import fails
    with pytest.raises(SystemExit):
        main(["dashboards", "export", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "ConfigError: building dashboards needs grafana-foundation-sdk" in err
    assert not (tmp_path / "out").exists()
