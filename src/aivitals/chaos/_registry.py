"""The registry of faults by name, found from the modules that implement them.

Every ``Fault`` subclass defined in one of ``_MODULES`` with a ``spec`` of its own is
registered; the fault table, validate's scenarios and the sweep's knobs are views of
those specs, so a new fault is its class and its spec in its module (a new module is
one more entry in ``_MODULES``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import ModuleType

from ..errors import ConfigError
from . import _clients, _gpu, _host, _inproc, _net, _redis
from ._fault import Fault
from ._spec import FaultSpec
from ._table import FaultInfo, build_table

__all__ = ["FAULTS", "FAULT_SPECS", "FAULT_TABLE", "collect_faults", "get_fault", "registry"]

#: the modules that implement faults
_MODULES: tuple[ModuleType, ...] = (_inproc, _gpu, _host, _net, _redis, _clients)

#: The order validate runs the faults in and reports list them in: a fault's revert
#: can colour the baseline of the next (``network_latency``'s quick baseline says so),
#: so the order is kept. A fault not named here comes after these, in module order.
_ORDER: tuple[str, ...] = (
    "gpu_memory_leak",
    "gpu_oom",
    "gpu_xid",
    "gpu_cotenant",
    "gpu_contention",
    "event_loop_blocked",
    "worker_pool_saturated",
    "connection_flood",
    "overlong_inputs",
    "malformed_inputs",
    "cache_stampede",
    "cpu_burn",
    "process_memory_leak",
    "disk_io_saturation",
    "network_loss",
    "network_latency",
    "redis_down",
    "traffic_surge",
    "cold_start",
    "timeouts_not_aborting",
    "slow_dependency",
    "thread_leak",
    "disk_fill",
)


def collect_faults(modules: Iterable[ModuleType]) -> list[type[Fault]]:
    """The ``Fault`` classes ``modules`` define (not import) with a spec of their own."""
    return [
        obj
        for module in modules
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, Fault)
        and obj.__module__ == module.__name__
        and "spec" in vars(obj)
    ]


def registry(
    classes: Iterable[type[Fault]], order: Sequence[str] = _ORDER
) -> dict[str, type[Fault]]:
    """name -> class, in ``order`` then the rest in the order given; ``ConfigError`` for
    a class whose spec has another name, or two classes of one name."""
    out: dict[str, type[Fault]] = {}
    for cls in classes:
        spec: FaultSpec = cls.spec
        if spec.name != cls.name:
            raise ConfigError(f"fault {cls.name!r}: its spec is named {spec.name!r}")
        if cls.name in out:
            raise ConfigError(f"fault {cls.name!r}: defined twice ({out[cls.name]}, {cls})")
        out[cls.name] = cls
    rank = {name: i for i, name in enumerate(order)}
    ordered = sorted(out, key=lambda n: rank.get(n, len(rank)))  # stable: the rest in turn
    return {name: out[name] for name in ordered}


#: name -> Fault class, in the order of the fault table.
FAULTS: dict[str, type[Fault]] = registry(collect_faults(_MODULES))
#: name -> the fault's spec.
FAULT_SPECS: dict[str, FaultSpec] = {name: cls.spec for name, cls in FAULTS.items()}
#: name -> FaultInfo, the table row of each spec.
FAULT_TABLE: dict[str, FaultInfo] = build_table(FAULT_SPECS.values())


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
