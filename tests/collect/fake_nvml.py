"""A fake ``pynvml`` module answering with the real H200 readings in
tests/fixtures/gpu/h200/nvml.json.

Calls the fixture records as failing ("ERR NVMLError_NotSupported: ...") and
calls it does not record at all raise ``NVMLError`` Not Supported, so the
backend's absent-series path runs on real data. ``fail`` makes one call raise
a chosen NVML error, and ``xids`` queues Xid events for the event API.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from tests._paths import H200

FIXTURE = H200 / "nvml.json"

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 8


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class FakeNVML:
    """Build with ``FakeNVML.module()``; state lives on the instance."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.fail: dict[str, int] = {}
        self.xids: list[int] = []
        self.calls: dict[str, int] = {}
        self.handle = SimpleNamespace(index=0)
        self.procs: list[SimpleNamespace] = []

    def _get(self, call: str, key: str) -> Any:
        self.calls[call] = self.calls.get(call, 0) + 1
        if call in self.fail:
            raise NVMLError(self.fail[call])
        value = self.data.get(key)
        if value is None or (isinstance(value, str) and value.startswith("ERR")):
            code = NVML_ERROR_NOT_FOUND if "NotFound" in str(value) else NVML_ERROR_NOT_SUPPORTED
            raise NVMLError(code)
        return value

    def module(self) -> SimpleNamespace:
        d = self
        ns = SimpleNamespace(
            **{k: v for k, v in globals().items() if k.isupper() or k == "NVMLError"}
        )
        ns.nvmlEventTypeXidCriticalError = nvmlEventTypeXidCriticalError
        ns.nvmlInit = lambda: None
        ns.nvmlShutdown = lambda: None
        ns.nvmlSystemGetDriverVersion = lambda: d._get("driver", "driver")
        ns.nvmlDeviceGetCount = lambda: 1
        ns.nvmlDeviceGetHandleByIndex = lambda i: d.handle
        ns.nvmlDeviceGetName = lambda h: d._get("name", "name")
        ns.nvmlDeviceGetUUID = lambda h: d._get("uuid", "uuid")
        ns.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=d._get("pci", "pci_bus_id"))
        ns.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(**d._get("memory", "mem"))
        ns.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(**d._get("util", "util"))
        ns.nvmlDeviceGetTemperature = lambda h, s: d._get("temperature", "temp")
        ns.nvmlDeviceGetPowerUsage = lambda h: d._get("power", "power_mw")
        ns.nvmlDeviceGetEnforcedPowerLimit = lambda h: d._get("power_limit", "power_limit_mw")
        ns.nvmlDeviceGetClockInfo = lambda h, c: d._get(
            f"clock{c}", "clock_sm" if c == NVML_CLOCK_SM else "clock_mem"
        )
        ns.nvmlDeviceGetCurrentClocksEventReasons = lambda h: d._get("throttle", "throttle")
        ns.nvmlDeviceGetPcieThroughput = lambda h, w: d._get(
            f"pcie{w}", "pcie_tx_kbs" if w == NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_kbs"
        )
        ns.nvmlDeviceGetTotalEccErrors = lambda h, t, c: d._get(
            f"ecc{t}",
            "ecc_uncorrected" if t == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "ecc_corrected",
        )
        ns.nvmlDeviceGetRetiredPages = lambda h, c: d._get("retired", "retired_pages")
        ns.nvmlDeviceGetRemappedRows = lambda h: tuple(d._get("remapped", "remapped_rows"))
        ns.nvmlDeviceGetComputeRunningProcesses = d._procs
        ns.nvmlEventSetCreate = lambda: "event-set"
        ns.nvmlEventSetFree = lambda s: None
        ns.nvmlDeviceRegisterEvents = lambda h, t, s: d._get("register", "xid_event_set")
        ns.nvmlEventSetWait = d._wait
        return ns

    def _procs(self, handle: Any) -> list[SimpleNamespace]:
        recorded = self._get("procs", "compute_procs")  # [] on the idle H200
        return [SimpleNamespace(**p) for p in recorded] + self.procs

    def _wait(self, event_set: Any, timeout_ms: int) -> SimpleNamespace:
        if not self.xids:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        code = self.xids.pop(0)
        return SimpleNamespace(
            device=self.handle, eventType=nvmlEventTypeXidCriticalError, eventData=code
        )


def load() -> FakeNVML:
    return FakeNVML(json.loads(FIXTURE.read_text()))
