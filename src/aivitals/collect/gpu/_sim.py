"""A SIMULATED GPU for machines without one, shared between processes.

Nothing here touches a real device. The state lives in one JSON file under
``state_dir``, guarded by an ``fcntl`` lock, so the demo service (which
allocates and runs "kernels"), the fault injector (which leaks, injects Xids,
slows the clock) and the agent (which samples) all see the same device. Every
series the ``sim`` backend emits carries ``backend="sim"``.

What is modelled: capacity and per-process allocations (a dead process's
allocations are released, as the driver does), utilization from the busy time
callers report, a clock slowdown standing in for a co-tenant's kernels,
Xid events and OOM. What is made up from those: temperature, power and clocks
follow utilization on an H200-like scale, so a dashboard moves, but they carry
no information beyond utilization and the slowdown factor.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ..._tempdir import temp_root
from ...errors import ConfigError
from .._xid import xid_meaning

__all__ = [
    "XID_LOST",
    "SimDevice",
    "SimGPU",
    "SimGpuLostError",
    "SimOutOfMemoryError",
    "default_sim_dir",
]

_VERSION = 1
_BUCKET = 0.1  # seconds of busy-time resolution
_HORIZON = 60.0  # busy history kept; also the longest utilization window
_XID_KEEP = 100
_GIB = float(2**30)
_DECODER = json.JSONDecoder()


class SimGpuLostError(RuntimeError):
    """The simulated device fell off the bus (Xid 79) and was not reset yet; the message
    names the Xid, so ``signals.classify_exception`` maps it to ``XID``."""


#: The Xid after which a device is gone until reset (79: GPU has fallen off the bus).
XID_LOST = 79


class SimOutOfMemoryError(RuntimeError):
    """The simulated device has no room; the message is torch's, so
    ``signals.classify_exception`` maps it to ``CUDA_OOM`` as it would a real one."""


@dataclass(frozen=True, slots=True)
class SimDevice:
    """A read-only view of one simulated device at one instant."""

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    processes: dict[int, int]
    utilization: float
    clock_slowdown: float
    xid_counts: dict[int, int]
    last_xid: int | None

    @property
    def memory_free(self) -> int:
        return max(0, self.memory_total - self.memory_used)


def default_sim_dir() -> str:
    """Where the simulated GPU's state lives unless told: ``$AIVITALS_SIM_GPU_DIR``,
    else ``<tmp>/aivitals-sim-gpu`` (the demo, the chaos runner and the agent agree)."""
    return os.environ.get("AIVITALS_SIM_GPU_DIR") or os.path.join(temp_root(), "aivitals-sim-gpu")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _new_device(index: int, memory_total: int) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"SIM-GPU-{uuid.uuid4()}",
        "name": "aivitals simulated GPU",
        "memory_total": memory_total,
        "allocations": {},
        "tags": {},
        "busy": {},
        "clock_slowdown": 1.0,
        "oom_pending": 0,
        "xid_counts": {},
        "last_xid": None,
        "xids": [],
        # Xid 79: the device fell off the bus; every allocation and kernel fails until reset
        "lost": False,
    }


def _utilization(dev: dict[str, Any], now: float, window: float) -> float:
    start = now - window
    busy = 0.0
    for key, seconds in dev["busy"].items():
        b0 = int(key) * _BUCKET
        overlap = min(b0 + _BUCKET, now) - max(b0, start)
        if overlap > 0:
            busy += float(seconds) * overlap / _BUCKET
    own = busy / window
    # A co-tenant slowing our kernels by f keeps the SMs busy the rest of the time.
    slowdown = float(dev["clock_slowdown"])
    background = 1.0 - 1.0 / slowdown
    return max(0.0, min(1.0, own + background))


class SimGPU:
    """A simulated GPU (or several) whose state is shared through a file.

    The first ``SimGPU`` made on a ``state_dir`` creates the devices; later ones
    (in this or other processes) use the existing state and ignore ``devices``
    and ``memory_total``.

    **Usage**::

        gpu = SimGPU("/tmp/aivitals-sim", memory_total=16 * 2**30)
        gpu.allocate(os.getpid(), 2 * 2**30, tag="weights")
        gpu.busy(0, 0.012)          # a 12 ms kernel just ran
        gpu.inject_xid(0, 79)       # GPU has fallen off the bus (simulated)
        gpu.devices()[0].memory_used
    """

    def __init__(
        self, state_dir: str | os.PathLike[str], *, devices: int = 1, memory_total: int = 80 * 2**30
    ) -> None:
        if devices < 1:
            raise ConfigError(f"devices must be >= 1, got {devices!r}")
        if memory_total <= 0:
            raise ConfigError(f"memory_total must be > 0 bytes, got {memory_total!r}")
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._path = self.state_dir / "simgpu.json"
        self._lock_path = self.state_dir / "simgpu.lock"
        with self._locked(exclusive=True):
            if self._read() is None:
                state = {
                    "version": _VERSION,
                    "devices": [_new_device(i, memory_total) for i in range(devices)],
                    "xid_seq": 0,
                }
                self._write(state)

    # --- file state ------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, *, exclusive: bool) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _read(self) -> dict[str, Any] | None:
        try:
            # raw_decode: a writer killed between its write and its truncate
            # leaves the old file's tail after a complete new document.
            state, _ = _DECODER.raw_decode(self._path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"sim GPU state {str(self._path)!r} is unreadable: {exc}") from exc
        if not isinstance(state, dict) or state.get("version") != _VERSION:
            raise ConfigError(f"sim GPU state {str(self._path)!r} is not version {_VERSION} state")
        return cast(dict[str, Any], state)

    def _write(self, state: dict[str, Any]) -> None:
        # Written in place under the exclusive lock; every reader takes the
        # shared lock, so none sees half a file (and no rename per kernel call).
        data = json.dumps(state, separators=(",", ":")).encode()
        fd = os.open(self._path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _modify(self) -> Iterator[dict[str, Any]]:
        with self._locked(exclusive=True):
            state = self._read()
            if state is None:
                raise ConfigError(f"sim GPU state {str(self._path)!r} was removed")
            _release_dead(state)
            yield state
            self._write(state)

    def _device(self, state: dict[str, Any], gpu: int) -> dict[str, Any]:
        devs: list[dict[str, Any]] = state["devices"]
        if not 0 <= gpu < len(devs):
            raise ConfigError(f"gpu must be in 0..{len(devs) - 1}, got {gpu!r}")
        return devs[gpu]

    # --- what the service does ---------------------------------------------------------
    def allocate(self, pid: int, nbytes: int, *, gpu: int = 0, tag: str = "") -> None:
        """Reserve ``nbytes`` for ``pid``; ``SimOutOfMemoryError`` when it does not fit."""
        if nbytes < 0:
            raise ConfigError(f"nbytes must be >= 0, got {nbytes!r}")
        refused = ""
        with self._modify() as state:
            dev = self._device(state, gpu)
            allocs: dict[str, int] = dev["allocations"]
            used = sum(allocs.values())
            total = int(dev["memory_total"])
            if dev.get("lost"):
                refused = "lost"
            elif dev["oom_pending"] > 0 or used + nbytes > total:
                dev["oom_pending"] = max(0, dev["oom_pending"] - 1)
                refused = _oom_message(gpu, nbytes, total, used, allocs.get(str(pid), 0))
            else:
                allocs[str(pid)] = allocs.get(str(pid), 0) + nbytes
                if tag:
                    dev["tags"][str(pid)] = tag
        if refused == "lost":
            raise SimGpuLostError(
                f"CUDA error: unspecified launch failure on GPU {gpu} "
                f"(Xid {XID_LOST}: GPU has fallen off the bus; reset it)"
            )
        if refused:  # raised after the state (the used-up injected OOM) is written
            raise SimOutOfMemoryError(refused)

    def free(self, pid: int, nbytes: int | None = None, *, gpu: int = 0) -> None:
        """Release ``nbytes`` of ``pid``'s allocations, or all of them when None."""
        with self._modify() as state:
            dev = self._device(state, gpu)
            key = str(pid)
            held = int(dev["allocations"].get(key, 0))
            left = 0 if nbytes is None else max(0, held - nbytes)
            if left:
                dev["allocations"][key] = left
            else:
                dev["allocations"].pop(key, None)
                dev["tags"].pop(key, None)

    def busy(self, gpu: int, seconds: float, *, now: float | None = None) -> None:
        """Record that a kernel ran for ``seconds`` ending now; drives utilization."""
        if seconds < 0:
            raise ConfigError(f"seconds must be >= 0, got {seconds!r}")
        end = time.time() if now is None else now
        with self._modify() as state:
            dev = self._device(state, gpu)
            buckets: dict[str, float] = dev["busy"]
            t = end - seconds
            while t < end:
                b = int(t // _BUCKET)
                step = min(end, (b + 1) * _BUCKET) - t
                buckets[str(b)] = buckets.get(str(b), 0.0) + step
                t += step
                if step <= 0:
                    break
            oldest = int((end - _HORIZON) // _BUCKET)
            for key in [k for k in buckets if int(k) < oldest]:
                del buckets[key]

    # --- what faults do ----------------------------------------------------------------
    def set_clock_slowdown(self, gpu: int, factor: float) -> None:
        """Slow kernels by ``factor`` (>= 1), as a co-tenant's kernels would."""
        if not factor >= 1.0:
            raise ConfigError(f"factor must be >= 1.0, got {factor!r}")
        with self._modify() as state:
            self._device(state, gpu)["clock_slowdown"] = float(factor)

    def clock_slowdown(self, gpu: int = 0) -> float:
        """The current slowdown factor; a simulated inference multiplies its time by it."""
        return self.device(gpu).clock_slowdown

    def inject_xid(self, gpu: int, code: int, pid: int | None = None) -> None:
        """Record an Xid event as the driver would (counted, last code kept)."""
        if code <= 0:
            raise ConfigError(f"Xid code must be > 0, got {code!r}")
        with self._modify() as state:
            dev = self._device(state, gpu)
            state["xid_seq"] += 1
            counts: dict[str, int] = dev["xid_counts"]
            counts[str(code)] = counts.get(str(code), 0) + 1
            dev["last_xid"] = code
            if code == XID_LOST:
                dev["lost"] = True
            dev["xids"].append(
                {"seq": state["xid_seq"], "time": time.time(), "code": code, "pid": pid}
            )
            del dev["xids"][:-_XID_KEEP]

    def reset(self, gpu: int = 0) -> None:
        """Reset the device (``nvidia-smi -r``): a lost one (Xid 79) works again."""
        with self._modify() as state:
            self._device(state, gpu)["lost"] = False

    def lost(self, gpu: int = 0) -> bool:
        """Whether the device fell off the bus (Xid 79) and was not reset since."""
        with self._locked(exclusive=False):
            state = self._read()
        return state is not None and bool(self._device(state, gpu).get("lost"))

    def inject_oom(self, gpu: int = 0, count: int = 1) -> None:
        """Make the next ``count`` allocations on ``gpu`` fail with an OOM."""
        if count < 0:
            raise ConfigError(f"count must be >= 0, got {count!r}")
        with self._modify() as state:
            self._device(state, gpu)["oom_pending"] = count

    # --- what the collector reads ------------------------------------------------------
    def processes(self, gpu: int = 0) -> dict[int, int]:
        """Bytes held per live pid."""
        return dict(self.device(gpu).processes)

    def device(self, gpu: int = 0, *, window: float = 1.0) -> SimDevice:
        devs = self.devices(window=window)
        if not 0 <= gpu < len(devs):
            raise ConfigError(f"gpu must be in 0..{len(devs) - 1}, got {gpu!r}")
        return devs[gpu]

    def devices(self, *, window: float = 1.0, now: float | None = None) -> list[SimDevice]:
        """A consistent view of every device; utilization over the last ``window`` s."""
        window = max(_BUCKET, min(_HORIZON, window))
        at = time.time() if now is None else now
        with self._locked(exclusive=False):
            state = self._read()
        if state is None:
            raise ConfigError(f"sim GPU state {str(self._path)!r} was removed")
        return [_view(dev, at, window) for dev in state["devices"]]

    def xid_events(self, gpu: int = 0, *, after_seq: int = 0) -> list[dict[str, Any]]:
        """Xid events with a sequence number above ``after_seq`` (for event cursors)."""
        with self._locked(exclusive=False):
            state = self._read()
        if state is None:
            return []
        xids: list[dict[str, Any]] = self._device(state, gpu)["xids"]
        return [dict(x, meaning=xid_meaning(int(x["code"]))) for x in xids if x["seq"] > after_seq]


def _release_dead(state: dict[str, Any]) -> None:
    for dev in state["devices"]:
        for key in [k for k in dev["allocations"] if not _alive(int(k))]:
            del dev["allocations"][key]
            dev["tags"].pop(key, None)


def _view(dev: dict[str, Any], now: float, window: float) -> SimDevice:
    procs = {int(k): int(v) for k, v in dev["allocations"].items() if _alive(int(k))}
    return SimDevice(
        index=int(dev["index"]),
        uuid=str(dev["uuid"]),
        name=str(dev["name"]),
        memory_total=int(dev["memory_total"]),
        memory_used=sum(procs.values()),
        processes=procs,
        utilization=_utilization(dev, now, window),
        clock_slowdown=float(dev["clock_slowdown"]),
        xid_counts={int(k): int(v) for k, v in dev["xid_counts"].items()},
        last_xid=None if dev["last_xid"] is None else int(dev["last_xid"]),
    )


def _oom_message(gpu: int, nbytes: int, total: int, used: int, own: int) -> str:
    free = max(0, total - used)
    return (
        f"CUDA out of memory. Tried to allocate {nbytes / _GIB:.2f} GiB. GPU {gpu} has a total "
        f"capacity of {total / _GIB:.2f} GiB of which {free / _GIB:.2f} GiB is free. "
        f"This process has {own / _GIB:.2f} GiB memory in use. (simulated GPU, aivitals sim)"
    )
