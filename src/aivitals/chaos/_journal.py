"""The run journal: every resource a fault creates is written down *before* it
is created, so a crash of the runner (even SIGKILL) leaves a list that
``aivitals chaos cleanup`` or the next run replays.

A run lives in ``<root>/<run id>/`` (root: ``$AIVITALS_CHAOS_DIR`` or
``/tmp/aivitals-chaos``) with ``owner.json`` (the runner's pid and start time)
and ``journal.jsonl`` (one JSON object per line: an entry with ``id`` and
``kind``, or ``{"reverted": id}``).

The same directories serve as the *ledger* of a process owner that is not a
chaos run (``kind`` ``"stack"`` in ``owner.json``: the demo/validate stack):
it records the processes and temp dirs it starts, so a crash of its process
is cleaned the same way, and a fault that replaces one of its processes (a
restarted redis-server) hands the new process over by writing it into that
ledger.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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
from ._procs import RUN_ENV, kill_run_processes, kill_tree, same_process, start_time

__all__ = [
    "CleanupReport",
    "Journal",
    "Replacement",
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
    def create(cls, root: Path, *, kind: str = "chaos") -> RunDir:
        """A new run directory under ``root`` owned by this process.

        It appears complete (``owner.json`` written) or not at all: a cleanup
        running at the same moment must never take a half-made directory for
        one whose owner died.
        """
        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        root.mkdir(parents=True, exist_ok=True)
        making = root / f".making-{run_id}"
        making.mkdir()
        me = os.getpid()
        owner = {"pid": me, "start": start_time(me), "created": time.time(), "kind": kind}
        (making / "owner.json").write_text(json.dumps(owner))
        path = root / run_id
        making.rename(path)
        return cls(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def journal(self) -> Journal:
        return Journal(self.path / "journal.jsonl")

    @property
    def kind(self) -> str:
        """``"chaos"`` (a chaos run) or ``"stack"`` (the ledger of a demo/validate stack)."""
        try:
            return str(json.loads((self.path / "owner.json").read_text()).get("kind", "chaos"))
        except (OSError, ValueError):
            return "chaos"

    def owner_alive(self) -> bool:
        try:
            owner = json.loads((self.path / "owner.json").read_text())
        except (OSError, ValueError):
            return False
        return same_process(int(owner["pid"]), owner.get("start"))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


@dataclass(frozen=True)
class Replacement:
    """A process a fault started in place of one it stopped (a restarted
    redis-server), handed to whoever owns it from now on.

    ``start`` is the process's start time (``_procs.start_time``): stop it with
    ``kill_tree(pid, start)``, which never hits a recycled pid. ``owner`` is the
    ledger directory it was written into, or None when it went back to whoever
    started the original process outside aivitals (``allow_foreign_restart``).
    """

    role: str
    pid: int
    start: float | None
    port: int
    argv: tuple[str, ...]
    owner: str | None

    def describe(self) -> str:
        whose = (
            f"handed to its owner ({Path(self.owner).name})"
            if self.owner
            else "yours now: it replaces a process this run did not start"
        )
        return f"restarted {self.role} on port {self.port} as pid {self.pid}, {whose}"


# -- reverting one entry ----------------------------------------------------------


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def _revert_process(e: Entry, run: RunDir | None) -> None:
    kill_tree(int(e["pid"]), e.get("start"))


def _revert_netns(e: Entry, run: RunDir | None) -> None:
    if netns_exists(e["name"]):
        r = _run(["ip", "netns", "del", e["name"]])
        if r.returncode != 0 and netns_exists(e["name"]):
            raise FaultError(f"ip netns del {e['name']}: {r.stderr.strip()}")


def _revert_link(e: Entry, run: RunDir | None) -> None:
    if Path("/sys/class/net", e["name"]).exists():
        _run(["ip", "link", "del", e["name"]])


def _revert_nft(e: Entry, run: RunDir | None) -> None:
    ns = e.get("netns")
    if ns is not None and not netns_exists(ns):
        return  # the table went with its namespace
    prefix = ["ip", "netns", "exec", ns] if ns else []
    listed = _run([*prefix, "nft", "list", "table", e["family"], e["name"]])
    if listed.returncode == 0:
        r = _run([*prefix, "nft", "delete", "table", e["family"], e["name"]])
        if r.returncode != 0:
            raise FaultError(f"nft delete table {e['name']}: {r.stderr.strip()}")


def _revert_path(e: Entry, run: RunDir | None) -> None:
    p = Path(e["path"])
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists() or p.is_symlink():
        p.unlink(missing_ok=True)


def mounted(target: str, *, table: Path = Path("/proc/self/mounts")) -> bool:
    """Whether a filesystem is mounted on ``target``.

    mount(8) records the canonical path and the kernel escapes blanks as octal
    (``\\040``): the kernel's field is unescaped and the target canonicalised before
    they are compared, so a run root given as a relative or symlinked path, or one with
    a space, still finds its mount (else the revert would remove the files under it and
    leave the mount and its loop device).
    """
    try:
        text = table.read_text()
    except OSError:
        return False
    wanted = {target, os.path.realpath(target)}
    return any(
        len(f) > 1 and _unescape(f[1]) in wanted for f in (ln.split() for ln in text.splitlines())
    )


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _revert_mount(e: Entry, run: RunDir | None) -> None:
    target = str(e["target"])
    if not mounted(target):
        return  # never mounted (a crash before it), or already gone
    r = _run(["umount", target])
    if r.returncode != 0 and mounted(target):
        # still busy (a process of another run writing there): detach it now, the kernel
        # frees it when the last user goes, and the loop device with it
        r = _run(["umount", "-l", target])
        if r.returncode != 0 and mounted(target):
            raise FaultError(f"umount {target}: {r.stderr.strip()}")


def _revert_http(e: Entry, run: RunDir | None) -> None:
    try:
        httpx.post(
            e["url"],
            json={"fault": e["fault"], "action": "stop", "params": {}},
            headers={"X-Aivitals-Token": e["token"]},
            timeout=5.0,
        )
    except httpx.HTTPError:
        pass  # the service is gone, and its in-process fault with it


def _revert_sim_slowdown(e: Entry, run: RunDir | None) -> None:
    from ..collect.gpu import SimGPU

    SimGPU(e["state_dir"]).set_clock_slowdown(int(e["gpu"]), 1.0)


def _revert_sim_lost(e: Entry, run: RunDir | None) -> None:
    from ..collect.gpu import SimGPU

    SimGPU(e["state_dir"]).reset(int(e["gpu"]))


def _revert_sim_alloc(e: Entry, run: RunDir | None) -> None:
    from ..collect.gpu import SimGPU

    SimGPU(e["state_dir"]).free(int(e["pid"]), int(e["nbytes"]), gpu=int(e["gpu"]))


def _revert_sigstop(e: Entry, run: RunDir | None) -> None:
    if same_process(int(e["pid"]), e.get("start")):
        os.kill(int(e["pid"]), signal.SIGCONT)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _listener(port: int) -> str:
    """Who listens on 127.0.0.1:port, for an error message."""
    import psutil

    try:
        for c in psutil.net_connections("tcp"):
            if c.laddr and c.laddr.port == port and c.status == "LISTEN" and c.pid:
                return f"pid {c.pid} ({' '.join(psutil.Process(c.pid).cmdline())[:120]})"
    except (psutil.Error, OSError):
        pass
    return "another process"


def _owner_alive(owner: str | None) -> bool:
    return owner is None or RunDir(Path(owner)).owner_alive()


def _revert_restart(e: Entry, run: RunDir | None) -> Replacement | None:
    """Start a process that a fault stopped again, with its recorded command line,
    and hand it to its owner (see ``Replacement``).

    The new process carries its owner's run marker from birth and is written
    into the owner's ledger before it is waited for, so it is stopped with the
    owner's other processes even if this runner dies a moment later. A
    replacement that does not come up is stopped again: nothing half-started
    remains and the port is free. When the owner itself is gone (its stack was
    killed), nothing is restarted: no one would stop the new process.
    """
    port, role, owner = int(e["port"]), str(e.get("role", "process")), e.get("owned_by")
    if not _owner_alive(owner):
        return None  # nothing to give it back to; the owner's ledger cleans the rest
    if run is not None and _already_replaced(run, e):
        return None  # restarted just before the runner died; handed over by its own entry
    if _port_open(port):
        raise FaultError(f"{role} not restarted: port {port} is already taken by {_listener(port)}")
    env = dict(os.environ)
    env.pop(RUN_ENV, None)
    if owner is not None:
        env[RUN_ENV] = Path(owner).name  # the owner's marker: its cleanup finds it
    # Its start-up output goes to the run's directory (why it failed, if it does).
    log = run.path / f"{role}-restart.log" if run is not None else None
    try:
        with log.open("ab") if log is not None else contextlib.nullcontext() as out:
            proc = subprocess.Popen(
                e["argv"],
                cwd=e.get("cwd") or "/",
                stdin=subprocess.DEVNULL,
                stdout=out if out is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
    except OSError as exc:
        raise FaultError(
            f"could not restart {role} ({e['argv'][0]}) on port {port}: {exc}; "
            f"nothing was started and port {port} is free"
        ) from exc
    rep = Replacement(role, proc.pid, start_time(proc.pid), port, tuple(e["argv"]), owner)
    journal = run.journal if run is not None else None
    rep_id = None
    if journal is not None:
        rep_id = journal.record("replacement", pid=rep.pid, start=rep.start, owned_by=owner,
                                role=role, port=port, restart=e["id"])  # fmt: skip
    owned_id = None
    if owner is not None:
        owned_id = RunDir(Path(owner)).journal.record(
            "process", pid=rep.pid, start=rep.start, label=f"{role} (replacement)",
            chaos_run=run.run_id if run is not None else None,
        )  # fmt: skip
    deadline = time.monotonic() + 10
    while not _port_open(port):
        exited = proc.poll()
        if exited is not None or time.monotonic() > deadline:
            kill_tree(rep.pid, rep.start, grace=2.0)
            with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if owner is not None and owned_id is not None:
                RunDir(Path(owner)).journal.mark_reverted(owned_id)
            if journal is not None and rep_id is not None:
                journal.mark_reverted(rep_id)
            why = f"it exited with {exited}" if exited is not None else "no answer within 10 s"
            tail = _tail(log) if log is not None else ""
            raise FaultError(
                f"could not restart {role} on port {port} ({why}{': ' + tail if tail else ''}); "
                f"it was stopped again: nothing of it is left and port {port} is free"
            )
        time.sleep(0.05)
    if journal is not None and rep_id is not None:
        journal.mark_reverted(rep_id)  # handed over: the owner stops it from now on
    return rep


def _already_replaced(run: RunDir, e: Entry) -> bool:
    return any(
        r["kind"] == "replacement"
        and r.get("restart") == e["id"]
        and same_process(int(r["pid"]), r.get("start"))
        for r in run.journal._entries()
    )


def _tail(path: Path, chars: int = 300) -> str:
    try:
        return " ".join(path.read_text(errors="replace")[-chars:].split())
    except OSError:
        return ""


def _revert_replacement(e: Entry, run: RunDir | None) -> None:
    """A replacement whose hand-over did not finish (the runner died meanwhile):
    give it to its owner if it is alive, else stop it; a foreign one stays up
    (it is the restored process its user asked for)."""
    owner = e.get("owned_by")
    if owner is None:
        return
    if _owner_alive(owner) and same_process(int(e["pid"]), e.get("start")):
        RunDir(Path(owner)).journal.record(
            "process", pid=int(e["pid"]), start=e.get("start"),
            label=f"{e.get('role', 'process')} (replacement)",
        )  # fmt: skip
        return
    kill_tree(int(e["pid"]), e.get("start"))


_REVERT: dict[str, Callable[[Entry, RunDir | None], Replacement | None]] = {
    "process": _revert_process,
    "netns": _revert_netns,
    "link": _revert_link,
    "nft_table": _revert_nft,
    "path": _revert_path,
    "mount": _revert_mount,
    "http_fault": _revert_http,
    "sim_slowdown": _revert_sim_slowdown,
    "sim_alloc": _revert_sim_alloc,
    "sim_lost": _revert_sim_lost,
    "sigstop": _revert_sigstop,
    "restart": _revert_restart,
    "replacement": _revert_replacement,
}


def revert_entry(entry: Entry, run: RunDir | None = None) -> Replacement | None:
    """Undo one journal entry of ``run``; missing resources are fine (already gone).

    Returns the new process when undoing meant starting one again (a restart).
    A restart that fails raises ``FaultError`` after stopping what it started.
    """
    fn = _REVERT.get(entry["kind"])
    if fn is None:
        raise FaultError(f"journal entry of unknown kind {entry['kind']!r}")
    return fn(entry, run)


def replay(run: RunDir, *, replaced: list[Replacement] | None = None) -> list[str]:
    """Revert everything pending in a run, newest first; returns the errors.

    Processes a restart started again are appended to ``replaced``.
    """
    journal = run.journal
    errors: list[str] = []
    kill_run_processes(run.run_id)
    for entry in reversed(journal.pending()):
        try:
            rep = revert_entry(entry, run)
            if rep is not None and replaced is not None:
                replaced.append(rep)
        except Exception as exc:  # one failure must not stop the rest of the clean-up
            errors.append(f"{entry['kind']} {entry.get('name') or entry.get('pid') or ''}: {exc}")
            if entry["kind"] == "restart":
                # A failed restart was rolled back (nothing of it is left); retrying
                # it at every later cleanup would not make it start.
                journal.mark_reverted(entry["id"])
            continue
        journal.mark_reverted(entry["id"])
    return errors


@dataclass
class CleanupReport:
    """What ``cleanup`` did: runs cleaned, runs skipped (owner alive), errors."""

    cleaned: list[str] = field(default_factory=list)
    reverted: int = 0
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: processes started again while reverting (a killed redis-server), and who owns them
    replaced: list[Replacement] = field(default_factory=list)


def cleanup(
    root: Path | None = None, *, force: bool = False, exclude: str | None = None
) -> CleanupReport:
    """Replay the journals of runs whose runner is gone (all runs with ``force``),
    then remove their directories."""
    root = root or default_root()
    report = CleanupReport()
    if not root.is_dir():
        return report
    # Stack ledgers sort with the chaos runs by creation time; a stack made before a
    # run is cleaned first, so the run's restart of that stack's process sees its
    # owner gone and starts nothing.
    for path in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        run = RunDir(path)
        if run.run_id == exclude:
            continue
        if run.owner_alive() and not force:
            report.skipped.append(run.run_id)
            continue
        report.reverted += len(run.journal.pending())
        errors = replay(run, replaced=report.replaced)
        report.errors += [f"{run.run_id}: {e}" for e in errors]
        if not errors:
            shutil.rmtree(path, ignore_errors=True)
            report.cleaned.append(run.run_id)
    return report
