"""The ``nvml`` backend: NVIDIA's management library through nvidia-ml-py.

``pynvml`` is imported only when this backend is made (injectable as
``nvml=`` so tests run a fake module). One handle per device is created once.
A field NVML answers "Not Supported" for is left absent (never 0), counted
once and not asked again; any other per-field error is counted each time and
the rest of the sample goes on. Xids come from NVML's event API, polled
without blocking at every read.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

from ...errors import CollectorError
from ...signals import Sample
from .._event import Event
from .._xid import xid_meaning
from ._common import CountError, process_name

__all__ = ["CLOCK_EVENT_REASONS", "NvmlBackend"]

#: Clock-event (throttle) reason bits, nvml.h ``nvmlClocksEventReason*``.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_MAX_EVENTS_PER_READ = 100


@dataclass
class _Device:
    index: int
    handle: Any
    labels: dict[str, str]
    info: dict[str, str]
    unsupported: set[str]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """GPU samples through NVML.

    **Usage**::

        backend = NvmlBackend()          # raises CollectorError when NVML cannot start
        collector = GpuCollector(backend)
    """

    name = "nvml"

    def __init__(self, *, nvml: ModuleType | None = None, proc: str = "/proc") -> None:
        try:
            self.nv = nvml or importlib.import_module("pynvml")
            self.nv.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            raise CollectorError(f"NVML is not available: {exc}") from exc
        self.proc = proc
        nv = self.nv
        driver = _text(nv.nvmlSystemGetDriverVersion())
        self.devices: list[_Device] = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            labels = {"gpu": str(i), "backend": "nvml"}
            info = {
                "gpu": str(i),
                "uuid": _text(nv.nvmlDeviceGetUUID(h)),
                "name": _text(nv.nvmlDeviceGetName(h)),
                "driver": driver,
                "backend": "nvml",
            }
            self.devices.append(_Device(i, h, labels, info, set()))
        self._xids: dict[tuple[int, int], int] = {}
        self._last_xid: dict[int, int] = {}
        self._events: list[Event] = []
        self._event_set = self._register_xid_events()

    @property
    def pci_bus_ids(self) -> dict[str, str]:
        """PCI bus id (as the kernel log writes it) -> gpu index, for the kernel collector."""
        out: dict[str, str] = {}
        for dev in self.devices:
            try:
                bus = _text(self.nv.nvmlDeviceGetPciInfo(dev.handle).busId).lower()
            except self.nv.NVMLError:
                continue
            # NVML says 00000000:3B:00.0; the kernel's Xid line says 0000:3b:00.
            out[bus[4:-2] if len(bus) == 16 else bus] = str(dev.index)
        return out

    def _register_xid_events(self) -> Any:
        nv = self.nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        for dev in self.devices:
            try:
                nv.nvmlDeviceRegisterEvents(dev.handle, nv.nvmlEventTypeXidCriticalError, event_set)
            except nv.NVMLError:
                dev.unsupported.add("xid_events")
        return event_set

    def _field(self, dev: _Device, field: str, count: CountError, fn: Callable[[], Any]) -> Any:
        """``fn()``, or None when NVML cannot answer (counted; Not Supported asked once)."""
        if field in dev.unsupported:
            return None
        nv = self.nv
        try:
            return fn()
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) == nv.NVML_ERROR_NOT_SUPPORTED:
                dev.unsupported.add(field)
                count("not_supported")
            else:
                count(f"{field}_error")
            return None

    def read(self, count: CountError) -> list[Sample]:
        out: list[Sample] = []
        for dev in self.devices:
            out += self._device_samples(dev, count)
        self._poll_xids(count)
        for (gpu, code), n in sorted(self._xids.items()):
            labels = {**self.devices[gpu].labels, "xid": str(code), "meaning": xid_meaning(code)}
            out.append(Sample("gpu_xid_errors_total", labels, float(n)))
        for gpu, code in sorted(self._last_xid.items()):
            out.append(Sample("gpu_last_xid", self.devices[gpu].labels, float(code)))
        return out

    def _device_samples(self, dev: _Device, count: CountError) -> list[Sample]:
        nv, h, lab = self.nv, dev.handle, dev.labels
        out = [Sample("gpu_info", dev.info, 1.0)]

        def add(name: str, value: float | None, labels: dict[str, str] = lab) -> None:
            if value is not None:
                out.append(Sample(name, labels, float(value)))

        mem = self._field(dev, "memory", count, lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            add("gpu_memory_used_bytes", mem.used)
            add("gpu_memory_total_bytes", mem.total)
            add("gpu_memory_free_bytes", mem.free)
        util = self._field(dev, "utilization", count, lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            add("gpu_utilization_ratio", util.gpu / 100.0)
            add("gpu_memory_utilization_ratio", util.memory / 100.0)
        add(
            "gpu_temperature_celsius",
            self._field(
                dev,
                "temperature",
                count,
                lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            ),
        )
        power = self._field(dev, "power", count, lambda: nv.nvmlDeviceGetPowerUsage(h))
        add("gpu_power_watts", None if power is None else power / 1000.0)
        limit = self._field(
            dev, "power_limit", count, lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)
        )
        add("gpu_power_limit_watts", None if limit is None else limit / 1000.0)
        for name, field, clock in (
            ("gpu_sm_clock_hertz", "sm_clock", nv.NVML_CLOCK_SM),
            ("gpu_memory_clock_hertz", "memory_clock", nv.NVML_CLOCK_MEM),
        ):
            mhz = self._field(dev, field, count, partial(nv.nvmlDeviceGetClockInfo, h, clock))
            add(name, None if mhz is None else mhz * 1e6)
        out += self._clock_events(dev, count)
        out += self._pcie(dev, count)
        out += self._ecc(dev, count)
        out += self._processes(dev, count)
        return out

    def _clock_events(self, dev: _Device, count: CountError) -> list[Sample]:
        nv = self.nv
        getter = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._field(dev, "clock_events", count, lambda: getter(dev.handle))
        if mask is None:
            return []
        return [
            Sample(
                "gpu_clock_event_active", {**dev.labels, "reason": reason}, float(bool(mask & bit))
            )
            for bit, reason in CLOCK_EVENT_REASONS.items()
        ]

    def _pcie(self, dev: _Device, count: CountError) -> list[Sample]:
        nv, out = self.nv, []
        for name, field, which in (
            ("gpu_pcie_tx_bytes_per_second", "pcie_tx", nv.NVML_PCIE_UTIL_TX_BYTES),
            ("gpu_pcie_rx_bytes_per_second", "pcie_rx", nv.NVML_PCIE_UTIL_RX_BYTES),
        ):
            get = partial(nv.nvmlDeviceGetPcieThroughput, dev.handle, which)
            kbs = self._field(dev, field, count, get)
            if kbs is not None:
                out.append(Sample(name, dev.labels, kbs * 1024.0))
        return out

    def _ecc(self, dev: _Device, count: CountError) -> list[Sample]:
        nv, out = self.nv, []
        for kind, err_type in (
            ("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            n = self._field(
                dev,
                f"ecc_{kind}",
                count,
                partial(nv.nvmlDeviceGetTotalEccErrors, dev.handle, err_type, nv.NVML_VOLATILE_ECC),
            )
            if n is not None:
                out.append(Sample("gpu_ecc_errors_total", {**dev.labels, "type": kind}, float(n)))
        rows = self._field(
            dev, "remapped_rows", count, lambda: nv.nvmlDeviceGetRemappedRows(dev.handle)
        )
        if rows is not None:
            for kind, value in zip(
                ("correctable", "uncorrectable", "pending", "failure"), rows, strict=False
            ):
                out.append(Sample("gpu_remapped_rows", {**dev.labels, "type": kind}, float(value)))
        return out

    def _processes(self, dev: _Device, count: CountError) -> list[Sample]:
        procs = self._field(
            dev,
            "processes",
            count,
            lambda: self.nv.nvmlDeviceGetComputeRunningProcesses(dev.handle),
        )
        out: list[Sample] = []
        for p in procs or ():
            used = getattr(p, "usedGpuMemory", None)
            if used is None:  # NVML_VALUE_NOT_AVAILABLE (e.g. under MIG without rights)
                count("process_memory_unavailable")
                continue
            labels = {**dev.labels, "pid": str(p.pid), "process": process_name(p.pid, self.proc)}
            out.append(Sample("gpu_process_memory_used_bytes", labels, float(used)))
        return out

    def _poll_xids(self, count: CountError) -> None:
        nv = self.nv
        if self._event_set is None:
            return
        handles = {id(d.handle): d.index for d in self.devices}
        for _ in range(_MAX_EVENTS_PER_READ):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_TIMEOUT:
                    count("xid_events_error")
                return
            gpu = handles.get(id(data.device), 0)
            code = int(data.eventData)
            self._xids[(gpu, code)] = self._xids.get((gpu, code), 0) + 1
            self._last_xid[gpu] = code
            fields = {
                "gpu": str(gpu),
                "xid": str(code),
                "meaning": xid_meaning(code),
                "rule": "xid",
            }
            text = f"NVML event: GPU {gpu} Xid {code} ({xid_meaning(code)})"
            self._events.append(Event(time.time(), "gpu", text, fields))

    def drain_events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        nv = self.nv
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
