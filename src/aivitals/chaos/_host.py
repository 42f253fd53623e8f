"""Host faults for real: CPU burn, disk IO saturation, a log volume filling the disk,
a connection flood."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FaultRefused
from ._fault import Fault, FaultContext, FaultEffect, Touch

__all__ = ["ConnectionFlood", "CpuBurn", "DiskFill", "DiskIOSaturation"]

_MIB = 1 << 20
#: What a disk fill must leave free on the filesystem it writes to: the bound is
#: the fault's, the machine's other users must not meet a full disk.
_KEEP_FREE = 1 << 30


class CpuBurn(Fault):
    """Busy CPU workers: stress-ng when installed, Python processes otherwise.

    ``workers`` 0 means one per CPU; ``load`` is the percent each keeps busy.
    """

    name = "cpu_burn"
    params = {"workers": (0, 0, 256), "load": (100, 1, 100)}
    touches = (
        Touch(
            "",
            "starts stress-ng (or Python busy loops) in a session of the run",
            "the run: stopped at revert (and by their own timeout); cleanup stops them "
            "after a crash",
            processes=True,
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        workers = int(self.values["workers"]) or (os.cpu_count() or 1)
        load = int(self.values["load"])
        stress = shutil.which("stress-ng")
        if stress:
            timeout = f"{int(self.duration) + 10}s"
            argv = [
                stress,
                "--cpu",
                str(workers),
                "--cpu-load",
                str(load),
                "--timeout",
                timeout,
                "--quiet",
            ]
            pid = self.spawn(argv, label="cpu_burn")
        else:
            pid = self.helper("cpu", "cpu_burn", workers=workers, load=load)
        tool = "stress-ng" if stress else "python"
        return FaultEffect(
            client_url=ctx.target, details={"tool": tool, "pid": pid, "workers": workers}
        )


def _fio_engine(fio: str) -> list[str]:
    """libaio with 4 writes in flight when fio has it, else synchronous writes."""
    try:
        engines = subprocess.run(
            [fio, "--enghelp"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        engines = ""
    if "libaio" in engines:
        return ["--ioengine=libaio", "--iodepth=4"]
    return ["--ioengine=psync"]


class DiskIOSaturation(Fault):
    """Direct writes in a temp dir of the run: fio when installed, Python
    writes + fsync otherwise. The file never grows past ``size_mib``."""

    name = "disk_io_saturation"
    params = {"size_mib": (256, 1, 8192), "jobs": (2, 1, 16)}
    touches = (
        Touch(
            "",
            "starts fio (or a Python writer) and a temp dir aivitals-chaos-<run>-* under "
            "work_dir (/var/tmp)",
            "the run: the writer is stopped and the dir removed at revert; cleanup does "
            "both after a crash",
            processes=True,
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        assert self.run is not None
        parent = ctx.work_dir or Path("/var/tmp")
        parent.mkdir(parents=True, exist_ok=True)
        # The run dir may sit on tmpfs; a real disk is what must be saturated.
        target = Path(tempfile.mkdtemp(prefix=f"aivitals-chaos-{self.run.run_id}-", dir=parent))
        self.record("path", path=str(target))
        size = int(self.values["size_mib"])
        fio = shutil.which("fio")
        if fio:
            argv = [
                fio,
                "--name=aivitals-disk-fault",
                f"--directory={target}",
                # Large direct writes, several in flight per job, keep the device
                # busy ~100% of the time at under a fifth of a core even when the
                # service takes both cores (synchronous writes left it idle
                # whenever fio waited for a CPU; 4 KiB writes with an fsync each
                # reached 77% busy and burned CPU instead).
                "--rw=write",
                "--bs=1M",
                f"--size={max(1, size // int(self.values['jobs']))}M",
                f"--numjobs={int(self.values['jobs'])}",
                *_fio_engine(fio),
                "--direct=1",
                "--time_based",
                f"--runtime={int(self.duration) + 10}",
                "--group_reporting",
                "--output-format=terse",
            ]
            pid = self.spawn(argv, label="disk_io")
        else:
            pid = self.helper("disk", "disk_io", dir=str(target), size_bytes=size << 20)
        tool = "fio" if fio else "python"
        return FaultEffect(
            client_url=ctx.target, details={"tool": tool, "pid": pid, "dir": str(target)}
        )


class DiskFill(Fault):
    """A log volume filling up: log files grow at ``mib_per_s`` (fsynced appends, as a
    logger that must not lose lines writes them) until the volume is full or
    ``max_mib`` are written, then stay until the revert removes them.

    A fault that fills nothing is no disk fill: logs written on a disk with many GiB
    free never threaten to fill it, so no honest DiskWillFill fires. As root, the logs
    get a filesystem of their own, ``volume_mib`` big, mounted for the run under its
    run directory, as a log volume is: an ext4 image (sparse, under ``work_dir``) on a
    loop device, so the writes reach the disk beneath; a size-limited tmpfs where
    mkfs.ext4 or a loop mount is missing. Unmounted and removed at revert; ``aivitals
    chaos cleanup`` does both after a crash. ``volume_mib=0``, or a run without root,
    writes in a temp dir under ``work_dir`` instead (the effect's ``note`` says that the
    disk alerts cannot be expected there).

    Bounded: by ``max_mib`` and the volume, and by the filesystem under ``work_dir``,
    which must keep 1 GiB free once the image or the files are written (else
    ``FaultRefused``); a tmpfs volume may take at most half the available memory.
    """

    name = "disk_fill"
    params = {"mib_per_s": (4, 0.1, 256), "max_mib": (256, 1, 16384), "volume_mib": (64, 0, 4096)}
    touches = (
        Touch(
            "",
            "as root (volume_mib > 0): a sparse ext4 image aivitals-chaos-<run>-volume-*.img "
            "under work_dir (/var/tmp), loop-mounted (or a size-limited tmpfs) on volume/ in "
            "the run dir; otherwise a temp dir aivitals-chaos-<run>-logs-* under work_dir; "
            "and a Python log writer filling it",
            "the run: the writer is stopped, the volume unmounted and the image and dirs "
            "removed at revert; cleanup does all of it after a crash",
            processes=True,
        ),
    )

    def _validate(self, given: dict[str, Any]) -> dict[str, float]:
        values = super()._validate(given)
        if 0 < values["volume_mib"] < _MIN_VOLUME_MIB:
            raise ConfigError(
                f"fault {self.name!r}: volume_mib={values['volume_mib']:g} is too small for a "
                f"filesystem: 0 (no volume) or at least {_MIN_VOLUME_MIB}"
            )
        return values

    def _start(self, ctx: FaultContext) -> FaultEffect:
        assert self.run is not None
        parent = ctx.work_dir or Path("/var/tmp")
        parent.mkdir(parents=True, exist_ok=True)
        limit = int(self.values["max_mib"] * _MIB)
        volume, note = None, ""
        if self.values["volume_mib"] and os.geteuid() != 0:
            note = _NO_VOLUME + " (not root)"
        elif self.values["volume_mib"]:
            try:
                volume = self._volume(parent)
            except _NoVolume as exc:
                note = f"{_NO_VOLUME} ({exc})"
        target = self._log_dir(parent, limit) if volume is None else Path(volume["mountpoint"])
        rate = self.values["mib_per_s"] * _MIB
        pid = self.helper("log_fill", "disk_fill", dir=str(target), rate=rate, max_bytes=limit)
        details: dict[str, Any] = {
            "pid": pid,
            "dir": str(target),
            "max_bytes": limit,
            "bytes_per_s": rate,
            "volume": volume,
        }
        if note:
            details["note"] = note
        return FaultEffect(client_url=ctx.target, details=details)

    def _log_dir(self, parent: Path, limit: int) -> Path:
        assert self.run is not None
        _keep_free(self.name, parent, limit, "max_mib", self.values["max_mib"])
        # journaled before it exists: a crash right after mkdir still leaves it to cleanup
        target = parent / f"aivitals-chaos-{self.run.run_id}-logs-{secrets.token_hex(4)}"
        self.record("path", path=str(target))
        target.mkdir(mode=0o700)
        return target

    def _volume(self, parent: Path) -> dict[str, Any]:
        """Mount a filesystem of ``volume_mib`` for the logs; ``_NoVolume`` when this
        machine cannot (what was made is left to the revert, journaled)."""
        assert self.run is not None
        size = int(self.values["volume_mib"] * _MIB)
        mountpoint = self.run.path / "volume"
        self.record("path", path=str(mountpoint))
        mountpoint.mkdir(mode=0o700)
        mkfs = shutil.which("mkfs.ext4")
        if mkfs is not None:
            _keep_free(self.name, parent, size, "volume_mib", self.values["volume_mib"])
            image = parent / f"aivitals-chaos-{self.run.run_id}-volume-{secrets.token_hex(4)}.img"
            self.record("path", path=str(image))
            with open(image, "wb") as f:
                f.truncate(size)  # sparse: the disk beneath holds only what is written
            if _ok([mkfs, "-q", "-F", "-L", "aivitals-chaos", str(image)]):
                self.record("mount", target=str(mountpoint))
                if _ok(["mount", "-o", "loop,nosuid,nodev,noexec", str(image), str(mountpoint)]):
                    return _described(mountpoint, "ext4", image)
        # no mkfs.ext4 or no loop device (a container): memory instead of a disk
        available = _mem_available()
        if available is not None and size > available // 2:
            raise _NoVolume(
                f"no ext4 image, and a {size // _MIB} MiB tmpfs would take more than half "
                f"the {available // _MIB} MiB of memory available"
            )
        self.record("mount", target=str(mountpoint))
        source = f"aivitals-chaos-{self.run.run_id}"
        opts = f"size={size},mode=0700,nosuid,nodev,noexec"
        if not _ok(["mount", "-t", "tmpfs", "-o", opts, source, str(mountpoint)]):
            raise _NoVolume("mounting a volume failed (no loop device, no tmpfs mount)")
        return _described(mountpoint, "tmpfs", None)


#: A volume smaller than this holds too little beside ext4's own metadata.
_MIN_VOLUME_MIB = 8
_NO_VOLUME = (
    "no volume: the logs go to work_dir's filesystem, whose free space they cannot "
    "threaten, so DiskWillFill and DiskSpaceLow cannot be expected"
)


class _NoVolume(Exception):
    """This machine cannot mount the fault's own volume."""


