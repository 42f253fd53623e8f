"""Run commands the way a user does and account for every process they leave.

``python tests/chaos/_reaper.py SPEC_JSON`` makes itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``): every process started below it that outlives its
parent, even one in a new session (a helper, a restarted redis-server, the demo
service), is re-parented to it instead of to init, so "what did this run leave
running" becomes "what are my descendants now". It runs each step of SPEC in
turn (output echoed, one step may be SIGKILLed once a line of its output or a
journal entry says its fault is on), then waits up to ``grace`` seconds for its
descendants to end, prints ``REAPER-LEFT <json>`` (what is still alive:
pid, cmdline, cwd) and ``REAPER-RUNS <json>`` (the run directories seen under
``$AIVITALS_CHAOS_DIR`` while it ran), and then kills what was left, so that a
failing check never leaves anything behind either.

SPEC: ``{"steps": [{"argv": [...], "timeout": s, "kill_on": "text" | null,
"kill_on_journal": "text" | null, "kill_after": s, "kill_signal": "SIGINT"}],
"grace": s}`` (``kill_signal``: SIGKILL unless named; SIGINT is Ctrl-C).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

PR_SET_CHILD_SUBREAPER = 36


def _reap(keep: int | None = None) -> None:
    """Reap every exited child but ``keep`` (the running step, whose status its
    Popen collects); orphans re-parented here would otherwise linger as zombies
    and make whoever waits for them (a cleanup's kill) wait its full grace."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == keep:
            return
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            return


def _alive_descendants() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


class _RunWatch(threading.Thread):
    """Notes every run directory that appears under the chaos root, and whether
    any journal there holds ``text`` (a fault of the kind asked for is on)."""

    def __init__(self, root: Path | None) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.seen: set[str] = set()
        self.stop = threading.Event()

    def journal_has(self, text: str) -> bool:
        if self.root is None or not self.root.is_dir():
            return False
        for j in self.root.glob("*/journal.jsonl"):
            try:
                if text in j.read_text():
                    return True
            except OSError:
                continue
        return False

    def run(self) -> None:
        while not self.stop.wait(0.1):
            if self.root is not None and self.root.is_dir():
                for p in self.root.iterdir():
                    if p.is_dir() and not p.name.startswith("."):
                        self.seen.add(p.name)


def _step(step: dict[str, Any], watch: _RunWatch) -> None:
    proc = subprocess.Popen(
        step["argv"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    print(f"REAPER-STEP pid={proc.pid} {' '.join(step['argv'][:6])}", flush=True)
    trigger = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if step.get("kill_on") and step["kill_on"] in line:
                trigger.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = time.monotonic() + float(step.get("timeout", 300))
    killed = False
    while proc.poll() is None:
        if time.monotonic() > deadline:
            print("REAPER-TIMEOUT", flush=True)
            proc.kill()
            break
        journal_text = step.get("kill_on_journal")
        if not killed and (trigger.is_set() or (journal_text and watch.journal_has(journal_text))):
            time.sleep(float(step.get("kill_after", 0.5)))
            name = str(step.get("kill_signal", "SIGKILL"))
            print(f"REAPER-{name} {proc.pid}", flush=True)
            proc.send_signal(getattr(signal, name))
            killed = True
        _reap(keep=proc.pid)
        time.sleep(0.05)
    proc.wait()
    reader.join(timeout=10)
    print(f"REAPER-EXIT {proc.returncode}", flush=True)


def main() -> int:
    spec = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("REAPER-ERROR prctl failed", flush=True)
        return 2
    root = os.environ.get("AIVITALS_CHAOS_DIR")
    watch = _RunWatch(Path(root) if root else None)
    watch.start()
    for step in spec["steps"]:
        _step(step, watch)
        _reap()
    deadline = time.monotonic() + float(spec.get("grace", 3.0))
    left = _alive_descendants()
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        _reap()
        left = _alive_descendants()
    report = []
    for p in left:
        try:
            report.append({"pid": p.pid, "cmdline": p.cmdline(), "cwd": p.cwd()})
        except psutil.Error:
            continue
    watch.stop.set()
    watch.join(timeout=2)
    print("REAPER-LEFT " + json.dumps(report), flush=True)
    print("REAPER-RUNS " + json.dumps(sorted(watch.seen)), flush=True)
    for p in left:
        try:
            os.killpg(p.pid, signal.SIGKILL) if p.pid == os.getpgid(p.pid) else None
            p.kill()
        except (psutil.Error, OSError):
            continue
    time.sleep(0.2)
    _reap()
    return 0


if __name__ == "__main__":
    sys.exit(main())
