"""aivitals.chaos: real faults with a bounded duration and a guaranteed revert.

Each fault is a ``Fault`` class and its ``FaultSpec`` in the module that implements
it; the fault table (``FAULT_TABLE``) and validate's scenarios and severity knobs are
read from the specs (``FAULT_SPECS``).

Every fault touches only what its run created (loopback, its own network
namespaces and nftables tables, its own temp files and processes) and writes
each resource to the run's journal before creating it, so a crashed runner is
cleaned by ``aivitals chaos cleanup`` or the next run. A fault that replaces a
process someone else started (``redis_down`` ``method=1``) hands the new one to
that owner (``FaultContext.owner``), or is refused.

Faults that must happen inside a service run through the hook the service mounts,
``mount(app)`` (off unless ``AIVITALS_CHAOS_TOKEN`` is set in its environment).

**Usage**::

    from aivitals.chaos import ChaosRunner, FaultContext
    with ChaosRunner(FaultContext(target="http://127.0.0.1:8000")) as runner:
        runner.start("cpu_burn", duration=30)
        ...
"""

from __future__ import annotations

from ._fault import DEFAULT_MAX_DURATION, Fault, FaultContext, FaultEffect, Param, Touch
from ._journal import CleanupReport, Journal, Replacement, RunDir, cleanup, default_root, replay
from ._mount import (
    CHAOS_ENV,
    CHAOS_PATH,
    IN_PROCESS_FAULTS,
    ChaosMount,
    ChaosMountWSGI,
    FaultHook,
    GpuLeakTarget,
    InProcessFaults,
    InProcessFaultSpec,
    mount,
    mount_wsgi,
)
from ._net import FAULT_NETNS_GLOB
from ._procs import RUN_ENV, kill_tree, same_process, start_time
from ._redis import keeps_title
from ._registry import FAULT_SPECS, FAULT_TABLE, FAULTS, get_fault
from ._runner import ActiveFault, ChaosRunner, interrupt_on_signals
from ._spec import (
    FaultSpec,
    Grading,
    Knob,
    Measured,
    NeedKind,
    Needs,
    PhaseWindow,
    Runs,
    SweepBasis,
    check_grading,
    check_spec,
)
from ._table import FaultInfo

__all__ = [
    "CHAOS_ENV",
    "CHAOS_PATH",
    "DEFAULT_MAX_DURATION",
    "FAULTS",
    "FAULT_NETNS_GLOB",
    "FAULT_SPECS",
    "FAULT_TABLE",
    "IN_PROCESS_FAULTS",
    "RUN_ENV",
    "ActiveFault",
    "ChaosMount",
    "ChaosMountWSGI",
    "ChaosRunner",
    "CleanupReport",
    "Fault",
    "FaultContext",
    "FaultEffect",
    "FaultHook",
    "FaultInfo",
    "FaultSpec",
    "GpuLeakTarget",
    "Grading",
    "InProcessFaultSpec",
    "InProcessFaults",
    "Journal",
    "Knob",
    "Measured",
    "NeedKind",
    "Needs",
    "Param",
    "PhaseWindow",
    "Replacement",
    "RunDir",
    "Runs",
    "SweepBasis",
    "Touch",
    "check_grading",
    "check_spec",
    "cleanup",
    "default_root",
    "get_fault",
    "interrupt_on_signals",
    "keeps_title",
    "kill_tree",
    "mount",
    "mount_wsgi",
    "replay",
    "same_process",
    "start_time",
]
