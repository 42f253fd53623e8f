"""Host faults for real: CPU burn, disk IO saturation, a log volume filling the disk,
a connection flood."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import FaultRefused
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
    """A log volume filling the disk: log files grow at ``mib_per_s`` in a temp dir
    of the run until ``max_mib`` are written (fsynced appends, as a logger that must
    not lose lines writes them), then stay until the revert removes them.

    Bounded twice: by ``max_mib``, and by the filesystem's free space, which must
    stay above 1 GiB once the files are written (else ``FaultRefused``: this
    machine cannot host the fault at that size).
    """

    name = "disk_fill"
    params = {"mib_per_s": (4, 0.1, 256), "max_mib": (256, 1, 16384)}
    touches = (
        Touch(
            "",
            "starts a Python log writer and a temp dir aivitals-chaos-<run>-logs-* under "
            "work_dir (/var/tmp) that grows to max_mib",
            "the run: the writer is stopped and the dir removed at revert; cleanup does "
            "both after a crash",
            processes=True,
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        assert self.run is not None
        parent = ctx.work_dir or Path("/var/tmp")
        parent.mkdir(parents=True, exist_ok=True)
        limit = int(self.values["max_mib"] * _MIB)
        usage = shutil.disk_usage(parent)
        if usage.free - limit < _KEEP_FREE:
            raise FaultRefused(
                f"fault {self.name!r}: max_mib={self.values['max_mib']:g} would leave "
                f"{max(0, usage.free - limit) / _MIB:.0f} MiB free on the filesystem of "
                f"{parent} (it has {usage.free / _MIB:.0f} MiB free; at least "
                f"{_KEEP_FREE // _MIB} MiB must stay)"
            )
        # journaled before it exists: a crash right after mkdir still leaves it to cleanup
        target = parent / f"aivitals-chaos-{self.run.run_id}-logs-{secrets.token_hex(4)}"
        self.record("path", path=str(target))
        target.mkdir(mode=0o700)
        rate = self.values["mib_per_s"] * _MIB
        pid = self.helper("log_fill", "disk_fill", dir=str(target), rate=rate, max_bytes=limit)
        return FaultEffect(
            client_url=ctx.target,
            details={"pid": pid, "dir": str(target), "max_bytes": limit, "bytes_per_s": rate},
        )


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
