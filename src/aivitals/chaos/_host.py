"""Host faults for real: CPU burn, disk IO saturation, a log volume filling the disk,
a connection flood."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FaultRefused
from ._fault import Fault, FaultContext, FaultEffect, Touch
from ._spec import (
    FaultSpec,
    Grading,
    Knob,
    Needs,
    PhaseWindow,
    Runs,
    SweepBasis,
    capped,
    peak,
    up,
)

__all__ = ["ConnectionFlood", "CpuBurn", "DiskFill", "DiskIOSaturation"]

_MIB = 1 << 20
#: What a disk fill must leave free on the filesystem it writes to: the bound is
#: the fault's, the machine's other users must not meet a full disk.
_KEEP_FREE = 1 << 30


# -- cpu_burn ----------------------------------------------------------------------------
def _cpu_knob(b: SweepBasis) -> Knob:
    # HostCPUSaturated, busy share over cpu_busy_ratio; demand = workers x load.
    busy = b.pack.cpu_busy_ratio
    return Knob(
        param="load",
        unit="share of the host's CPU time busy (the burner asks workers x load)",
        bound=busy,
        source=f"HostCPUSaturated cpu_busy_ratio {busy:g}; {b.cpus} CPUs",
        threshold={"workers": 0, "load": up(100 * busy, 1)},
        # twice the demand: twice the workers at the same load (a busy share cannot
        # pass 100 %, a run queue can)
        moderate={"workers": 2 * b.cpus, "load": up(100 * busy, 1)},
        note="today's value (every CPU at 100 %) is 1.1 x the threshold, under moderate's "
        "demand: severe is twice moderate's",
        severe={"workers": 4 * b.cpus, "load": up(100 * busy, 1)},
    )


def _cpu_demand(p: Mapping[str, Any], b: SweepBasis) -> float:
    workers = int(p["workers"]) or b.cpus
    return workers * float(p["load"]) / 100.0 / b.cpus


CPU_BURN = FaultSpec(
    name="cpu_burn",
    layer="infrastructure",
    description="host CPU saturated by another workload (stress-ng or Python)",
    alerts=("HostCPUSaturated",),
    signature="cpu_burn",
    # The demo's model runs on the CPU, so work that would load a GPU loads the host's CPU.
    consequences={
        "GPUUtilizationLow": "the burn slows every request past twice the SLA while the "
        "demo's device stays under its low-utilization bound",
        # a GPU-bound model would not slow
        "InferenceLatencyHigh": "the demo's model runs on the CPU the burn takes, so each "
        "inference gets a share of the cores and takes longer",
    },
    needs=Needs("host"),
    grading=Grading(
        knob=_cpu_knob,
        magnitude=_cpu_demand,
        # HostCPUSaturated's left side over the phase
        measure=lambda w, b: peak(
            w.end(
                "max(1 - sum without (mode) "
                '(rate(host_cpu_seconds_total{mode=~"idle|iowait"}[W])) / sum without (mode) '
                '(rate(host_cpu_seconds_total{mode!~"guest|guest_nice"}[W])))'
            ),
            "host_cpu_seconds_total",
        ),
        asked=lambda p, t, b: min(1.0, _cpu_demand(p, b)),  # a busy share cannot pass 100 %
        shown=("workers", "load"),
    ),
)


class CpuBurn(Fault):
    """Busy CPU workers: stress-ng when installed, Python processes otherwise.

    ``workers`` 0 means one per CPU; ``load`` is the percent each keeps busy.
    """

    name = "cpu_burn"
    spec = CPU_BURN
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


# -- disk_io_saturation ------------------------------------------------------------------
DISK_IO_SATURATION = FaultSpec(
    name="disk_io_saturation",
    layer="infrastructure",
    description="heavy direct writes saturate the disk (fio or Python), bounded size",
    alerts=("DiskSaturated",),
    signature="disk_io_saturation",
    consequences={
        # on a VM system time rises 0.03 -> 0.13-0.19 CPU-s/s and steal 0.01 -> 0.1-0.4
        # while the disk is saturated; a GPU-bound model would not slow
        "InferenceLatencyHigh": "the writer's direct I/O costs guest CPU time (system and "
        "steal) that the CPU-run model shares",
    },
    needs=Needs("host"),
    runs=Runs(quick_params={"size_mib": 1024, "jobs": 4}),
    grading=Grading(
        knob=lambda b: Knob(
            param=None,
            unit="busy share of the disk",
            bound=b.pack.disk_util_ratio,
            source=f"DiskSaturated disk_util_ratio {b.pack.disk_util_ratio:g} "
            "(DOMAIN: %util > 95 %)",
            note="one magnitude: fio writes flat out (one job already keeps the disk busy); "
            "jobs and size change the queue, not the busy share",
        ),
        # DiskSaturated's left side: a busy share cannot pass 100 % (io_ticks jumps can)
        measure=lambda w, b: peak(
            w.end("max(clamp_max(rate(host_disk_io_time_seconds_total[W]), 1))"),
            "host_disk_io_time_seconds_total",
        ),
    ),
)


class DiskIOSaturation(Fault):
    """Direct writes in a temp dir of the run: fio when installed, Python
    writes + fsync otherwise. The file never grows past ``size_mib``."""

    name = "disk_io_saturation"
    spec = DISK_IO_SATURATION
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


# -- disk_fill ---------------------------------------------------------------------------
DISK_FILL = FaultSpec(
    name="disk_fill",
    layer="infrastructure",
    description="a log volume fills up: log files grow at 4 MiB/s (fsynced appends) on a "
    "filesystem of its own the run mounts (as root: a 64 MiB ext4 image on a loop device, "
    "or a tmpfs) until it is full; without root, in a temp dir on a disk they cannot fill, "
    "where the alerts cannot fire",
    alerts=("DiskWillFill", "DiskSpaceLow"),
    # the signature names the condition, not the fault: a volume filled by a log, a core
    # dump or a runaway cache is the same full disk to the diagnosis
    signature="disk_full",
    needs=Needs("host"),
    # the fill's rate is read against the volume's level before it
    runs=Runs(quick_baseline=20.0),
    grading=Grading(
        knob=lambda b: Knob(
            param=None,
            unit="MiB/s written",
            bound=None,
            source="single severity: the run's volume fills at the fault's one rate",
            note="today's values at every severity",
        ),
        unmeasured="not graded: the volume fills to the end at any rate the phase allows",
    ),
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
    spec = DISK_FILL
    params = {
        "mib_per_s": (4, 0.1, 256),
        "max_mib": (256, 1, 16384),
        "volume_mib": (64, 0, 4096),
    }
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


# -- connection_flood --------------------------------------------------------------------
def _flood_knob(b: SweepBasis) -> Knob:
    # FdsNearLimit, open fds over fd_ratio of the service's limit.
    ratio, limit = b.pack.fd_ratio, b.fd_limit
    return Knob(
        param="connections",
        unit="share of the service's fd limit",
        bound=ratio,
        source=f"FdsNearLimit fd_ratio {ratio:g} of the stack's {limit:g} fds",
        threshold={"connections": up(ratio * limit, 1)},
        moderate={"connections": capped(up(ratio * limit, 1), 2 * ratio * limit, limit, 1)},
        note="capped: a share of the fd limit cannot pass 1, so severe is the limit and "
        "moderate halfway to it; the service's own fds come on top",
        severe={"connections": limit},
    )


def _flood_measure(w: PhaseWindow, b: SweepBasis) -> float | str:
    return peak(
        w.over("max(service_process_open_fds / service_process_max_fds)"),
        "service_process_open_fds",
    )


CONNECTION_FLOOD = FaultSpec(
    name="connection_flood",
    layer="service",
    description="2,000 idle keep-alive connections held open to the service",
    alerts=("FdsNearLimit",),
    signature="connection_flood",
    consequences={
        # uvicorn's keep-alive timeout is 5 s, and the flood reopens each connection
        "InferenceLatencyHigh": "2,000 connections reopened every few seconds with a "
        "request each load the service's loop, which shares the GIL and the cores with "
        "the CPU-run model",
    },
    needs=Needs("outside"),
    runs=Runs(quick_params={"connections": 2000}, quick_fault_max=40.0),
    grading=Grading(
        knob=_flood_knob,
        magnitude=lambda p, b: min(1.0, float(p["connections"]) / b.fd_limit),
        measure=_flood_measure,
    ),
)


class ConnectionFlood(Fault):
    """``connections`` idle keep-alive connections held open to the service
    (each sends one ``GET path`` first), reopened when the server closes them. They
    open over 5 s and reopen after a random 0.1-0.5 s, out of step like a real pool's."""

    name = "connection_flood"
    spec = CONNECTION_FLOOD
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
