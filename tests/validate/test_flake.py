"""benchmarks/flake.py: verdicts across runs, flips from the polls, crashes counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests._paths import load_script

flake = load_script("benchmarks/flake.py", "flake")


def _case(name: str, passed: bool, named: list[str], matched: list[bool]) -> dict[str, Any]:
    polls = [
        {"after_s": 3.0 * i, "matched": m, "named": f"{n} 0.80", "quiet": False}
        for i, (n, m) in enumerate(zip(named, matched, strict=True))
    ]
    return {
        "fault": name,
        "passed": passed,
        "checks": [
            {"name": "diagnosis", "ok": passed, "data": {"polls": polls}},
            {"name": "alert", "ok": True},
        ],
    }


def test_a_case_whose_verdict_changes_is_flaky_and_its_flips_are_counted(tmp_path: Path) -> None:
    steady = _case("cpu_burn", True, ["cpu_burn", "cpu_burn"], [True, True])
    flipped = _case(
        "network_latency",
        False,
        ["network_latency", "anomaly_service", "network_latency"],
        [True, False, True],
    )
    held = _case("network_latency", True, ["network_latency"] * 3, [True] * 3)
    skipped = {"fault": "network_loss", "skipped": "needs root", "checks": []}
    r1 = tmp_path / "r1.json"
    r1.write_text(json.dumps({"scenarios": [steady, flipped, skipped]}))
    r2 = tmp_path / "r2.json"
    r2.write_text(json.dumps({"scenarios": [steady, held, skipped]}))
    broken = tmp_path / "r3.json"
    broken.write_text("{not json")
    out = tmp_path / "flake.json"
    assert flake.main(["--from-reports", str(r1), str(r2), str(broken), "--output", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["runs"] == 3 and len(s["errors"]) == 1  # the broken report: counted, said
    assert s["cases"] == 3 and s["case_runs"] == 4  # the skipped case is in no ratio
    assert s["flaky"] == ["network_latency"]
    assert s["flip_rate"] == 2 / 4 and s["miss_rate"] == 1 / 4
    line = flake.result_line(s)
    assert line.startswith("RESULT runs=3 cases=3 flaky_cases=1 flip_rate=0.500")
