"""The acceptance run: ``aivitals validate --quick`` on real Redis, the real demo
service and the agent, injecting faults through aivitals.chaos and checking
alerts, diagnosis, logs and resolve.

CI runs the scenarios that passed in two separate runs (docs/validate-report.md);
a scenario that misses once gets one retry, and every one must then pass.
The others are not yet caught by the alerts or the diagnosis; they are listed
in that report, not hidden here, and moving a fault into ``PROVEN`` is how it
joins CI.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aivitals.validate import SCENARIOS, hostable
from tests._servers import require_binary

#: Faults that ``validate --quick`` catches end to end (alerts + diagnosis + logs + resolve).
PROVEN = (
    "gpu_memory_leak",
    "gpu_oom",
    "gpu_xid",
    "gpu_cotenant",
    "worker_pool_saturated",
    "connection_flood",
    "overlong_inputs",
    "malformed_inputs",
    "cpu_burn",
    "process_memory_leak",
    "redis_down",
    "cold_start",
    "timeouts_not_aborting",
)


def test_proven_scenarios_exist() -> None:
    assert set(PROVEN) <= set(SCENARIOS)


def _run(tmp_path: Path, names: tuple[str, ...], tag: str) -> dict[str, list[str]]:
    """Run ``validate --quick`` on ``names``; the failed checks by fault."""
    from aivitals.cli import main

    report = tmp_path / f"validate-{tag}.json"
    argv = ["validate", "--quick", "--scenarios", ",".join(names)]
    argv += ["--report", str(report), "--workdir", str(tmp_path / f"w-{tag}")]
    try:
        main(argv)
    except SystemExit:
        pass  # the exit code says what the report says; the report is read below
    data = json.loads(report.read_text())
    ran = {s["fault"] for s in data["scenarios"] if s["skipped"] is None}
    assert ran == {n for n in names if hostable(SCENARIOS[n]) is None}
    return {
        s["fault"]: [c["text"] for c in s["checks"] if c["ok"] is False] or [s["error"]]
        for s in data["scenarios"]
        if s["skipped"] is None and not s["passed"]
    }


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_validate_quick_catches_the_proven_faults(tmp_path: Path) -> None:
    require_binary("redis-server")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    first = _run(tmp_path, PROVEN, "first")
    # End-to-end timing on a shared 2-core machine: a scenario that misses once
    # gets one more try on its own; missing twice fails, and both results show.
    second = _run(tmp_path, tuple(first), "retry") if first else {}
    assert not second, json.dumps({"first": first, "retry": second}, indent=1)
