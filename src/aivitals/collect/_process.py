"""The served process, found by pid or by the TCP port it listens on.

Read from ``/proc/<pid>`` (injectable ``proc=``): RSS, open fds and their
limit, threads, CPU seconds, and its TCP connections by state (its socket
inodes matched against the tcp tables of its network namespace).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import CollectorError, ConfigError
from ..signals import Sample
from . import _procfs as pf
from ._health import BaseCollector
from ._sockdiag import same_netns, tcp_sockets

__all__ = ["ProcessCollector", "find_listener"]


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
    """The pid of the process listening on TCP ``port``, or None."""
    root = Path(proc)
    listening = {inode for p, st, inode in _tcp_rows(root, "self") if p == port and st == 10}
    if not listening:
        return None
    for entry in os.scandir(root):
        if not entry.name.isdigit():
            continue
        try:
            if _socket_inodes(Path(entry.path, "fd")) & listening:
                return int(entry.name)
        except OSError:
            continue  # another user's process, or gone
    return None


class ProcessCollector(BaseCollector):
    """The ``process`` collector for one served process.

    **Usage**::

        ProcessCollector(port=8000)      # whoever listens on 8000, re-found if it restarts
        ProcessCollector(pid=1234)
    """

    name = "process"

    def __init__(self, *, pid: int | None = None, port: int | None = None, proc: str = "/proc"):
        super().__init__()
        if (pid is None) == (port is None):
            raise ConfigError("give exactly one of pid= or port=")
        self.pid = pid
        self.port = port
        self.proc = Path(proc)
        self._clk_tck = float(os.sysconf("SC_CLK_TCK"))
        self._found: int | None = pid

    def _target(self) -> int:
        if self._found is not None and (self.proc / str(self._found)).exists():
            return self._found
        if self.port is None:
            raise CollectorError(f"process {self.pid} is gone")
        self._found = find_listener(self.port, proc=str(self.proc))
        if self._found is None:
            raise CollectorError(f"no process listens on port {self.port}")
        return self._found

    def _collect(self) -> Iterable[Sample]:
        pid = str(self._target())
        base = self.proc / pid
        try:
            comm = (base / "comm").read_text().strip()
            status = pf.parse_meminfo((base / "status").read_text())
            stat = (base / "stat").read_text()
        except FileNotFoundError as exc:
            raise CollectorError(f"process {pid} is gone") from exc
        lab = {"pid": pid, "process": comm}
        # Fields after the ")" closing the command: utime and stime are 14th and 15th.
        after = stat[stat.rfind(")") + 2 :].split()
        cpu = (int(after[11]) + int(after[12])) / self._clk_tck
        out = [
            Sample("service_process_resident_memory_bytes", lab, float(status["VmRSS"])),
            Sample("service_process_threads", lab, float(status["Threads"])),
            Sample("service_process_cpu_seconds_total", lab, cpu),
        ]
        out += self._fds(base, lab)
        return out

    def _fds(self, base: Path, lab: dict[str, str]) -> list[Sample]:
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
            for _, st, inode in _tcp_rows(self.proc, base.name):
                if inode in inodes:
                    name = pf.TCP_STATES.get(st, "unknown")
                    states[name] = states.get(name, 0) + 1
        for state, n in states.items():
            out.append(Sample("service_process_connections", {**lab, "state": state}, float(n)))
        return out

    def _limit(self, base: Path, lab: dict[str, str]) -> list[Sample]:
        try:
            text = (base / "limits").read_text()
        except OSError:
            self.count_error("limits_unreadable")
            return []
        for line in text.splitlines():
            if line.startswith("Max open files"):
                soft = line.split()[3]
                if soft.isdigit():
                    return [Sample("service_process_max_fds", lab, float(soft))]
        return []
