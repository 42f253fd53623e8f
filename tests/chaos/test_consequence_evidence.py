"""Allowed consequences against the recordings: which ones a recorded run of the fault
produced, and which still stand on their stated mechanism alone.

A consequence lets a fault page an alert other than its own without failing validate, so
each one should be shown happening: a recording (``benchmarks/recordings``, or the
regression fixtures) of that fault alone in which the alert fired after the fault began.
``UNRECORDED`` lists the entries no recording shows yet, each added after a live run paged
it that was not kept. The list may only shrink: a new consequence needs its recording,
and an entry whose recording arrives leaves the list (the test says which). A recording
shows what the rule pack of its day paged; a rule changed since may no longer page it
(InferenceLatencyHigh on one slow call in a sparse window no longer does).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from aivitals.chaos import FAULT_SPECS
from tests._paths import FIXTURES, REPO

UNRECORDED: frozenset[tuple[str, str]] = frozenset(
    {
        ("connection_flood", "InferenceLatencyHigh"),
        ("cpu_burn", "GPUUtilizationLow"),
        ("cpu_burn", "InferenceLatencyHigh"),
        ("disk_io_saturation", "InferenceLatencyHigh"),
        ("event_loop_blocked", "QueueWaitHigh"),
        ("gpu_contention", "QueueBacklog"),
        ("gpu_contention", "QueueWaitHigh"),
        ("gpu_cotenant", "GPUUtilizationHigh"),
        ("gpu_memory_leak", "GPUOutOfMemoryErrors"),
        ("gpu_oom", "HostCPUSaturated"),
        ("gpu_xid", "GPUUtilizationLow"),
        ("gpu_xid", "ServiceNotReady"),
        ("process_memory_leak", "InferenceLatencyHigh"),
        ("timeouts_not_aborting", "HTTP429RateHigh"),
        ("timeouts_not_aborting", "HostCPUSaturated"),
        ("timeouts_not_aborting", "QueueBacklog"),
        ("timeouts_not_aborting", "QueueWaitHigh"),
        ("timeouts_not_aborting", "WorkerPoolSaturated"),
        ("traffic_surge", "GPUUtilizationHigh"),
        ("traffic_surge", "InferenceLatencyHigh"),
        ("worker_pool_saturated", "HTTP429RateHigh"),
        ("worker_pool_saturated", "QueueWaitHigh"),
    }
)


def _recorded() -> dict[str, set[str]]:
    """Fault -> the alerts that fired after it began, in recordings of it alone."""
    out: dict[str, set[str]] = defaultdict(set)
    labels = sorted((REPO / "benchmarks" / "recordings").glob("*.json"))
    labels += sorted((FIXTURES / "recordings").glob("*/*.json"))
    for path in labels:
        data = json.loads(Path(path).read_text())
        label = data.get("label") or {}
        faults, t_fault, t_revert = (
            label.get("faults") or [],
            label.get("t_fault"),
            label.get("t_revert"),
        )
        if len(faults) != 1 or t_fault is None or t_revert is None:
            continue  # a pair's alerts cannot be told apart; a soak has no fault
        for a in data.get("alerts") or []:
            fired = a.get("fired_at")
            if a.get("state") == "firing" and fired is not None and t_fault <= fired <= t_revert:
                out[faults[0]].add(a["alertname"])
    return out


def test_every_consequence_is_recorded_or_listed_as_not_yet() -> None:
    recorded = _recorded()
    entries = {(name, alert) for name, spec in FAULT_SPECS.items() for alert in spec.consequences}
    missing = sorted(e for e in entries - UNRECORDED if e[1] not in recorded[e[0]])
    assert not missing, f"consequences no recording shows (record a run of it): {missing}"
    arrived = sorted(e for e in UNRECORDED & entries if e[1] in recorded[e[0]])
    assert not arrived, f"recorded now: remove from UNRECORDED: {arrived}"
    assert entries >= UNRECORDED, f"no longer consequences: {sorted(UNRECORDED - entries)}"
