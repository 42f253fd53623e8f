from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from aivitals.chaos import FaultContext, get_fault
from tests.chaos.conftest import assert_clean, require_root, require_tool, run_processes
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


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


@pytest.mark.slow
def test_disk_fill_grows_log_files_to_its_bound_and_removes_them(  # type: ignore[no-untyped-def]
    runner_factory, chaos_root: Path, tmp_path: Path
) -> None:
    import json

    work = tmp_path / "disk"
    with runner_factory(FaultContext(work_dir=work)) as runner:
        active = runner.start("disk_fill", duration=30, mib_per_s=4, max_mib=3, volume_mib=0)
        target = Path(active.effect.details["dir"])
        assert target.parent == work and target.name.startswith("aivitals-chaos-")
        assert runner.run.journal.pending()[0]["path"] == str(target)  # journaled
        t0 = time.monotonic()
        mid = 0
        while time.monotonic() - t0 < 15 and _dir_bytes(target) < 3 << 20:
            mid = mid or (_dir_bytes(target) if time.monotonic() - t0 > 0.3 else 0)
            time.sleep(0.05)
        took = time.monotonic() - t0
        full = _dir_bytes(target)
        time.sleep(1.0)
        # full, and it stays at its bound: the writer holds, it does not go on
        assert full == _dir_bytes(target) == 3 << 20
        # at its pace: 3 MiB at 4 MiB/s take about 0.75 s, not a burst
        assert took >= 0.5 and 0 < mid < 3 << 20
        first = (target / "service.log.0").read_text().splitlines()[0]
        assert json.loads(first)["level"] == "ERROR"  # log lines, not random bytes
        runner.stop(active)
        assert not target.exists()
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_disk_fill_refuses_a_bound_the_filesystem_cannot_spare(  # type: ignore[no-untyped-def]
    runner_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from aivitals.errors import ConfigError, FaultRefused

    gib = 1 << 30
    fake = shutil._ntuple_diskusage(10 * gib, 8 * gib, 2 * gib)  # type: ignore[attr-defined]
    monkeypatch.setattr("aivitals.chaos._host.shutil.disk_usage", lambda path: fake)
    work = tmp_path / "disk"
    with runner_factory(FaultContext(work_dir=work)) as runner:
        with pytest.raises(FaultRefused, match=r"max_mib=1536 would leave 512 MiB free"):
            runner.start("disk_fill", duration=5, max_mib=1536, volume_mib=0)
        assert runner.run.journal.pending() == [] and not list(work.iterdir())
        active = runner.start("disk_fill", duration=5, max_mib=1, volume_mib=0)  # enough
        runner.stop(active)
        # as root, the volume's image is what the disk must spare
        monkeypatch.setattr("aivitals.chaos._host.os.geteuid", lambda: 0)
        monkeypatch.setattr("aivitals.chaos._host.shutil.which", lambda name: "/sbin/" + name)
        with pytest.raises(FaultRefused, match=r"volume_mib=1536 would leave 512 MiB free"):
            runner.start("disk_fill", duration=5, volume_mib=1536)
        assert runner.run.journal.pending() == [] and not list(work.iterdir())
    for bad, why in (
        ({"mib_per_s": 0}, "outside"),
        ({"max_mib": 10**6}, "outside"),
        ({"volume_mib": 10**5}, "outside"),
        ({"volume_mib": 4}, "too small for a filesystem"),
    ):
        with pytest.raises(ConfigError, match=why):
            get_fault("disk_fill")(duration=5, **bad)


def test_disk_fill_after_a_sigkill_is_removed_by_chaos_cleanup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import signal
    import subprocess
    import sys

    from aivitals.chaos import cleanup
    from aivitals.cli import main

    root, work = tmp_path / "runs", tmp_path / "work"
    env = dict(os.environ, AIVITALS_CHAOS_DIR=str(root))
    argv = [
        sys.executable, "-m", "aivitals.cli", "chaos", "run", "disk_fill", "--duration", "120s",
        "--work-dir", str(work), "-p", "max_mib=2", "-p", "volume_mib=0",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        run_id = ""
        for line in proc.stdout:
            run_id = line.split()[1] if line.startswith("run ") else run_id
            if line.startswith("started "):
                break
        assert run_id, "the runner did not start"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        logs = list(work.glob(f"aivitals-chaos-{run_id}-logs-*"))
        assert len(logs) == 1 and run_processes(run_id)  # the writer and its files outlive it
        monkeypatch.setenv("AIVITALS_CHAOS_DIR", str(root))
        main(["chaos", "cleanup"])
        assert f"cleaned {run_id}" in capsys.readouterr().out
        assert not logs[0].exists() and not list(work.iterdir())
        assert_clean(run_id, root)
    finally:
        proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
        cleanup(root, force=True)


def _mounted(path: str) -> str | None:
    """The filesystem type mounted on ``path``, or None."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[1] == path:
            return fields[2]
    return None


def _wait_full(path: str, within: float = 10.0) -> None:
    import os

    deadline = time.monotonic() + within
    while os.statvfs(path).f_bavail > 0 and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("fstype", ["ext4", "tmpfs"])
def test_disk_fill_fills_a_volume_of_its_own_and_unmounts_it_at_revert(  # type: ignore[no-untyped-def]
    fstype: str, runner_factory, chaos_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from aivitals.collect import HostCollector

    require_root()
    if fstype == "ext4":
        require_tool("mkfs.ext4")
    else:  # no mkfs.ext4 (or no loop device): a size-limited tmpfs
        monkeypatch.setattr("aivitals.chaos._host.shutil.which", lambda name: None)
    work = tmp_path / "disk"
    with runner_factory(FaultContext(work_dir=work)) as runner:
        active = runner.start("disk_fill", duration=30, mib_per_s=64, volume_mib=16)
        volume = active.effect.details["volume"]
        mountpoint = volume["mountpoint"]
        assert volume["fstype"] == fstype and "note" not in active.effect.details
        assert _mounted(mountpoint) == fstype
        assert Path(mountpoint).parent == runner.run.path  # under the run's dir
        assert 12 << 20 < volume["size_bytes"] <= 16 << 20
        _wait_full(mountpoint)  # 16 MiB at 64 MiB/s: full within a second
        assert os.statvfs(mountpoint).f_bavail == 0
        assert psutil.Process(active.effect.details["pid"]).is_running()  # holds, full
        # what the host collector then reports, as DiskWillFill and disk_full read it
        got = {
            s.labels["mountpoint"]: s.value
            for s in HostCollector().collect()
            if s.name == "host_filesystem_available_bytes"
        }
        assert got[mountpoint] == 0
        runner.stop(active)
        assert _mounted(mountpoint) is None and not Path(mountpoint).exists()
        assert not list(work.glob("*.img"))  # the image went with it
        run_id = runner.run.run_id
    assert_clean(run_id, chaos_root)


def test_disk_fill_without_root_writes_in_work_dir_and_says_why(  # type: ignore[no-untyped-def]
    runner_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aivitals.chaos._host.os.geteuid", lambda: 1000)
    work = tmp_path / "disk"
    with runner_factory(FaultContext(work_dir=work)) as runner:
        active = runner.start("disk_fill", duration=5, max_mib=1)
        details = active.effect.details
        assert details["volume"] is None and Path(details["dir"]).parent == work
        assert "DiskWillFill and DiskSpaceLow cannot be expected" in details["note"]
        assert "(not root)" in details["note"]
        runner.stop(active)
        assert not list(work.iterdir())


def test_disk_fill_volume_after_a_sigkill_is_unmounted_by_chaos_cleanup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import signal
    import subprocess
    import sys

    from aivitals.chaos import cleanup
    from aivitals.cli import main

    require_root()
    root, work = tmp_path / "runs", tmp_path / "work"
    env = dict(os.environ, AIVITALS_CHAOS_DIR=str(root))
    argv = [
        sys.executable, "-m", "aivitals.cli", "chaos", "run", "disk_fill", "--duration", "120s",
        "--work-dir", str(work), "-p", "volume_mib=16", "-p", "mib_per_s=1",
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        run_id = ""
        for line in proc.stdout:
            run_id = line.split()[1] if line.startswith("run ") else run_id
            if line.startswith("started "):
                break
        assert run_id, "the runner did not start"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        mountpoint = str(root / run_id / "volume")
        assert _mounted(mountpoint) is not None  # the volume outlives the runner
        monkeypatch.setenv("AIVITALS_CHAOS_DIR", str(root))
        main(["chaos", "cleanup"])
        assert f"cleaned {run_id}" in capsys.readouterr().out
        assert _mounted(mountpoint) is None
        assert not list(work.iterdir())  # the image too
        assert_clean(run_id, root)
    finally:
        proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
        cleanup(root, force=True)


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_flood_opens_and_reopens_out_of_step() -> None:
    # a server that, like uvicorn, answers and closes an idle keep-alive connection after a
    # while (1 s here): 2,000 clients in step would all reopen at the same moment, the open
    # fds dip each cycle and FdsNearLimit's for: resets (measured in a strict quick run)
    import asyncio

    from aivitals.chaos._helpers import _flood

    accepts: list[float] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepts.append(time.monotonic())
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await asyncio.sleep(1.0)  # keep-alive timeout
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def main() -> float:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port = server.sockets[0].getsockname()[1]
        t0 = time.monotonic()
        async with server:
            args = {"host": "127.0.0.1", "port": port, "connections": 200, "path": "/healthz"}
            await _flood({**args, "deadline": time.time() + 8.0})
        return t0

    t0 = asyncio.run(main())
    first = sorted(accepts)[:200]
    # opened over seconds, not at once (all 200 in the first 0.2 s before)
    assert first[-1] - first[0] > 2.0, (first[0] - t0, first[-1] - t0)
    # and they stay out of step: each reopens every ~1.3 s (about 46 of the 200 in any
    # 0.3 s on average); in step, all 200 came within 0.3 s of each other
    at = sorted(accepts)
    crowd = max(sum(1 for b in at if a <= b < a + 0.3) for a in at)
    assert crowd <= 100, crowd
    assert len(at) > 400  # they did reopen after the server closed them
