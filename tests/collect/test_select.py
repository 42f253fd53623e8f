from __future__ import annotations

import sys
from pathlib import Path

import pytest

from aivitals.collect.gpu import NvmlBackend, SimBackend, SmiBackend, gpu_collector
from aivitals.errors import CollectorError, ConfigError

from .fake_nvml import load


def _no_nvml(*args: object, **kwargs: object) -> NvmlBackend:
    raise CollectorError("NVML is not available: NVML Shared Library Not Found")


def test_auto_prefers_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", load().module())  # a fake H200 driver
    collector = gpu_collector("auto")
    assert collector is not None and isinstance(collector.backend, NvmlBackend)
    info = next(s for s in collector.collect() if s.name == "gpu_info")
    assert info.labels["name"] == "NVIDIA H200"


def test_auto_falls_back_to_smi_then_to_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import aivitals.collect.gpu._nvml as nvml_mod

    monkeypatch.setattr(nvml_mod.NvmlBackend, "__init__", _no_nvml)
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    collector = gpu_collector("auto")
    assert collector is not None and isinstance(collector.backend, SmiBackend)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_collector("auto") is None  # never the simulated GPU by itself


def test_explicit_choices(tmp_path: Path) -> None:
    assert gpu_collector("none") is None
    sim = gpu_collector("sim", sim_dir=str(tmp_path))
    assert sim is not None and isinstance(sim.backend, SimBackend)
    with pytest.raises(ConfigError, match="tpu"):
        gpu_collector("tpu")
