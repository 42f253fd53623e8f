"""The served processes, found by pid or by the TCP port they listen on.

A service is often several processes: a pre-fork server's master and its
workers all hold the listening socket, and any of them may start processes
of their own (inference workers, a process pool). The collector follows
every process that holds the listening socket and all their descendants,
each labelled by ``role``:

- ``listener``: holds the listening socket, and its parent does not (the
  master, or the only process of a single-process service);
- ``worker``: holds the listening socket inherited from a parent that holds
  it too (a pre-fork server's workers);
- ``child``: a descendant that does not hold the socket (inference workers,
  a ``ProcessPoolExecutor``, a helper);
- ``main``: the process named by ``pid=``; its descendants are ``child``.

Read from ``/proc/<pid>`` (injectable ``proc=``): RSS, open fds and their
limit, threads, CPU seconds, and TCP connections by state (socket inodes
matched against the tcp tables of the namespace, read once per scrape). Found
by port, the listening socket's accept queue too: the connections the kernel
holds until a process accepts them, which is where requests wait in front of
synchronous workers that are all busy (``service_listen_queue_length``, and its
backlog limit where netlink reports it).
Socket holders are found by a walk of every process's fds, done again only
when one of them exits or every ``rediscover`` seconds; descendants are read
from ``/proc/<pid>/task/*/children`` at every scrape. At most
``max_processes`` are followed (holders first, then descendants nearest
first); the rest are left out and counted as the ``process_cap`` error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from ..errors import CollectorError, ConfigError
from ..signals import Sample
from . import _procfs as pf
from ._health import BaseCollector
from ._sockdiag import listen_queues, same_netns, tcp_sockets

__all__ = ["ROLES", "ProcessCollector", "find_listener", "find_listeners"]

#: the ``role`` label's values, in the order they are followed
ROLES = ("listener", "worker", "main", "child")


def _socket_inodes(fd_dir: Path) -> set[str]:
    inodes: set[str] = set()
    for entry in os.scandir(fd_dir):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue  # closed between listing and reading
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _tcp_rows(proc: Path, pid: str) -> Iterable[tuple[int, int, str]]:
    """(local port, state code, inode) of every TCP socket the pid's namespace holds."""
    if str(proc) == "/proc" and same_netns(pid):
        try:
            return [(port, state, str(inode)) for port, state, inode in tcp_sockets()]
        except OSError:
            pass  # netlink refused: read the text tables
    return _tcp_text_rows(proc, pid)


def _tcp_text_rows(proc: Path, pid: str) -> Iterable[tuple[int, int, str]]:
    for table in ("tcp", "tcp6"):
        try:
            text = (proc / pid / "net" / table).read_text()
        except FileNotFoundError:
            continue
        for line in text.splitlines()[1:]:
            f = line.split()
            if len(f) >= 10:
                yield int(f[1].rpartition(":")[2], 16), int(f[3], 16), f[9]


def find_listener(port: int, *, proc: str = "/proc") -> int | None:
    """The pid of the process listening on TCP ``port`` (the top one of several), or None."""
    holders = find_listeners(port, proc=proc)
    if not holders:
        return None
    tops = [pid for pid, parent in holders.items() if parent not in holders]
    return min(tops or holders)


def find_listeners(port: int, *, proc: str = "/proc") -> dict[int, int | None]:
    """Every process holding TCP ``port``'s listening socket: pid -> its parent's pid."""
    root = Path(proc)
    listening = {inode for p, st, inode in _tcp_rows(root, "self") if p == port and st == 10}
    if not listening:
        return {}
    out: dict[int, int | None] = {}
    for entry in os.scandir(root):
        if not entry.name.isdigit():
            continue
        try:
            if _socket_inodes(Path(entry.path, "fd")) & listening:
                out[int(entry.name)] = _parent(root / entry.name)
        except OSError:
            continue  # another user's process, or gone
    return out


