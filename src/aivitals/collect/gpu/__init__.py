"""GPU collection: the ``nvml``, ``smi`` and ``sim`` backends behind one collector.

**Usage**::

    from aivitals.collect.gpu import SimGPU, gpu_collector
    sim = SimGPU("/tmp/aivitals-sim")          # simulated: every series says backend="sim"
    collector = gpu_collector("sim", sim_dir="/tmp/aivitals-sim")
"""

from __future__ import annotations

from ._common import GpuBackend, GpuCollector
from ._sim import SimDevice, SimGPU, SimOutOfMemoryError
from ._simbackend import SimBackend

__all__ = [
    "GpuBackend",
    "GpuCollector",
    "SimBackend",
    "SimDevice",
    "SimGPU",
    "SimOutOfMemoryError",
]
