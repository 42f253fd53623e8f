"""The acceptance run: ``aivitals validate --quick`` on real Redis, the real demo
service and the agent, injecting faults through aivitals.chaos and checking
alerts, diagnosis, logs and resolve.

CI runs one fault of each layer (model, service, business, infrastructure), once, with
validate's strict checks and no retry, and a miss of any of them fails CI; every fault and
the validated pairs are the benchmark's to run (``benchmarks/flake.py``, N times each),
since all 25 cases take 18 minutes of CI's 45. The checks: the clients'
impact, every expected alert firing within its deadline, no paging alert the fault table
does not list, the diagnosis (named first at the end of the fault phase and on every poll
after it first did), logs, revert, resolve, an error-free run and nothing left behind
(benchmarks/results/runs/validate-report.md lists the outcome of every run; how each check
came to be enforced is in docs/history.md). Every case is recorded (``--record`` under the
test's temp dir) so that a measured miss can be replayed afterwards. The run is also
accounted for: it leaves the machine's processes, network namespaces, nft tables and temp
dirs as they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aivitals.validate import SCENARIOS, hostable
from aivitals.validate._cases import PAIRS
from aivitals.validate._runner import FAULT_CASE_CACHE_TTL_S
from tests._servers import require_binary

#: Every fault of the chaos table, then the pairs: what benchmarks/flake.py runs.
ALL = (*SCENARIOS, *("+".join(p) for p in PAIRS))


def _first_of_each_layer() -> tuple[str, ...]:
    """The first fault of each layer in the chaos table's order: a rule fixed in advance,
    so CI's subset is not a pick of the steadiest cases."""
    from aivitals.chaos import FAULT_TABLE

    first: dict[str, str] = {}
    for name, row in FAULT_TABLE.items():
        first.setdefault(row.layer, name)
    return tuple(first.values())


#: What CI runs; the ones this machine cannot host are skipped by validate itself (and
#: checked to be exactly those).
CI_CASES = _first_of_each_layer()


def test_every_fault_of_the_chaos_table_has_a_scenario() -> None:
    from aivitals.chaos import FAULT_TABLE

    assert {n for n in ALL if "+" not in n} == set(FAULT_TABLE)


def _recordings(tmp_path: Path, tag: str) -> Path:
    return tmp_path / f"recordings-{tag}"


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
    # recorded (snapshots of every case's window, about 0.2 MB a case) so that a measured
    # miss can be replayed and explained after the run: the path is printed with it
    argv = cli("validate", "--quick", "--scenarios", ",".join(names), "--report", str(report),
               "--record", str(_recordings(tmp_path, tag)))  # fmt: skip
    before = Machine.now()
    outcome = run_as_user(dirs, [{"argv": argv, "timeout": 1200}], timeout=1300)
    assert outcome.codes[0] in (0, 1), outcome.output[-4000:]  # 1: a check failed (below)
    data = json.loads(report.read_text())
    env = data["environment"]
    assert env["cache_ttl_s"] == FAULT_CASE_CACHE_TTL_S  # no key expires on its own
    outcome.extra_ports |= {int(u.rsplit(":", 1)[1].split("/")[0]) for u in
                            (env["service"], env["redis"]) if u}  # fmt: skip
    left = leftovers(before, outcome, dirs)
    assert not left, f"validate --quick left behind: {left}"
    ran = {s["fault"] for s in data["scenarios"] if s["skipped"] is None}
    hostable_here = {n for n in names if all(hostable(SCENARIOS[f]) is None for f in n.split("+"))}
    assert ran == hostable_here
    # every case that ran left its recording (the label beside its snapshot)
    recorded = {p.stem for p in _recordings(tmp_path, tag).glob("*.aivsnap")}
    assert recorded == ran, recorded ^ ran
    return {
        s["fault"]: [c for c in s["checks"] if c["ok"] is False]
        or [{"name": "error", "text": s["error"], "data": {}}]
        for s in data["scenarios"]
        if s["skipped"] is None and not s["passed"]
    }


#: Checks CI would measure and report without enforcing them: none now (the diagnosis
#: was the last, docs/history.md). The mechanism stays for a check that is new: measured
#: first, enforced once it holds run after run.
MEASURED: tuple[str, ...] = ()


def _measured_only(check: dict[str, object]) -> bool:
    """Measured, printed on the terminal, not enforced: the check above. Enforced: the
    clients' impact where the fault must hurt them, every expected alert (``alert:<Name>``)
    firing within its deadline, no paging alert the fault table does not list, the error
    logs, the revert, every fired alert resolving, the service staying alive, every case
    running without an error, and nothing left behind."""
    return str(check["name"]) in MEASURED


def test_ci_runs_one_fault_of_every_layer() -> None:
    from aivitals.chaos import FAULT_TABLE

    layers = [FAULT_TABLE[n].layer for n in CI_CASES]
    assert sorted(layers) == sorted({row.layer for row in FAULT_TABLE.values()})
    assert all(n in SCENARIOS for n in CI_CASES)


def test_every_strict_check_is_enforced() -> None:
    assert not _measured_only({"name": "alert:GPUMemoryHigh"})
    assert not _measured_only({"name": "impact"})
    assert not _measured_only({"name": "other_alerts"})
    assert not _measured_only({"name": "diagnosis"})


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1400)
def test_validate_quick_catches_one_fault_of_every_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_binary("redis-server")
    failed = _run(tmp_path, CI_CASES, "once")  # once: no retry
    enforced = {
        fault: [c["text"] for c in checks if not _measured_only(c)]
        for fault, checks in failed.items()
    }
    measured = {
        fault: [c["text"] for c in checks if _measured_only(c)] for fault, checks in failed.items()
    }
    if any(measured.values()):
        # said on the terminal, not as a warning (warnings are errors in this suite)
        with capsys.disabled():
            print(
                "\nstrict checks measured, not yet enforced in CI: "
                + json.dumps({f: t for f, t in measured.items() if t}, indent=1)
                + f"\nrecordings to replay them (aivitals.validate.load_recordings): "
                f"{_recordings(tmp_path, 'once')}"
            )
    assert not {f: t for f, t in enforced.items() if t}, json.dumps(enforced, indent=1)