def _parent(base: Path) -> int | None:
    """The parent pid from ``stat`` (the field after the state), or None when gone."""
    try:
        stat = (base / "stat").read_text()
    except OSError:
        return None
    after = stat[stat.rfind(")") + 2 :].split()
    return int(after[1]) if len(after) > 1 and after[1].isdigit() else None


def _children(base: Path) -> list[int]:
    """Direct children of every thread of the process (a thread may start one too)."""
    out: list[int] = []
    try:
        tasks = list(os.scandir(base / "task"))
    except OSError:
        return out  # gone, or not ours to read
    for task in tasks:
        try:
            text = Path(task.path, "children").read_text()
        except OSError:
            continue  # the thread ended, or a kernel without CONFIG_PROC_CHILDREN
        out += [int(pid) for pid in text.split()]
    return out


class ProcessCollector(BaseCollector):
    """The ``process`` collector for one service's processes.

    **Usage**::

        ProcessCollector(port=8000)      # whoever holds port 8000's socket, and their children
        ProcessCollector(pid=1234)       # that process and its children

    A process that exits between two reads is left out of that scrape (normal
    for a pool's worker); the scrape fails only when no process is left.
    """

    name = "process"

    def __init__(
        self,
        *,
        pid: int | None = None,
        port: int | None = None,
        proc: str = "/proc",
        max_processes: int = 64,
        rediscover: float = 30.0,
    ):
        super().__init__()
        if (pid is None) == (port is None):
            raise ConfigError("give exactly one of pid= or port=")
        if isinstance(max_processes, bool) or not isinstance(max_processes, int):
            raise ConfigError(f"max_processes must be an int >= 1, got {max_processes!r}")
        if max_processes < 1:
            raise ConfigError(f"max_processes must be an int >= 1, got {max_processes!r}")
        if not rediscover > 0:
            raise ConfigError(f"rediscover must be > 0 seconds, got {rediscover!r}")
        self.pid = pid
        self.port = port
        self.proc = Path(proc)
        self.max_processes = max_processes
        self.rediscover = rediscover
        self._clk_tck = float(os.sysconf("SC_CLK_TCK"))
        self._holders: dict[int, int | None] = {}
        self._found_at = 0.0

    def _tops(self) -> dict[int, str]:
        """The processes followed before their descendants, with their roles."""
        if self.pid is not None:
            if not (self.proc / str(self.pid)).exists():
                raise CollectorError(f"process {self.pid} is gone")
            return {self.pid: "main"}
        assert self.port is not None
        stale = time.monotonic() - self._found_at > self.rediscover
        if stale or not all((self.proc / str(pid)).exists() for pid in self._holders):
            self._holders = find_listeners(self.port, proc=str(self.proc))
            self._found_at = time.monotonic()
        if not self._holders:
            raise CollectorError(f"no process listens on port {self.port}")
        holders = self._holders
        roles = {pid: "worker" if holders[pid] in holders else "listener" for pid in holders}
        return dict(sorted(roles.items(), key=lambda item: (ROLES.index(item[1]), item[0])))

    def targets(self) -> dict[int, str]:
        """Every process followed now: pid -> role, capped at ``max_processes``."""
        roles = self._tops()
        queue = list(roles)
        while queue:
            pid = queue.pop(0)
            for child in _children(self.proc / str(pid)):
                if child not in roles:
                    roles[child] = "child"
                    queue.append(child)
        if len(roles) > self.max_processes:
            self.count_error("process_cap")
            roles = dict(list(roles.items())[: self.max_processes])
        return roles

    def _collect(self) -> Iterable[Sample]:
        out: list[Sample] = []
        tables: dict[str, list[tuple[int, int, str]]] = {}
        read = 0
        for pid, role in self.targets().items():
            try:
                out += self._one(self.proc / str(pid), role, tables)
                read += 1
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited between the listing and the read: normal for a worker
        if not read:
            raise CollectorError("every followed process is gone")
        if self.port is not None and self._holders:
            out += self._listen_queue(min(self._holders))
        return out

    def _listen_queue(self, holder: int) -> list[Sample]:
        """The listening socket's accept queue, read in the holder's network namespace
        (nothing when the socket closed since its holders were found)."""
        lab = {"port": str(self.port)}
        if str(self.proc) == "/proc" and same_netns(holder):
            try:
                queued, limit = listen_queues().get(self.port or 0, (None, None))
            except OSError:
                pass  # netlink refused: read the text tables
            else:
                if queued is None or limit is None:
                    return []  # the socket closed since the holders were found
                return [
                    Sample("service_listen_queue_length", lab, float(queued)),
                    Sample("service_listen_queue_limit", lab, float(limit)),
                ]
        found = False
        total = 0
        for table in ("tcp", "tcp6"):
            try:
                text = (self.proc / str(holder) / "net" / table).read_text()
            except FileNotFoundError:
                continue  # no IPv6
            queues = pf.parse_listen_queues(text)
            if self.port in queues:
                found = True
                total += queues[self.port]
        return [Sample("service_listen_queue_length", lab, float(total))] if found else []

    def _one(
        self, base: Path, role: str, tables: dict[str, list[tuple[int, int, str]]]
    ) -> list[Sample]:
        comm = (base / "comm").read_text().strip()
        status = pf.parse_meminfo((base / "status").read_text())
        stat = (base / "stat").read_text()
        if "VmRSS" not in status:
            raise FileNotFoundError(base)  # a zombie: exited, not yet reaped
        lab = {"pid": base.name, "process": comm, "role": role}
        # Fields after the ")" closing the command: utime and stime are 14th and 15th.
        after = stat[stat.rfind(")") + 2 :].split()
        cpu = (int(after[11]) + int(after[12])) / self._clk_tck
        out = [
            Sample("service_process_resident_memory_bytes", lab, float(status["VmRSS"])),
            Sample("service_process_threads", lab, float(status["Threads"])),
            Sample("service_process_cpu_seconds_total", lab, cpu),
        ]
        out += self._fds(base, lab, tables)
        return out

    def _rows(
        self, base: Path, tables: dict[str, list[tuple[int, int, str]]]
    ) -> list[tuple[int, int, str]]:
        """The tcp rows of the process's namespace, read once per namespace per scrape."""
        try:
            key = os.readlink(base / "ns" / "net")
        except OSError:
            key = base.name  # no namespace link (a fixture, or not ours): its own tables
        rows = tables.get(key)
        if rows is None:
            rows = tables[key] = list(_tcp_rows(self.proc, base.name))
        return rows

    def _fds(
        self, base: Path, lab: dict[str, str], tables: dict[str, list[tuple[int, int, str]]]
    ) -> list[Sample]:
        out: list[Sample] = []
        try:
            nfds = sum(1 for _ in os.scandir(base / "fd"))
            out.append(Sample("service_process_open_fds", lab, float(nfds)))
            inodes = _socket_inodes(base / "fd")
        except PermissionError:
            self.count_error("fd_permission")  # another user's process: no fd view
            inodes = set()
        out += self._limit(base, lab)
        states = dict.fromkeys(pf.TCP_STATES.values(), 0)
        if inodes:
            for _, st, inode in self._rows(base, tables):
                if inode in inodes:
                    name = pf.TCP_STATES.get(st, "unknown")
                    states[name] = states.get(name, 0) + 1
        for state, n in states.items():
            out.append(Sample("service_process_connections", {**lab, "state": state}, float(n)))
        return out

    def _limit(self, base: Path, lab: dict[str, str]) -> list[Sample]:
        try:
            text = (base / "limits").read_text()
        except FileNotFoundError:
            raise
        except OSError:
            self.count_error("limits_unreadable")
            return []
        for line in text.splitlines():
            if line.startswith("Max open files"):
                soft = line.split()[3]
                if soft.isdigit():
                    return [Sample("service_process_max_fds", lab, float(soft))]
        return []
