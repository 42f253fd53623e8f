from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from aivitals.cli import cli, main
from aivitals.diagnose import Diagnosis, diagnose
from aivitals.diagnose._report import daily_report
from aivitals.tsdb import Store
from tests.diagnose import _corpus as corpus


@functools.cache
def _leak() -> tuple[Any, Store, Diagnosis]:
    sc = corpus.scenario("gpu_memory_leak", seed=5, duration=600.0)
    store = corpus.to_store(sc)
    assert isinstance(store, Store)
    return sc, store, diagnose(store, end=sc.end, window=600, events=sc.events)


def test_json_round_trips_with_shape_findings_and_unseen() -> None:
    d = _leak()[2]
    data = json.loads(d.to_json())
    assert data["shape"] == str(d.shape)
    assert data["findings"][0]["signature"] == "gpu_memory_leak"
    assert {"evidence", "commands", "stop_loss", "confidence", "layer"} <= set(data["findings"][0])
    assert isinstance(data["unseen"], list)


def test_markdown_has_the_verdict_evidence_and_commands() -> None:
    md = _leak()[2].to_markdown()
    assert "## 1. GPU memory leak in pid 4242 on GPU 0" in md
    assert "[held] (required)" in md
    assert "py-spy dump --pid 4242" in md
    assert "## Timeline" in md


def test_html_is_self_contained_with_an_svg_timeline() -> None:
    page = _leak()[2].to_html()
    assert page.startswith("<!doctype html>")
    assert "<svg" in page and "<rect" in page
    assert not re.search(r"(src|href)=['\"]?https?:", page)
    assert "<script" not in page


def test_terminal_rendering_is_plain_text() -> None:
    text = _leak()[2].to_terminal()
    assert "GPU memory leak in pid 4242" in text
    assert "\x1b[" not in text


def test_cli_diagnose_a_snapshot_in_every_format(tmp_path: Path) -> None:
    _, store, _ = _leak()
    snap = tmp_path / "s.aivsnap"
    store.save(snap)
    runner = CliRunner()
    for fmt in ("terminal", "markdown", "json", "html"):
        out = tmp_path / f"d.{fmt}"
        res = runner.invoke(
            cli,
            [
                "diagnose",
                "--snapshot",
                str(snap),
                "--window",
                "10m",
                "--format",
                fmt,
                "--out",
                str(out),
            ],
        )
        assert res.exit_code == 0, res.output
        assert "gpu_memory_leak" in out.read_text() or "GPU memory leak" in out.read_text()


def test_cli_bad_inputs_exit_1_with_the_error_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = str(tmp_path / "x")
    cases = [
        (["diagnose", "--snapshot", str(tmp_path / "nope")], "no such file"),
        (["diagnose", "--snapshot", x, "--prometheus", "http://127.0.0.1:1"], "choose one"),
        (["diagnose", "--window", "soon", "--snapshot", x], "--window"),
        (["diagnose", "--snapshot", x], "StoreError"),
        (["snapshot", "--out", str(tmp_path / "o")], "exactly one"),
    ]
    (tmp_path / "x").write_text("not a snapshot")
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 1
        err = capsys.readouterr().err
        assert message in err and ("ConfigError" in err or "Error" in err)


def test_cli_diagnose_on_an_unreachable_prometheus_reports_what_it_could_not_see() -> None:
    res = CliRunner().invoke(
        cli,
        ["diagnose", "--prometheus", "http://127.0.0.1:9", "--format", "json", "--window", "5m"],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["unseen"]
    assert all(f["confidence"] < 0.5 for f in data["findings"])


def _daily_store() -> tuple[Store, float]:
    store = Store(retention=2 * 86400)
    t0 = 1_767_000_000.0
    for k in range(0, 86400, 300):
        t = t0 + k
        store.append("queue_length", {"queue": "q"}, 70.0 if k == 43200 else 3.0, t)
        store.append(
            "gpu_utilization_ratio",
            {"gpu": "0", "backend": "sim"},
            0.9 if (k // 300) % 2 else 0.1,
            t,
        )
        store.append("gpu_utilization_ratio", {"gpu": "1", "backend": "sim"}, 0.6, t)
        for route, per in (("/a", 1.0), ("/b", 3.0), ("/c", 2.0), ("/d", 0.5)):
            store.append(
                "http_request_duration_seconds_count",
                {"route": route, "status": "504", "status_class": "5xx", "method": "POST"},
                per * k / 300,
                t,
            )
    return store, t0 + 86100


def test_daily_report_marks_red_queue_yellow_stddev_and_top_504s() -> None:
    store, end = _daily_store()
    r = daily_report(store, end=end)
    assert r.peak_queue == 70.0 and r.peak_queue_red
    assert [route for route, _ in r.top_504] == ["/b", "/c", "/a"]
    assert r.gpu_util_yellow == ["0"]
    assert r.gpu_util_stddev["0"] == pytest.approx(40.0, abs=0.5)
    md = r.to_markdown()
    assert "**RED**" in md and "**YELLOW**" in md
    assert "color:#c00" in r.to_html()


def test_daily_report_cli_on_a_snapshot(tmp_path: Path) -> None:
    store, _ = _daily_store()
    snap = tmp_path / "day.aivsnap"
    store.save(snap)
    res = CliRunner().invoke(cli, ["report", "daily", "--snapshot", str(snap), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["peak_queue_red"] is True


def test_daily_report_on_an_empty_store_says_what_is_missing() -> None:
    r = daily_report(Store(), end=1_767_000_000.0)
    assert r.peak_queue is None and not r.peak_queue_red
    assert {u.what for u in r.unseen} >= {"queue_length", "gpu_utilization_ratio"}
