"""End to end: a real Prometheus holding a fault's data, diagnosed over its HTTP API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from aivitals.cli import cli
from aivitals.diagnose import corpus, diagnose
from aivitals.tsdb import PrometheusBackend
from tests._servers import prometheus, promtool

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
    with prometheus(data_dir=data) as prom:
        remote = diagnose(PrometheusBackend(prom.url), end=sc.end, window=900)
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
