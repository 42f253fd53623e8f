from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from aivitals.collect.gpu import GpuCollector, SmiBackend, parse_compute_apps, parse_query_gpu
from aivitals.errors import CollectorError
from tests._paths import H200

QUERY = (H200 / "nvidia-smi-query.txt").read_text()  # the real capture, with its "+ cmd" echoes
APPS = "GPU-0f19b359-80d3-982b-0888-9a84d4c55a92, 4242, /usr/bin/python3, 20480\n"


def runner(gpu: str = QUERY, apps: str = APPS) -> Callable[[list[str], float], str]:
    def run(argv: list[str], timeout: float) -> str:
        return gpu if argv[1].startswith("--query-gpu") else apps

    return run


def test_parse_real_capture() -> None:
    rows = parse_query_gpu(QUERY)
    assert len(rows) == 1
    assert rows[0]["name"] == "NVIDIA H200" and rows[0]["memory.total"] == "143771"
    assert rows[0]["clocks_throttle_reasons.active"] == "0x0000000000000001"
    assert parse_compute_apps(QUERY) == []  # the capture has no compute apps


def test_samples_from_the_h200_capture() -> None:
    collector = GpuCollector(SmiBackend(runner=runner()))
    samples = list(collector.collect())
    got = {(s.name, s.labels.get("reason", "")): s.value for s in samples}
    mib = 1024 * 1024
    assert got[("gpu_memory_total_bytes", "")] == 143771 * mib
    assert got[("gpu_memory_free_bytes", "")] == 143156 * mib
    assert got[("gpu_temperature_celsius", "")] == 35
    assert got[("gpu_power_watts", "")] == pytest.approx(123.89)
    assert got[("gpu_sm_clock_hertz", "")] == 405e6
    assert got[("gpu_memory_clock_hertz", "")] == 3201e6
    assert got[("gpu_clock_event_active", "gpu_idle")] == 1
    proc = next(s for s in samples if s.name == "gpu_process_memory_used_bytes")
    assert proc.value == 20480 * mib
    assert proc.labels == {"gpu": "0", "backend": "smi", "pid": "4242", "process": "python3"}
    assert {s.labels["backend"] for s in samples if s.name.startswith("gpu_")} == {"smi"}


def test_not_available_fields_are_absent() -> None:
    row = QUERY.splitlines()[1].replace("123.89", "[N/A]").replace(" 35,", " [Not Supported],")
    collector = GpuCollector(SmiBackend(runner=runner(gpu=row + "\n")))
    names = {s.name for s in collector.collect()}
    assert "gpu_power_watts" not in names and "gpu_temperature_celsius" not in names
    assert "gpu_memory_used_bytes" in names
    assert collector.error_counts() == {"not_supported": 2}


def test_garbage_output_is_down() -> None:
    collector = GpuCollector(SmiBackend(runner=runner(gpu="NVIDIA-SMI has failed\n")))
    got = {s.name: s.value for s in collector.collect()}
    assert got["aivitals_collector_up"] == 0


def test_hanging_nvidia_smi_is_killed_and_counted(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    collector = GpuCollector(SmiBackend(binary=str(fake), timeout=0.5))
    start = time.monotonic()
    got = {s.name: s.value for s in collector.collect()}
    assert time.monotonic() - start < 5
    assert got["aivitals_collector_up"] == 0
    assert collector.error_counts() == {"timeout": 1}


def test_failing_binary_and_missing_binary(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    fake.chmod(0o755)
    collector = GpuCollector(SmiBackend(binary=str(fake)))
    assert {s.name: s.value for s in collector.collect()}["aivitals_collector_up"] == 0
    with pytest.raises(CollectorError, match="not found"):
        SmiBackend(binary="no-such-nvidia-smi-here")
