"""What each scenario injects and expects, and whether this machine can host it.

The fault's layer, its expected diagnosis signature and its expected alerts
come from the chaos package's fault table (one source of truth); here are only
the parameters that make a fault visible within a run's phases, and what the
machine needs to host it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCENARIOS", "Scenario", "hostable", "scenario"]


@dataclass(frozen=True, slots=True)
class Scenario:
    fault: str
    #: fault parameters for a full run and for ``--quick``
    params: dict[str, Any] = field(default_factory=dict)
    quick_params: dict[str, Any] = field(default_factory=dict)
    #: error codes the service's error log lines should carry while it runs
    error_codes: tuple[str, ...] = ()
    #: what the host needs; returns why not, or None
    needs: Callable[[], str | None] = lambda: None
    #: while the fault runs, a client that gives up after 0.3 s on 256-token generations
    #: (LoadPlan.impatient_*)
    impatient_client: bool = False
    #: a longer fault phase in --quick runs, for faults that need time to build up
    quick_fault_max: float | None = None
    #: a longer baseline in --quick runs, for alerts and evidence that compare with a
    #: baseline (the cache's hit ratio before the stampede must exist to drop from it)
    quick_baseline: float | None = None


def _root_net() -> str | None:
    if os.geteuid() != 0:
        return "needs root for network namespaces and nftables"
    missing = [b for b in ("ip", "nft") if shutil.which(b) is None]
    return f"needs {', '.join(missing)} (apt-get install iproute2 nftables)" if missing else None


def _redis() -> str | None:
    return (
        None
        if shutil.which("redis-server")
        else "needs redis-server (apt-get install redis-server)"
    )


_LIST: tuple[Scenario, ...] = (
    Scenario(
        "gpu_memory_leak",
        # full runs keep the pack's real for: (GPUProcessMemoryGrowth 10m after 1 GiB grew,
        # GPUMemoryHigh 5m over 90 %): ~4 requests/s x 6 MiB grows 1 GiB in ~45 s, passes
        # 90 % of the sim device at ~5.5 min and fills it at ~7 min, so the growth and the
        # 5m delta it is read by last the 10 minutes (16 MiB filled it in 160 s and
        # GPUProcessMemoryGrowth held only 7 of its 10 minutes)
        params={"mib_per_request": 6},
        # ~4 requests/s x 48 MiB: 90% of the 24 GiB sim device (14 GiB weights) in ~40 s,
        # full ~13 s later: GPUMemoryHigh (for: 5 s in quick runs) fires before any OOM
        quick_params={"mib_per_request": 48},
        quick_fault_max=60.0,
    ),
    Scenario(
        "gpu_oom",
        quick_params={"concurrency": 2, "max_tokens": 64},
        error_codes=("CUDA_OOM",),
    ),
    Scenario("gpu_xid", params={"code": 79}, quick_params={"code": 79}),
    Scenario(
        "gpu_cotenant",
        # a share of the whole device: with the service's 14 GiB of weights on 24 GiB,
        # 0.36 takes it past 90% while the batch job runs. The full run keeps quick's
        # 7-of-8 duty at the real time scale (x60): the fault's default 5 s of every 10
        # never holds GPUMemoryHigh for its 5-minute for:
        params={"share": 0.36, "period_seconds": 480, "on_seconds": 420},
        quick_params={"share": 0.36, "period_seconds": 8, "on_seconds": 7},
    ),
    # InferenceLatencyHigh fires at a p99 over 2 x the SLA, which a run sets to 2.5 x the
    # model's measured median (0.25 s for the ~0.1 s model it was designed on). There a
    # quick x5 peaked at 0.498 s, just short of 0.5 s, hence x8. A factor does not scale
    # with time, so the full run asks the same x8: x4 is under the x5 that the severity
    # sweep derives as the alert's own threshold, and misses by a few ms
    Scenario("gpu_contention", params={"factor": 8}, quick_params={"factor": 8}),
    Scenario("event_loop_blocked", params={"seconds": 0.3}, quick_params={"seconds": 0.3}),
    Scenario("worker_pool_saturated"),
    Scenario("connection_flood", quick_params={"connections": 2000}, quick_fault_max=40.0),
    Scenario("overlong_inputs", error_codes=("INPUT_TOO_LARGE",)),
    Scenario("malformed_inputs", error_codes=("INPUT_CONTROL_CHARS", "INPUT_INVALID_UTF8")),
    Scenario(
        "cache_stampede",
        quick_params={"interval": 1},
        needs=_redis,
        # CacheHitRatioDrop compares with the best hit ratio of the last
        # baseline_window (30 s in quick runs): the warm cache must be seen first
        quick_baseline=35.0,
    ),
    Scenario("cpu_burn"),
    Scenario(
        "process_memory_leak",
        # full runs: ~4 requests/s x 0.75 MiB (3 MiB/s). ProcessMemoryGrowth's
        # predict_linear over 30m put it past 90 % of a 24 GiB host within 4h from 7
        # minutes in, and must then hold 15m: it fires ~22 minutes in, when the default
        # 4 GiB cap is 2 minutes away; 6 GiB leaves 12 (8 MiB a request hit 4 GiB in ~2)
        params={"mib_per_request": 0.75, "max_mib": 6144},
        quick_params={"mib_per_request": 24, "max_mib": 3072},
    ),
    Scenario("disk_io_saturation", quick_params={"size_mib": 1024, "jobs": 4}),
    Scenario("network_loss", params={"percent": 10}, quick_params={"percent": 30}, needs=_root_net),
    Scenario(
        "network_latency",
        # the same 300 ms in both: the fault's default 100 ms is the sweep's at-threshold
        # magnitude (ProbeLatencyHigh 0.2 s over a request and its answer), which a full
        # run misses by a hair (a 0.20 s probe)
        params={"delay_ms": 300},
        quick_params={"delay_ms": 300},
        needs=_root_net,
        # the probe must be slower "than before": the diagnosis's 30 s window reached back
        # past a 4 s baseline into network_loss's revert, whose lost packets had slowed the
        # probe, so the before was not calm and the deviation was not seen
        quick_baseline=30.0,
    ),
    Scenario("redis_down", error_codes=("DEPENDENCY_DOWN",), needs=_redis),
    Scenario(
        "traffic_surge", params={"factor": 10}, quick_params={"factor": 20}, quick_fault_max=40.0
    ),
    Scenario("cold_start"),
    Scenario("timeouts_not_aborting", error_codes=("TIMEOUT",), impatient_client=True),
    # Faults no signature knows: the generic ranking must name the layer and a suspect.
    # rank_changes scores each series against its own baseline's median and spread;
    # quick mode's 4 s baseline (4 points) gives no spread to speak of, and noise
    # (GPU, network counters) outranked the fault on the recorded runs, while 10 s or
    # more ranked the suspect first in all three.
    Scenario("slow_dependency", quick_baseline=20.0),
    Scenario("thread_leak", quick_baseline=20.0),
    Scenario("disk_fill", quick_baseline=20.0),
)

#: fault name -> scenario, in the fault table's order
SCENARIOS: dict[str, Scenario] = {s.fault: s for s in _LIST}


def scenario(name: str) -> Scenario:
    from ..errors import ConfigError

    if name not in SCENARIOS:
        raise ConfigError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def hostable(s: Scenario) -> str | None:
    """None when this machine can host the scenario, else why not."""
    from ..chaos import FAULTS

    if s.fault not in FAULTS:
        return "the chaos package has no such fault yet"
    return s.needs()
