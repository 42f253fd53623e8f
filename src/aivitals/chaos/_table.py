"""The fault table: one row per fault, the data ``validate`` checks against.

``signature`` is the id the diagnosis must name as its top finding;
``alerts`` are names from the shipped rule pack
(``aivitals/alerts/rules/aivitals-rules.yml``) that should fire while the fault
runs. An empty ``alerts`` means no signal the service side collects moves for
that fault (the description says why) and only the diagnosis is checked.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FAULT_TABLE", "FaultInfo"]


@dataclass(frozen=True, slots=True)
class FaultInfo:
    name: str
    layer: str
    signature: str
    alerts: tuple[str, ...]
    description: str


_ROWS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    # name, layer, alerts, description
    (
        "gpu_memory_leak",
        "model",
        ("GPUProcessMemoryGrowth", "GPUMemoryHigh"),
        "the service keeps GPU memory alive on every request (in-process)",
    ),
    (
        "gpu_oom",
        "model",
        ("GPUOutOfMemoryErrors",),
        "over-long inputs whose KV-cache reservation no longer fits on the GPU",
    ),
    (
        "gpu_xid",
        "model",
        ("GPUXidError",),
        "an Xid error on the (simulated) GPU; 79 = fallen off the bus",
    ),
    (
        "gpu_cotenant",
        "model",
        ("GPUMemoryHigh",),
        "another process periodically takes a large share of the GPU memory",
    ),
    (
        "gpu_contention",
        "model",
        ("InferenceLatencyHigh",),
        "contention slows every inference step (in-process, sim GPU clock slowdown)",
    ),
    (
        "event_loop_blocked",
        "service",
        ("LatencyHighWorkersIdle",),
        "request handlers do synchronous sleep/IO on the event loop (in-process)",
    ),
    (
        "worker_pool_saturated",
        "service",
        ("WorkerPoolSaturated", "QueueBacklog"),
        "worker pool threads block; requests queue (in-process)",
    ),
    (
        "connection_flood",
        "service",
        ("FdsNearLimit",),
        "2,000 idle keep-alive connections held open to the service",
    ),
    (
        "overlong_inputs",
        "business",
        ("InputRejectionsHigh",),
        "one client sends 100,000-character inputs",
    ),
    (
        "malformed_inputs",
        "business",
        ("InputRejectionsHigh",),
        "one client sends control characters and invalid UTF-8",
    ),
    (
        "cache_stampede",
        "service",
        ("CacheHitRatioDrop",),
        "every key of the service's Redis cache expires at once, repeatedly",
    ),
    (
        "cpu_burn",
        "infrastructure",
        ("HostCPUSaturated",),
        "host CPU saturated by another workload (stress-ng or Python)",
    ),
    (
        "process_memory_leak",
        "service",
        ("ProcessMemoryGrowth",),
        "the service keeps process memory on every request (in-process)",
    ),
    (
        "disk_io_saturation",
        "infrastructure",
        ("DiskSaturated",),
        "heavy direct writes saturate the disk (fio or Python), bounded size",
    ),
    (
        "network_loss",
        "infrastructure",
        ("TCPRetransmitsHigh",),
        "packet loss between client and service (netns + nftables numgen drops)",
    ),
    (
        "network_latency",
        "infrastructure",
        ("ProbeLatencyHigh",),
        "added latency between client and service (userspace delaying proxy). The service's "
        "own request times start when a request reaches it and do not move; the agent's "
        "blackbox probe, sent the way the clients come in, sees it",
    ),
    (
        "redis_down",
        "infrastructure",
        ("DependencyDown", "CacheErrorsHigh"),
        "the service's Redis cache is unreachable",
    ),
    (
        "traffic_surge",
        "service",
        ("QueueBacklog", "HTTP429RateHigh"),
        "a burst of requests at N times the normal rate",
    ),
    (
        "cold_start",
        "model",
        ("ModelReloaded",),
        "the models are dropped; the next request pays the load (in-process)",
    ),
    (
        "timeouts_not_aborting",
        "service",
        ("HTTP504RateHigh", "TimedOutWorkNotAborted"),
        "a deadline cancels only the await; the GPU work keeps running (in-process)",
    ),
)

#: name -> FaultInfo; the signature id is the fault name for every fault.
FAULT_TABLE: dict[str, FaultInfo] = {
    name: FaultInfo(name, layer, name, alerts, desc) for name, layer, alerts, desc in _ROWS
}
