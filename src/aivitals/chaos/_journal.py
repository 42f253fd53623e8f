"""The run journal: every resource a fault creates is written down *before* it
is created, so a crash of the runner (even SIGKILL) leaves a list that
``aivitals chaos cleanup`` or the next run replays.

A run lives in ``<root>/<run id>/`` (root: ``$AIVITALS_CHAOS_DIR`` or
``/tmp/aivitals-chaos``) with ``owner.json`` (the runner's pid and start time)
and ``journal.jsonl`` (one JSON object per line: an entry with ``id`` and
``kind``, or ``{"reverted": id}``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..errors import FaultError
from ._procs import kill_run_processes, kill_tree, same_process, start_time

__all__ = [
    "CleanupReport",
    "Journal",
    "RunDir",
    "cleanup",
    "default_root",
    "revert_entry",
]

Entry = dict[str, Any]


def default_root() -> Path:
    return Path(os.environ.get("AIVITALS_CHAOS_DIR") or "/tmp/aivitals-chaos")


class Journal:
    """Append-only record of what a run created, fsynced line by line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._next = 1 + max((e["id"] for e in self._entries()), default=0)

    def record(self, kind: str, **data: Any) -> int:
        """Write an entry before creating the resource it names; returns its id."""
        entry_id = self._next
        self._next += 1
        self._append({"id": entry_id, "kind": kind, "at": time.time(), **data})
        return entry_id

    def mark_reverted(self, entry_id: int) -> None:
        self._append({"reverted": entry_id})

    def pending(self) -> list[Entry]:
        """Entries not yet reverted, oldest first."""
        done = {e["reverted"] for e in self._lines() if "reverted" in e}
        return [e for e in self._entries() if e["id"] not in done]

    def _append(self, obj: Entry) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(obj) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _lines(self) -> list[Entry]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line torn by a crash mid-write
        return out

    def _entries(self) -> list[Entry]:
        return [e for e in self._lines() if "id" in e and "kind" in e]


@dataclass
class RunDir:
    """One run's directory: owner, journal, and a place for its temp files."""

    path: Path

    @classmethod
    def create(cls, root: Path) -> RunDir:
        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        path = root / run_id
        path.mkdir(parents=True, exist_ok=False)
        me = os.getpid()
        owner = {"pid": me, "start": start_time(me), "created": time.time()}
        (path / "owner.json").write_text(json.dumps(owner))
        return cls(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def journal(self) -> Journal:
        return Journal(self.path / "journal.jsonl")

    def owner_alive(self) -> bool:
        try:
            owner = json.loads((self.path / "owner.json").read_text())
        except (OSError, ValueError):
            return False
        return same_process(int(owner["pid"]), owner.get("start"))


# -- reverting one entry ----------------------------------------------------------


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def _revert_process(e: Entry) -> None:
    kill_tree(int(e["pid"]), e.get("start"))


def _revert_netns(e: Entry) -> None:
    if netns_exists(e["name"]):
        r = _run(["ip", "netns", "del", e["name"]])
        if r.returncode != 0 and netns_exists(e["name"]):
            raise FaultError(f"ip netns del {e['name']}: {r.stderr.strip()}")


def _revert_link(e: Entry) -> None:
    if Path("/sys/class/net", e["name"]).exists():
        _run(["ip", "link", "del", e["name"]])


def _revert_nft(e: Entry) -> None:
    ns = e.get("netns")
    if ns is not None and not netns_exists(ns):
        return  # the table went with its namespace
    prefix = ["ip", "netns", "exec", ns] if ns else []
    listed = _run([*prefix, "nft", "list", "table", e["family"], e["name"]])
    if listed.returncode == 0:
        r = _run([*prefix, "nft", "delete", "table", e["family"], e["name"]])
        if r.returncode != 0:
            raise FaultError(f"nft delete table {e['name']}: {r.stderr.strip()}")


def _revert_path(e: Entry) -> None:
    p = Path(e["path"])
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink(missing_ok=True)


def _revert_http(e: Entry) -> None:
    try:
        httpx.post(
            e["url"],
            json={"fault": e["fault"], "action": "stop", "params": {}},
            headers={"X-Aivitals-Token": e["token"]},
            timeout=5.0,
        )
    except httpx.HTTPError:
        pass  # the service is gone, and its in-process fault with it


def _revert_sim_slowdown(e: Entry) -> None:
    from ..collect.gpu import SimGPU

    SimGPU(e["state_dir"]).set_clock_slowdown(int(e["gpu"]), 1.0)


def _revert_sim_alloc(e: Entry) -> None:
    from ..collect.gpu import SimGPU

    SimGPU(e["state_dir"]).free(int(e["pid"]), int(e["nbytes"]), gpu=int(e["gpu"]))


def _revert_sigstop(e: Entry) -> None:
    if same_process(int(e["pid"]), e.get("start")):
        os.kill(int(e["pid"]), signal.SIGCONT)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _revert_restart(e: Entry) -> None:
    """Start a process that a fault stopped again, with its recorded command line."""
    port = int(e["port"])
    if _port_open(port):
        return
    subprocess.Popen(
        e["argv"],
        cwd=e.get("cwd") or "/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not _port_open(port):
        if time.monotonic() > deadline:
            raise FaultError(f"could not restart {e['argv'][0]} on port {port}")
        time.sleep(0.05)


_REVERT: dict[str, Callable[[Entry], None]] = {
    "process": _revert_process,
    "netns": _revert_netns,
    "link": _revert_link,
    "nft_table": _revert_nft,
    "path": _revert_path,
    "http_fault": _revert_http,
    "sim_slowdown": _revert_sim_slowdown,
    "sim_alloc": _revert_sim_alloc,
    "sigstop": _revert_sigstop,
    "restart": _revert_restart,
}


def revert_entry(entry: Entry) -> None:
    """Undo one journal entry; missing resources are fine (already gone)."""
    fn = _REVERT.get(entry["kind"])
    if fn is None:
        raise FaultError(f"journal entry of unknown kind {entry['kind']!r}")
    fn(entry)


def replay(run: RunDir) -> list[str]:
    """Revert everything pending in a run, newest first; returns the errors."""
    journal = run.journal
    errors: list[str] = []
    kill_run_processes(run.run_id)
    for entry in reversed(journal.pending()):
        try:
            revert_entry(entry)
            journal.mark_reverted(entry["id"])
        except Exception as exc:  # one failure must not stop the rest of the clean-up
            errors.append(f"{entry['kind']} {entry.get('name') or entry.get('pid') or ''}: {exc}")
    return errors


@dataclass
class CleanupReport:
    """What ``cleanup`` did: runs cleaned, runs skipped (owner alive), errors."""

    cleaned: list[str] = field(default_factory=list)
    reverted: int = 0
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def cleanup(
    root: Path | None = None, *, force: bool = False, exclude: str | None = None
) -> CleanupReport:
    """Replay the journals of runs whose runner is gone (all runs with ``force``),
    then remove their directories."""
    root = root or default_root()
    report = CleanupReport()
    if not root.is_dir():
        return report
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        run = RunDir(path)
        if run.run_id == exclude:
            continue
        if run.owner_alive() and not force:
            report.skipped.append(run.run_id)
            continue
        report.reverted += len(run.journal.pending())
        errors = replay(run)
        report.errors += [f"{run.run_id}: {e}" for e in errors]
        if not errors:
            shutil.rmtree(path, ignore_errors=True)
            report.cleaned.append(run.run_id)
    return report
