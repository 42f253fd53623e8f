"""Pick a GPU backend: ``auto`` tries NVML, then nvidia-smi, else none (never sim)."""

from __future__ import annotations

import shutil

from ...errors import CollectorError, ConfigError
from .._pods import PodResolver
from ._common import GpuBackend, GpuCollector
from ._sim import SimGPU, default_sim_dir

__all__ = ["gpu_collector"]


def gpu_collector(
    kind: str = "auto", *, sim_dir: str | None = None, pods: PodResolver | None = None
) -> GpuCollector | None:
    """The GPU collector for ``kind`` (``auto``, ``nvml``, ``smi``, ``sim``, ``none``).

    ``auto`` returns None on a machine without a GPU: a simulated GPU is only
    ever used when asked for by name. ``pods`` labels per-process series with
    their Kubernetes pod.

    **Usage**::

        gpu_collector("sim", sim_dir="/tmp/aivitals-sim")
        gpu_collector("auto", pods=PodResolver(source=KubeletPodsFile("/run/pods.json")))
    """
    backend: GpuBackend | None
    if kind == "none":
        return None
    if kind == "sim":
        from ._simbackend import SimBackend

        backend = SimBackend(SimGPU(sim_dir or default_sim_dir()))
    elif kind == "nvml":
        from ._nvml import NvmlBackend

        backend = NvmlBackend()
    elif kind == "smi":
        from ._smi import SmiBackend

        backend = SmiBackend()
    elif kind == "auto":
        backend = _auto()
    else:
        raise ConfigError(f"gpu: {kind!r} is not one of auto, nvml, smi, sim, none")
    return None if backend is None else GpuCollector(backend, pods=pods)


def _auto() -> GpuBackend | None:
    from ._nvml import NvmlBackend
    from ._smi import SmiBackend

    try:
        return NvmlBackend()
    except CollectorError:
        pass
    if shutil.which("nvidia-smi"):
        return SmiBackend()
    return None
