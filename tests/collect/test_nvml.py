from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from aivitals import signals
from aivitals.collect.gpu import GpuCollector, NvmlBackend
from aivitals.errors import CollectorError

from .fake_nvml import NVML_ERROR_UNKNOWN, load


def by_key(samples: list) -> dict[tuple[str, str], float]:
    return {
        (
            s.name,
            s.labels.get("reason") or s.labels.get("type") or s.labels.get("pid") or "",
        ): s.value
        for s in samples
    }


def test_h200_readings() -> None:
    fake = load()
    collector = GpuCollector(NvmlBackend(nvml=fake.module()))
    samples = list(collector.collect())
    got = by_key(samples)
    assert got[("gpu_memory_total_bytes", "")] == 150754820096
    assert got[("gpu_memory_used_bytes", "")] == 644939776
    assert got[("gpu_memory_free_bytes", "")] == 150109880320
    assert got[("gpu_utilization_ratio", "")] == 0.0
    assert got[("gpu_temperature_celsius", "")] == 34
    assert got[("gpu_power_watts", "")] == pytest.approx(77.791)
    assert got[("gpu_power_limit_watts", "")] == 700.0
    assert got[("gpu_sm_clock_hertz", "")] == 345e6
    assert got[("gpu_clock_event_active", "gpu_idle")] == 1  # throttle mask 0x1 at idle
    assert got[("gpu_clock_event_active", "sw_power_cap")] == 0
    assert got[("gpu_pcie_tx_bytes_per_second", "")] == 2134 * 1024
    assert got[("gpu_ecc_errors_total", "uncorrected")] == 0
    assert got[("gpu_remapped_rows", "pending")] == 0
    info = next(s for s in samples if s.name == "gpu_info")
    assert info.labels == {
        "gpu": "0",
        "uuid": "GPU-0f19b359-80d3-982b-0888-9a84d4c55a92",
        "name": "NVIDIA H200",
        "driver": "580.159.04",
        "backend": "nvml",
    }
    assert all(s.labels.get("backend") == "nvml" for s in samples if s.name.startswith("gpu_"))
    for s in samples:
        assert signals.family_of(s.name) is not None, s.name


def test_not_supported_is_absent_never_zero_and_asked_once() -> None:
    fake = load()  # the fixture records no memory clock, PCIe rx or corrected-ECC reading
    backend = NvmlBackend(nvml=fake.module())
    collector = GpuCollector(backend)
    got = by_key(list(collector.collect()))
    assert ("gpu_memory_clock_hertz", "") not in got
    assert ("gpu_pcie_rx_bytes_per_second", "") not in got
    assert ("gpu_ecc_errors_total", "corrected") not in got
    assert collector.error_counts() == {"not_supported": 3}
    list(collector.collect())
    assert fake.calls["clock2"] == 1  # not asked again
    assert collector.error_counts() == {"not_supported": 3}


def test_one_field_raising_leaves_the_rest() -> None:
    fake = load()
    fake.fail["temperature"] = NVML_ERROR_UNKNOWN
    collector = GpuCollector(NvmlBackend(nvml=fake.module()))
    for _ in range(2):
        got = by_key(list(collector.collect()))
    assert ("gpu_temperature_celsius", "") not in got
    assert got[("gpu_memory_used_bytes", "")] == 644939776
    assert got[("aivitals_collector_up", "")] == 1
    assert collector.error_counts()["temperature_error"] == 2  # a real error: counted each time


def test_per_process_memory() -> None:
    fake = load()
    fake.procs = [
        SimpleNamespace(pid=os.getpid(), usedGpuMemory=7 * 2**30),
        SimpleNamespace(pid=999999, usedGpuMemory=None),  # NVML_VALUE_NOT_AVAILABLE
    ]
    collector = GpuCollector(NvmlBackend(nvml=fake.module()))
    samples = list(collector.collect())
    procs = [s for s in samples if s.name == "gpu_process_memory_used_bytes"]
    assert len(procs) == 1 and procs[0].value == 7 * 2**30
    assert procs[0].labels["pid"] == str(os.getpid()) and procs[0].labels["process"]
    assert collector.error_counts()["process_memory_unavailable"] == 1


def test_xid_events_count_each_one() -> None:
    fake = load()
    collector = GpuCollector(NvmlBackend(nvml=fake.module()))
    fake.xids = [79, 79, 48]
    samples = list(collector.collect())
    xids = {s.labels["xid"]: s.value for s in samples if s.name == "gpu_xid_errors_total"}
    assert xids == {"79": 2, "48": 1}  # repeated Xids are told apart, unlike DCGM's gauge
    last = [s.value for s in samples if s.name == "gpu_last_xid"]
    assert last == [48]
    events = collector.drain_events()
    assert [e.fields["xid"] for e in events] == ["79", "79", "48"]
    assert events[0].fields["meaning"] == "GPU has fallen off the bus"
    fake.xids = [79]
    samples = list(collector.collect())
    xids = {s.labels["xid"]: s.value for s in samples if s.name == "gpu_xid_errors_total"}
    assert xids == {"79": 3, "48": 1}


def test_pci_bus_id_in_the_kernel_logs_form() -> None:
    backend = NvmlBackend(nvml=load().module())
    assert backend.pci_bus_ids == {"0000:00:06": "0"}


def test_nvml_missing_is_a_collector_error() -> None:
    broken = SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(OSError("libnvidia-ml.so.1")))
    with pytest.raises(CollectorError, match="NVML is not available"):
        NvmlBackend(nvml=broken)
