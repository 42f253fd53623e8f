"""The acceptance run: ``aivitals validate --quick`` over every fault this machine can host.

It starts real Redis, the real demo service and the agent, injects each fault
through aivitals.chaos and checks alerts, diagnosis, logs and resolve. It takes
minutes on two cores (see docs/validate.md), hence integration + slow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aivitals.validate import SCENARIOS, hostable
from tests._servers import require_binary


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_validate_quick_catches_every_hostable_fault(tmp_path: Path) -> None:
    from aivitals.cli import main

    require_binary("redis-server")
    report = tmp_path / "validate.json"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--quick", "--report", str(report), "--workdir", str(tmp_path / "w")])
        raise SystemExit(0)
    data = json.loads(report.read_text())
    ran = {s["fault"] for s in data["scenarios"] if s["skipped"] is None}
    assert ran == {n for n, s in SCENARIOS.items() if hostable(s) is None}
    failed = {
        s["fault"]: [c["text"] for c in s["checks"] if c["ok"] is False] or [s["error"]]
        for s in data["scenarios"]
        if s["skipped"] is None and not s["passed"]
    }
    assert not failed, json.dumps(failed, indent=1)
    assert exit_info.value.code == 0
