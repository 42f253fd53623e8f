"""The ``sim`` backend: reads a ``SimGPU`` and labels every series ``backend="sim"``."""

from __future__ import annotations

import time

from ...signals import Sample
from .._event import Event
from .._xid import xid_meaning
from ._common import CountError, process_name
from ._sim import SimDevice, SimGPU

__all__ = ["SimBackend"]

_IDLE_W, _MAX_W, _LIMIT_W = 75.0, 700.0, 700.0
_SM_HZ, _MEM_HZ = 1980e6, 3201e6


class SimBackend:
    """GPU samples from a simulated device; utilization is measured over the time
    since the previous read, so it follows the load the callers report.

    **Usage**::

        backend = SimBackend(SimGPU("/tmp/aivitals-sim"))
    """

    name = "sim"

    def __init__(self, sim: SimGPU, *, proc: str = "/proc") -> None:
        self.sim = sim
        self.proc = proc
        self._last: float | None = None
        self._cursor: dict[int, int] = {}
        self._xids_total = 0  # Xids in the state at the last read
        self._xids_drained = 0

    def read(self, count: CountError) -> list[Sample]:
        now = time.time()
        window = 1.0 if self._last is None else now - self._last
        self._last = now
        out: list[Sample] = []
        devices = self.sim.devices(window=window, now=now)
        self._xids_total = sum(sum(d.xid_counts.values()) for d in devices)
        for dev in devices:
            out += self._device_samples(dev)
        return out

    def _device_samples(self, dev: SimDevice) -> list[Sample]:
        lab = {"gpu": str(dev.index), "backend": "sim"}
        util = dev.utilization
        info = {"gpu": lab["gpu"], "uuid": dev.uuid, "name": dev.name, "driver": "sim"}
        out = [
            Sample("gpu_info", {**info, "backend": "sim"}, 1.0),
            Sample("gpu_memory_used_bytes", lab, float(dev.memory_used)),
            Sample("gpu_memory_total_bytes", lab, float(dev.memory_total)),
            Sample("gpu_memory_free_bytes", lab, float(dev.memory_free)),
            Sample("gpu_utilization_ratio", lab, util),
            Sample("gpu_memory_utilization_ratio", lab, 0.5 * util),
            Sample("gpu_temperature_celsius", lab, 30.0 + 45.0 * util),
            Sample("gpu_power_watts", lab, _IDLE_W + (_MAX_W - _IDLE_W) * util),
            Sample("gpu_power_limit_watts", lab, _LIMIT_W),
            Sample("gpu_sm_clock_hertz", lab, _SM_HZ / dev.clock_slowdown),
            Sample("gpu_memory_clock_hertz", lab, _MEM_HZ),
            Sample("gpu_clock_event_active", {**lab, "reason": "gpu_idle"}, float(util < 0.01)),
        ]
        for pid, nbytes in sorted(dev.processes.items()):
            plab = {**lab, "pid": str(pid), "process": process_name(pid, self.proc)}
            out.append(Sample("gpu_process_memory_used_bytes", plab, float(nbytes)))
        for code, n in sorted(dev.xid_counts.items()):
            xlab = {**lab, "xid": str(code), "meaning": xid_meaning(code)}
            out.append(Sample("gpu_xid_errors_total", xlab, float(n)))
        if dev.last_xid is not None:
            out.append(Sample("gpu_last_xid", lab, float(dev.last_xid)))
        return out

    def drain_events(self) -> list[Event]:
        events: list[Event] = []
        if self._xids_total == self._xids_drained:
            return events  # nothing new: skip reading the event list
        self._xids_drained = self._xids_total
        for dev in self.sim.devices():
            cursor = self._cursor.get(dev.index, 0)
            for x in self.sim.xid_events(dev.index, after_seq=cursor):
                cursor = max(cursor, int(x["seq"]))
                fields = {"gpu": str(dev.index), "xid": str(x["code"]), "meaning": x["meaning"]}
                fields["rule"] = "xid"
                if x.get("pid") is not None:
                    fields["pid"] = str(x["pid"])
                text = f"sim GPU {dev.index}: Xid {x['code']} ({x['meaning']})"
                events.append(Event(float(x["time"]), "gpu", text, fields))
            self._cursor[dev.index] = cursor
        return events

    def close(self) -> None:
        return None
