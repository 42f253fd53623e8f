"""The runner killed mid-fault: SIGKILL leaves a journal that cleanup (or the next
run) replays; SIGTERM and Ctrl-C revert on the spot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from aivitals.chaos import ChaosRunner, FaultContext, cleanup
from aivitals.cli import main
from tests.chaos.conftest import (
    assert_clean,
    netns_names,
    require_root,
    require_tool,
    run_processes,
)
from tests.load._server import TinyServer, tiny_server

pytestmark = pytest.mark.slow


@pytest.fixture
def service() -> Iterator[TinyServer]:
    with tiny_server() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _never_leave_anything(tmp_path: Path) -> Iterator[None]:
    # Whatever an assertion stops, the runs of the test are reverted afterwards.
    yield
    cleanup(tmp_path / "runs", force=True)


def _start_runner(
    root: Path, target: str, work: Path, *faults: str
) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, AIVITALS_CHAOS_DIR=str(root))
    argv = [
        sys.executable, "-m", "aivitals.cli", "chaos", "run", *faults, "--duration", "120s",
        "--target", target, "--work-dir", str(work), "-p", "workers=1",
    ]  # fmt: skip
    if "disk_io_saturation" in faults:
        argv += ["-p", "size_mib=8"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    run_id, started = "", 0
    deadline = time.monotonic() + 60
    while started < len(faults) and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("run "):
            run_id = line.split()[1]
        started += line.startswith("started ")
    if not (run_id and started == len(faults)):
        proc.kill()
        out = proc.communicate()[0]
        pytest.fail(f"runner did not start: rc={proc.returncode}: {out}")
    return proc, run_id


def _end(proc: subprocess.Popen[str], how: int) -> int:
    proc.send_signal(how)
    rc = proc.wait(30)
    assert proc.stdout is not None
    proc.stdout.close()
    return rc


def _left_behind(run_id: str, work: Path) -> None:
    """What a killed runner leaves: the proof that cleanup has something to do."""
    tag = run_id[-6:]
    assert [n for n in netns_names() if tag in n]
    assert run_processes(run_id)
    assert list(work.glob(f"aivitals-chaos-{run_id}-*"))


def _gone(run_id: str, root: Path, work: Path) -> None:
    assert_clean(run_id, root)
    assert not list(work.glob("aivitals-chaos-*"))


@pytest.fixture(autouse=True)
def _tools() -> None:
    require_root()
    for tool in ("ip", "nft", "stress-ng", "fio"):
        require_tool(tool)


FAULTS = ("network_loss", "cpu_burn", "disk_io_saturation")


def test_sigkill_then_chaos_cleanup_leaves_nothing(
    service: TinyServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, work = tmp_path / "runs", tmp_path / "work"
    proc, run_id = _start_runner(root, service.url, work, *FAULTS)
    _end(proc, signal.SIGKILL)
    time.sleep(0.5)
    _left_behind(run_id, work)
    monkeypatch.setenv("AIVITALS_CHAOS_DIR", str(root))
    main(["chaos", "cleanup"])
    assert f"cleaned {run_id}" in capsys.readouterr().out
    _gone(run_id, root, work)
    main(["chaos", "cleanup"])  # a second cleanup has nothing left to do
    assert "0 run(s) cleaned" in capsys.readouterr().out


def test_sigkill_then_the_next_run_cleans_first(service: TinyServer, tmp_path: Path) -> None:
    root, work = tmp_path / "runs", tmp_path / "work"
    proc, run_id = _start_runner(root, service.url, work, *FAULTS)
    _end(proc, signal.SIGKILL)
    _left_behind(run_id, work)
    with ChaosRunner(FaultContext(), root=root, handle_signals=False) as runner:
        assert runner.recovered is not None and runner.recovered.cleaned == [run_id]
    _gone(run_id, root, work)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_revert_on_the_spot(
    sig: int, service: TinyServer, tmp_path: Path
) -> None:
    root, work = tmp_path / "runs", tmp_path / "work"
    proc, run_id = _start_runner(root, service.url, work, "network_loss", "cpu_burn")
    pid = proc.pid
    assert _end(proc, sig) in (130, 128 + sig)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    _gone(run_id, root, work)
