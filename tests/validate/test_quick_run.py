"""The acceptance run: ``aivitals validate --quick`` on real Redis, the real demo
service and the agent, injecting faults through aivitals.chaos and checking
alerts, diagnosis, logs and resolve.

CI runs every scenario this machine can host, and the validated pairs, once, with
validate's strict checks (docs/validate-report.md has the latest complete run): a
miss fails CI. There is no retry; how often a scenario misses is measured by
running validate repeatedly (benchmarks/detection_sweep.py, docs/validate-report.md),
not hidden here. The run is also accounted for: it leaves the machine's processes,
network namespaces, nft tables and temp dirs as they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aivitals.validate import SCENARIOS, hostable
from aivitals.validate._cases import PAIRS
from tests._servers import require_binary

#: Every fault of the chaos table, then the pairs; the ones this machine cannot host
#: are skipped by validate itself (and checked to be exactly those below).
ALL = (*SCENARIOS, *("+".join(p) for p in PAIRS))


def test_every_fault_of_the_chaos_table_has_a_scenario() -> None:
    from aivitals.chaos import FAULT_TABLE

    assert {n for n in ALL if "+" not in n} == set(FAULT_TABLE)


def _run(tmp_path: Path, names: tuple[str, ...], tag: str) -> dict[str, list[str]]:
    """Run ``validate --quick`` on ``names`` as a user does (the real CLI in a
    subprocess, under a child subreaper with its own TMPDIR, chaos root and lock);
    the failed checks by fault.

    It must leave the machine as it found it: no process of the run alive (none
    re-parented to the subreaper, none with its dirs, ports or run ids), no
    network namespace or nft table of its chaos run, no temp dir.
    """
    from tests.chaos._accounting import Dirs, Machine, cli, leftovers, run_as_user

    dirs = Dirs(tmp_path / f"acct-{tag}")
    report = tmp_path / f"validate-{tag}.json"
    argv = cli("validate", "--quick", "--scenarios", ",".join(names), "--report", str(report))
    before = Machine.now()
    outcome = run_as_user(dirs, [{"argv": argv, "timeout": 2200}], timeout=2300)
    assert outcome.codes[0] in (0, 1), outcome.output[-4000:]  # 1: a check failed (below)
    data = json.loads(report.read_text())
    env = data["environment"]
    outcome.extra_ports |= {int(u.rsplit(":", 1)[1].split("/")[0]) for u in
                            (env["service"], env["redis"]) if u}  # fmt: skip
    left = leftovers(before, outcome, dirs)
    assert not left, f"validate --quick left behind: {left}"
    ran = {s["fault"] for s in data["scenarios"] if s["skipped"] is None}
    hostable_here = {n for n in names if all(hostable(SCENARIOS[f]) is None for f in n.split("+"))}
    assert ran == hostable_here
    return {
        s["fault"]: [c["text"] for c in s["checks"] if c["ok"] is False] or [s["error"]]
        for s in data["scenarios"]
        if s["skipped"] is None and not s["passed"]
    }


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_validate_quick_catches_every_hostable_fault(tmp_path: Path) -> None:
    require_binary("redis-server")
    failed = _run(tmp_path, ALL, "once")
    assert not failed, json.dumps(failed, indent=1)
