"""Helper processes a fault starts, and how they are ended for sure.

Every helper runs in its own session (its pid is its process group), carries
``AIVITALS_CHAOS_RUN=<run id>`` in its environment (inherited by whatever it
forks, e.g. stress-ng workers) and has a deadline of its own. Ending one
checks the start time recorded with the pid, so a recycled pid is never hit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

__all__ = [
    "RUN_ENV",
    "kill_run_processes",
    "kill_tree",
    "python_helper",
    "same_process",
    "spawn",
    "start_time",
]

RUN_ENV = "AIVITALS_CHAOS_RUN"


def start_time(pid: int) -> float | None:
    """When the process started, as an identity token: clock ticks since boot from
    ``/proc/<pid>/stat``. Exact, unlike a wall-clock create time, which moves with
    the boot time the kernel derives from a clock that can be stepped."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        return float(int(data[data.rindex(b")") + 2 :].split()[19]))
    except (OSError, ValueError, IndexError):
        pass
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def same_process(pid: int, started: float | None) -> bool:
    """Is ``pid`` still the process recorded with ``started`` (never a recycled pid)?"""
    now = start_time(pid)
    return now is not None and (started is None or abs(now - started) < 0.5)


def spawn(
    argv: Sequence[str], *, run_id: str, log: Path | None = None, netns: str | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with the run's marker in its environment."""
    env = dict(os.environ, **{RUN_ENV: run_id})
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, *argv]
    out = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        if log is not None and not isinstance(out, int):
            out.close()


def python_helper(kind: str, args: str) -> list[str]:
    """argv that runs one of this package's helpers in a fresh interpreter."""
    return [sys.executable, "-m", "aivitals.chaos._helpers", kind, args]


def kill_tree(pid: int, started: float | None, *, grace: float = 3.0) -> bool:
    """SIGTERM the process, its group and its descendants; SIGKILL what is left
    after ``grace`` seconds. False when the pid is gone or belongs to someone else."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return False
    if not same_process(pid, started):
        return False
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        # It exited between the two looks (a helper whose parent was just killed):
        # what may be left of its group still gets the signal, and it is gone.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _reap(pid)
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    _signal_all(procs, signal.SIGTERM)
    alive = _wait_gone(procs, grace)
    if alive:
        _signal_all(alive, signal.SIGKILL)
        _wait_gone(alive, grace)
    _reap(pid)
    return True


def _wait_gone(procs: Sequence[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited; the ones still running after ``timeout``.

    A zombie counts as gone: it has exited, and reaping it is its parent's
    business (waiting for that, as ``psutil.wait_procs`` does for a process
    that is not our child, would take the whole grace every time)."""
    for p in procs:
        with contextlib.suppress(psutil.Error, ChildProcessError):
            p.wait(0)  # reaps our own children
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)
        for p in alive:
            with contextlib.suppress(psutil.Error, ChildProcessError):
                p.wait(0)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_all(procs: Sequence[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _reap(pid: int) -> None:
    # A helper started by this very process becomes a zombie until waited for.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def kill_run_processes(run_id: str) -> list[int]:
    """End every process carrying this run's marker (what a crash left unrecorded)."""
    killed: list[int] = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(RUN_ENV) != run_id:
                continue
            proc.kill()
            killed.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    if killed:
        time.sleep(0.05)
        for pid in killed:
            _reap(pid)
    return killed
