from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from aivitals.chaos._procs import (
    RUN_ENV,
    kill_run_processes,
    kill_tree,
    same_process,
    spawn,
    start_time,
)


def test_start_time_identifies_a_process_and_kill_tree_checks_it() -> None:
    proc = spawn(["sleep", "30"], run_id="test-run-procs")
    try:
        started = start_time(proc.pid)
        assert started is not None and start_time(proc.pid) == started
        assert same_process(proc.pid, started)
        # A different start (a recycled pid) is never signalled.
        assert not kill_tree(proc.pid, started + 1000)
        assert proc.poll() is None
        assert kill_tree(proc.pid, started)
        assert proc.poll() is not None and not same_process(proc.pid, started)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _environ_after_exec(pid: int) -> list[bytes]:
    """The process's environment once its exec has finished: Popen returns when the
    close-on-exec pipe closes, which the kernel does before it sets up the new program's
    environment, so a read right then can find it empty."""
    deadline = time.monotonic() + 5.0
    while True:
        env = Path(f"/proc/{pid}/environ").read_bytes()
        if env or time.monotonic() > deadline:
            return env.split(b"\0")
        time.sleep(0.01)


def test_helpers_carry_the_run_marker_and_are_found_by_it() -> None:
    proc = spawn(["sleep", "30"], run_id="test-run-marker")
    try:
        env = _environ_after_exec(proc.pid)
        assert f"{RUN_ENV}=test-run-marker".encode() in env
        assert kill_run_processes("test-run-marker") == [proc.pid]
        proc.wait(5)  # (reaped by kill_run_processes already)
        assert not same_process(proc.pid, None)
        assert kill_run_processes("test-run-marker") == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_spawn_starts_its_own_session() -> None:
    proc = spawn(["sleep", "30"], run_id="test-run-session")
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    finally:
        proc.kill()
        proc.wait()
    assert isinstance(proc, subprocess.Popen)


def test_kill_tree_of_a_process_that_exits_while_looked_at_is_not_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Cleanup after a SIGKILLed runner met a helper that exited between
    # psutil.Process(pid) and .children(): NoSuchProcess failed the whole cleanup.
    import sys

    import psutil

    from aivitals.chaos import kill_tree, start_time

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    started = start_time(proc.pid)

    def vanished(self: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
        raise psutil.NoSuchProcess(self.pid)

    monkeypatch.setattr(psutil.Process, "children", vanished)
    try:
        assert kill_tree(proc.pid, started) is False
        assert proc.wait(timeout=5) != 0  # its group got the signal all the same
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
