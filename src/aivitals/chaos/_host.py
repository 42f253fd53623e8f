"""Host faults for real: CPU burn, disk IO saturation, a connection flood."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ._fault import Fault, FaultContext, FaultEffect, Touch

__all__ = ["ConnectionFlood", "CpuBurn", "DiskIOSaturation"]


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


class ConnectionFlood(Fault):
    """``connections`` idle keep-alive connections held open to the service
    (each sends one ``GET path`` first), reopened when the server closes them."""

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
