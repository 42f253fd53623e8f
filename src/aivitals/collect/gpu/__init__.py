"""GPU collection: the ``nvml``, ``smi`` and ``sim`` backends behind one collector.

**Usage**::

    from aivitals.collect.gpu import SimGPU, gpu_collector
    sim = SimGPU("/tmp/aivitals-sim")          # simulated: every series says backend="sim"
    collector = gpu_collector("sim", sim_dir="/tmp/aivitals-sim")
"""

from __future__ import annotations

from ._common import GpuBackend, GpuCollector
from ._nvml import CLOCK_EVENT_REASONS, NvmlBackend
from ._select import gpu_collector
from ._sim import XID_LOST, SimDevice, SimGPU, SimGpuLostError, SimOutOfMemoryError, default_sim_dir
from ._simbackend import SimBackend
from ._smi import SmiBackend, parse_compute_apps, parse_query_gpu

__all__ = [
    "CLOCK_EVENT_REASONS",
    "XID_LOST",
    "GpuBackend",
    "GpuCollector",
    "NvmlBackend",
    "SimBackend",
    "SimDevice",
    "SimGPU",
    "SimGpuLostError",
    "SimOutOfMemoryError",
    "SmiBackend",
    "default_sim_dir",
    "gpu_collector",
    "parse_compute_apps",
    "parse_query_gpu",
]
