"""benchmarks/transfer.py: every case counted as caught, missed or not tested, per service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests._paths import load_script

transfer = load_script("benchmarks/transfer.py", "transfer")


def _case(name: str, *, passed: bool = True, skipped: str | None = None,
          error: str | None = None, false: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    checks: list[dict[str, Any]] = [] if skipped else [
        {"name": "impact", "ok": True, "data": {}},
        {"name": "diagnosis", "ok": passed, "data": {}},
        {"name": "other_alerts", "ok": False if false else None,
         "data": {"false_paging": false or []}},
    ]  # fmt: skip
    return {"fault": name, "passed": passed and not skipped and not error, "skipped": skipped,
            "error": error, "checks": checks}  # fmt: skip


def test_each_case_is_caught_missed_or_not_tested_and_false_pages_are_counted() -> None:
    demo = {"scenarios": [_case("cpu_burn"), _case("gpu_oom", passed=False)]}
    wsgi = {
        "scenarios": [
            _case("cpu_burn"),
            _case("traffic_surge", passed=False, false=["ServiceNotReady"]),
            _case("gpu_oom", skipped="GPU fault: no GPU"),
            _case("network_loss", error="revert failed"),
        ]
    }
    s = transfer.summarize({"demo": demo, "wsgi": wsgi, "bento": "no report (exit 2)"})
    w = s["services"]["wsgi"]
    assert (w["caught"], w["tested"], w["not_tested"]) == (1, 3, 1)
    outcomes = {c["case"]: c["outcome"] for c in w["cases"]}
    assert outcomes == {"cpu_burn": "caught", "traffic_surge": "missed",
                        "gpu_oom": "not_tested", "network_loss": "missed"}  # fmt: skip
    assert w["false_p0p1"] == ["ServiceNotReady"]
    # the reason of each miss and of each case not tested is kept
    why = {c["case"]: c["why"] for c in w["cases"]}
    assert why["gpu_oom"] == "GPU fault: no GPU" and why["network_loss"] == "revert failed"
    assert "diagnosis" in why["traffic_surge"]
    line = transfer.result_line(s)
    assert line == (
        "RESULT demo_caught=1/2 wsgi_caught=1/3 bento_caught=n/a not_tested=1 false_p0p1=1 errors=1"
    )


def test_a_service_that_was_not_run_is_not_a_zero() -> None:
    s = transfer.summarize({"wsgi": {"scenarios": [_case("cpu_burn")]}})
    assert transfer.result_line(s).startswith("RESULT demo_caught=n/a wsgi_caught=1/1 ")


def test_reports_are_read_back_and_a_bad_one_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "demo.json"
    good.write_text(json.dumps({"scenarios": [_case("cpu_burn")]}))
    bad = tmp_path / "wsgi.json"
    bad.write_text("{not json")
    out = tmp_path / "transfer.json"
    rc = transfer.main(["--from-reports", f"demo={good}", f"wsgi={bad}", "--output", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "RESULT demo_caught=1/1 wsgi_caught=n/a bento_caught=n/a" in printed
    assert "errors=1" in printed and "wsgi: ERROR" in printed
    assert json.loads(out.read_text())["errors"][0].startswith("wsgi: ")


def test_an_unknown_service_is_refused() -> None:
    with pytest.raises(SystemExit):
        transfer.main(["--services", "demo,vllm"])
    with pytest.raises(SystemExit):
        transfer.main(["--from-reports", "tgi=x.json"])
