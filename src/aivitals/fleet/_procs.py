"""Detached child processes recorded by pid and start time, stopped by process group.

``aivitals fleet up`` returns while the fleet keeps running, so every process
is started in its own session (its own process group: one ``killpg`` takes its
threads and children with it) and written to the state file with its start
time, so that ``fleet down`` never signals a pid the kernel has since reused.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

__all__ = ["Proc", "alive", "spawn", "stop_all"]


@dataclass(frozen=True, slots=True)
class Proc:
    """One started process: a name for humans, its pid and its start time (psutil's)."""

    name: str
    pid: int
    started: float
    log: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Proc:
        return cls(str(raw["name"]), int(raw["pid"]), float(raw["started"]), str(raw["log"]))


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start ``argv`` detached (own session), stdout and stderr appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    try:
        started = psutil.Process(proc.pid).create_time()
    except psutil.Error:
        started = 0.0  # exited at once; alive() says so and the caller reads the log
    # The Popen object is dropped on purpose: the process outlives this one (fleet up
    # returns), and stop_all() finds it again by pid and start time.
    return Proc(name, proc.pid, started, str(log))


def alive(p: Proc) -> bool:
    """The process still runs and is the one we started (not a reused pid), not a zombie."""
    try:
        proc = psutil.Process(p.pid)
        if abs(proc.create_time() - p.started) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _reap(pid: int) -> None:
    # our own child (the test harness case): collect it so it does not linger as a zombie
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_all(procs: Sequence[Proc], *, timeout: float = 10.0) -> list[str]:
    """SIGTERM each live process group (in reverse start order), SIGKILL what outlives
    ``timeout``; returns the names of processes that were still running."""
    running = [p for p in reversed(procs) if alive(p)]
    for p in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in running:
            _reap(p.pid)
        if not any(alive(p) for p in running):
            break
        time.sleep(0.1)
    for p in running:
        if alive(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(alive(p) for p in running):
        for p in running:
            _reap(p.pid)
        time.sleep(0.05)
    for p in running:
        _reap(p.pid)
    return [p.name for p in running]
