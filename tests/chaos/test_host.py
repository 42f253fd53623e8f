from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from aivitals.chaos import FaultContext
from tests.chaos.conftest import assert_clean, require_tool, run_processes
from tests.load._server import tiny_server


def _cpu_of(pids: list[int], seconds: float = 0.5) -> float:
    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for p in procs:
        p.cpu_percent(None)
    time.sleep(seconds)
    total = 0.0
    for p in procs:
        try:
            total += p.cpu_percent(None)
        except psutil.NoSuchProcess:
            continue
    return total


@pytest.mark.parametrize("tool", ["stress-ng", "python"])
def test_cpu_burn_burns_and_is_reverted(
    tool: str,
    runner_factory,
    chaos_root: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if tool == "stress-ng":
        require_tool("stress-ng")
    else:
        monkeypatch.setattr("aivitals.chaos._host.shutil.which", lambda name: None)
    with runner_factory() as runner:
        active = runner.start("cpu_burn", duration=20, workers=1)
        assert active.effect.details["tool"] == tool
        # One worker keeps about one core busy (the Python helper needs a moment to start;
        # the machine is shared, so a few tries).
        deadline = time.monotonic() + 10
        busy = 0.0
        while time.monotonic() < deadline and busy < 40.0:
            busy = _cpu_of(run_processes(runner.run.run_id))
        assert busy >= 40.0
        runner.stop(active)
        assert run_processes(runner.run.run_id) == []
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


@pytest.mark.parametrize("tool", ["fio", "python"])
def test_disk_io_writes_in_its_own_temp_dir_and_removes_it(  # type: ignore[no-untyped-def]
    tool: str, runner_factory, chaos_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if tool == "fio":
        require_tool("fio")
    else:
        monkeypatch.setattr("aivitals.chaos._host.shutil.which", lambda name: None)
    work = tmp_path / "disk"
    with runner_factory(FaultContext(work_dir=work)) as runner:
        active = runner.start("disk_io_saturation", duration=20, size_mib=8, jobs=1)
        target = Path(active.effect.details["dir"])
        assert target.parent == work and target.is_dir()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(f.stat().st_size for f in target.iterdir()):
            time.sleep(0.1)
        assert any(f.stat().st_size > 0 for f in target.iterdir())
        runner.stop(active)
        assert not target.exists()
        assert sum(f.stat().st_size for f in work.rglob("*") if f.is_file()) == 0
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_connection_flood_holds_idle_connections(runner_factory, chaos_root: Path) -> None:  # type: ignore[no-untyped-def]
    with tiny_server() as srv, runner_factory(FaultContext(target=srv.url)) as runner:
        active = runner.start("connection_flood", duration=20, connections=300)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and srv.connections < 300:
            time.sleep(0.1)
        assert srv.connections >= 300
        helper = psutil.Process(active.effect.details["pid"])
        assert helper.num_fds() >= 300
        runner.stop(active)
        assert not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)