def _keep_free(fault: str, parent: Path, need: int, key: str, value: float) -> None:
    usage = shutil.disk_usage(parent)
    if usage.free - need < _KEEP_FREE:
        raise FaultRefused(
            f"fault {fault!r}: {key}={value:g} would leave "
            f"{max(0, usage.free - need) / _MIB:.0f} MiB free on the filesystem of "
            f"{parent} (it has {usage.free / _MIB:.0f} MiB free; at least "
            f"{_KEEP_FREE // _MIB} MiB must stay)"
        )


def _ok(argv: list[str]) -> bool:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _described(mountpoint: Path, fstype: str, image: Path | None) -> dict[str, Any]:
    st = os.statvfs(mountpoint)
    return {
        "mountpoint": str(mountpoint),
        "fstype": fstype,
        "image": None if image is None else str(image),
        "size_bytes": st.f_blocks * st.f_frsize,
        "available_bytes": st.f_bavail * st.f_frsize,
    }


class ConnectionFlood(Fault):
    """``connections`` idle keep-alive connections held open to the service
    (each sends one ``GET path`` first), reopened when the server closes them. They
    open over 5 s and reopen after a random 0.1-0.5 s, out of step like a real pool's."""

    name = "connection_flood"
    params = {"connections": (2000, 1, 20000)}
    touches = (
        Touch(
            "",
            "starts a helper process holding idle connections to the service",
            "the run: stopped at revert (and at its own deadline); cleanup stops it after a crash",
            processes=True,
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        host, port = ctx.host_port
        n = int(self.values["connections"])
        pid = self.helper(
            "flood", "connection_flood", host=host, port=port, connections=n, path="/healthz"
        )
        return FaultEffect(client_url=ctx.target, details={"pid": pid, "connections": n})
