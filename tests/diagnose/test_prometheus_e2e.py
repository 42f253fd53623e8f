"""End to end: a real Prometheus holding a fault's data, diagnosed over its HTTP API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from aivitals.cli import cli
from aivitals.diagnose import diagnose
from aivitals.tsdb import PrometheusBackend
from tests._servers import prometheus, promtool
from tests.diagnose import _corpus as corpus

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_diagnose_on_prometheus_names_the_fault_and_matches_the_embedded_store(
    tmp_path: Path,
) -> None:
    sc = corpus.scenario("gpu_memory_leak", seed=11, duration=900.0)
    om = tmp_path / "leak.om"
    om.write_text(corpus.to_openmetrics(sc))
    data = tmp_path / "data"
    res = promtool("tsdb", "create-blocks-from", "openmetrics", str(om), str(data))
    assert res.returncode == 0, res.stderr
    embedded = diagnose(corpus.to_store(sc), end=sc.end, window=900)  # type: ignore[arg-type]
    with prometheus(data_dir=data) as prom, PrometheusBackend(prom.url) as backend:
        remote = diagnose(backend, end=sc.end, window=900)
        out = CliRunner().invoke(
            cli,
            [
                "diagnose",
                "--prometheus",
                prom.url,
                "--at",
                str(sc.end),
                "--window",
                "15m",
                "--format",
                "json",
            ],
        )
        snap = tmp_path / "leak.aivsnap"
        saved = CliRunner().invoke(
            cli,
            [
                "snapshot",
                "--prometheus",
                prom.url,
                "--out",
                str(snap),
                "--at",
                str(sc.end),
                "--window",
                "15m",
            ],
        )
    assert out.exit_code == 0, out.output
    assert saved.exit_code == 0, saved.output
    from_file = CliRunner().invoke(
        cli, ["diagnose", "--snapshot", str(snap), "--window", "15m", "--format", "json"]
    )
    assert from_file.exit_code == 0, from_file.output
    assert json.loads(from_file.output)["findings"][0]["signature"] == "gpu_memory_leak"
    via_cli = json.loads(out.output)
    assert embedded.findings[0].signature == "gpu_memory_leak"
    assert remote.findings[0].signature == "gpu_memory_leak"
    assert via_cli["findings"][0]["signature"] == "gpu_memory_leak"
    assert via_cli["findings"][0]["title"] == embedded.findings[0].title
    high = {f.signature for f in embedded.findings if f.confidence >= 0.6}
    assert {f.signature for f in remote.findings if f.confidence >= 0.6} == high
    assert abs(remote.findings[0].confidence - embedded.findings[0].confidence) < 0.1


def test_diagnose_on_victoria_metrics_names_the_fault() -> None:
    import time

    import httpx

    from tests._servers import victoria_metrics

    # 25 minutes of data, 15 diagnosed: MetricsQL's changes() counts a series' first sample
    # as a change, so a window that starts with the data would see a model (re)load.
    sc = corpus.scenario("connection_flood", seed=12, duration=1500.0)
    lines = []
    for name, labels, ts, vals in corpus.samples(sc):
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        head = f"{name}{{{lab}}}" if lab else name
        lines += [
            f"{head} {v!r} {int(t * 1000)}" for t, v in zip(ts.tolist(), vals.tolist(), strict=True)
        ]
    with victoria_metrics() as vm:
        r = httpx.post(
            f"{vm.url}/api/v1/import/prometheus", content="\n".join(lines) + "\n", timeout=60.0
        )
        assert r.status_code == 204, r.text
        httpx.get(f"{vm.url}/internal/force_flush", timeout=30.0)
        deadline = time.monotonic() + 30
        with PrometheusBackend(vm.url) as backend:
            while time.monotonic() < deadline and not backend.query("up", sc.end).values():
                time.sleep(0.5)
            d = diagnose(backend, end=sc.end, window=900)
    assert d.findings[0].signature == "connection_flood"
