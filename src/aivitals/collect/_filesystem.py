"""Filesystem space per mount: /proc/self/mounts, then ``statvfs`` on each mount point.

Which mounts count follows node_exporter's filesystem collector (its
``--collector.filesystem.mount-points-exclude`` and ``fs-types-exclude`` defaults,
collector/filesystem_linux.go, as its ``--help`` prints them)::

    ^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)
    ^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs|
      iso9660|mqueue|nsfs|overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs|
      squashfs|sysfs|tracefs)$

so a scraped node_exporter and the host collector report the same mounts.

``statvfs`` on a dead network mount blocks in the kernel, and no timeout can
interrupt it: each call runs on its own daemon thread, the scrape waits for them
all until one deadline, and a mount whose call has not returned is *stuck*: it is
skipped (reported as a device error) until that call returns, so a hung NFS server
costs one thread, never a thread per scrape, and never the scrape.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "FS_TYPES_EXCLUDE",
    "MOUNT_POINTS_EXCLUDE",
    "Mount",
    "MountStats",
    "StatvfsPool",
    "parse_mounts",
]

MOUNT_POINTS_EXCLUDE = re.compile(
    r"^/(dev|proc|run/credentials/.+|sys|var/lib/docker/.+|var/lib/containers/storage/.+)($|/)"
)
FS_TYPES_EXCLUDE = re.compile(
    r"^(autofs|binfmt_misc|bpf|cgroup2?|configfs|debugfs|devpts|devtmpfs|fusectl|hugetlbfs"
    r"|iso9660|mqueue|nsfs|overlay|proc|procfs|pstore|rpc_pipefs|securityfs|selinuxfs"
    r"|squashfs|sysfs|tracefs)$"
)
# fstab(5) escapes: space, tab, newline and the backslash itself are written in octal
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True, slots=True)
class Mount:
    device: str
    mountpoint: str
    fstype: str

    @property
    def labels(self) -> dict[str, str]:
        return {"mountpoint": self.mountpoint, "device": self.device, "fstype": self.fstype}


@dataclass(frozen=True, slots=True)
class MountStats:
    """Bytes and inodes of one filesystem, as ``statvfs`` counts them."""

    size: float
    free: float
    available: float
    files: float
    files_free: float
    readonly: bool


def _unescape(field: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """The mounts of /proc/<pid>/mounts that hold real data, one per mount point.

    Pseudo filesystems and excluded mount points are left out. A mount point
    mounted over is listed twice by the kernel, but ``statvfs`` sees only the top
    one: the last line wins, so its numbers carry its own device and type.
    """
    out: dict[str, Mount] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = Mount(_unescape(fields[0]), _unescape(fields[1]), fields[2])
        if MOUNT_POINTS_EXCLUDE.match(mount.mountpoint) or FS_TYPES_EXCLUDE.match(mount.fstype):
            continue
        out.pop(mount.mountpoint, None)
        out[mount.mountpoint] = mount
    return list(out.values())


def stats_of(result: os.statvfs_result) -> MountStats:
    """Bytes from a ``statvfs`` result: blocks are counted in fragments (``f_frsize``)."""
    unit = float(result.f_frsize or result.f_bsize)
    return MountStats(
        size=result.f_blocks * unit,
        free=result.f_bfree * unit,
        available=result.f_bavail * unit,
        files=float(result.f_files),
        files_free=float(result.f_ffree),
        readonly=bool(result.f_flag & os.ST_RDONLY),
    )


class _Call:
    """One ``statvfs`` on its own daemon thread; ``done`` once it returned or raised."""

    def __init__(self, statvfs: Callable[[str], os.statvfs_result], path: str) -> None:
        self.done = threading.Event()
        self.result: os.statvfs_result | None = None
        self.error: OSError | None = None
        self._statvfs, self._path = statvfs, path
        threading.Thread(target=self._run, name=f"statvfs {path}", daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._statvfs(self._path)
        except OSError as exc:
            self.error = exc
        finally:
            self.done.set()


class StatvfsPool:
    """``statvfs`` of many mount points within one deadline, remembering stuck ones.

    ``stat(paths)`` returns, per path, the result or the reason it has none:
    ``"timeout"`` (the call did not return within ``timeout`` seconds; it is left
    running), ``"stuck"`` (an earlier call has still not returned, so no new one is
    made) or the ``OSError`` it raised.
    """

    def __init__(
        self, statvfs: Callable[[str], os.statvfs_result] = os.statvfs, timeout: float = 1.0
    ) -> None:
        self.statvfs = statvfs
        self.timeout = timeout
        self._stuck: dict[str, _Call] = {}

    def stat(self, paths: list[str]) -> dict[str, os.statvfs_result | OSError | str]:
        out: dict[str, os.statvfs_result | OSError | str] = {}
        calls: dict[str, _Call] = {}
        for path in paths:
            old = self._stuck.get(path)
            if old is not None and not old.done.is_set():
                out[path] = "stuck"
                continue
            self._stuck.pop(path, None)
            calls[path] = _Call(self.statvfs, path)
        deadline = time.monotonic() + self.timeout
        for path, call in calls.items():
            if not call.done.wait(max(0.0, deadline - time.monotonic())):
                self._stuck[path] = call
                out[path] = "timeout"
            elif call.error is not None:
                out[path] = call.error
            else:
                assert call.result is not None
                out[path] = call.result
        # a mount that went away with its call still hanging is no one's to wait for
        for path in set(self._stuck) - set(paths):
            if self._stuck[path].done.is_set():
                del self._stuck[path]
        return {p: out[p] for p in paths}
