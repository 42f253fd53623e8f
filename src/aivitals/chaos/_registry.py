"""The registry of faults by name."""

from __future__ import annotations

from ..errors import ConfigError
from ._clients import MalformedInputs, OverlongInputs, TrafficSurge
from ._fault import Fault
from ._gpu import GpuCotenant, GpuOOM, GpuXid
from ._host import ConnectionFlood, CpuBurn, DiskFill, DiskIOSaturation
from ._inproc import IN_PROCESS
from ._net import NetworkLatency, NetworkLoss
from ._redis import CacheStampede, RedisDown
from ._table import FAULT_TABLE

__all__ = ["FAULTS", "get_fault"]

_CLASSES: tuple[type[Fault], ...] = (
    *IN_PROCESS,
    GpuXid,
    GpuCotenant,
    GpuOOM,
    CpuBurn,
    DiskIOSaturation,
    DiskFill,
    ConnectionFlood,
    NetworkLoss,
    NetworkLatency,
    RedisDown,
    CacheStampede,
    OverlongInputs,
    MalformedInputs,
    TrafficSurge,
)

#: name -> Fault class, in the order of the fault table.
FAULTS: dict[str, type[Fault]] = {
    name: cls for name in FAULT_TABLE for cls in _CLASSES if cls.name == name
}


def get_fault(name: str) -> type[Fault]:
    """The fault class called ``name``; ``ConfigError`` listing the known ones otherwise.

    **Usage**::

        fault = get_fault("network_loss")(duration=30, percent=10)
    """
    try:
        return FAULTS[name]
    except KeyError:
        known = ", ".join(FAULTS)
        raise ConfigError(f"unknown fault {name!r}; known faults: {known}") from None
