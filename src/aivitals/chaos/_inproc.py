"""Faults that happen inside the service, through its ``/_aivitals/chaos`` endpoint.

The service must run with ``AIVITALS_CHAOS_TOKEN``; the token goes in the
``X-Aivitals-Token`` header. The service bounds each fault itself too: it is
asked for the fault's duration plus a short grace.
"""

from __future__ import annotations

from typing import ClassVar

import httpx

from ..errors import ConfigError, FaultError
from ._fault import Fault, FaultContext, FaultEffect, Touch

__all__ = ["CHAOS_PATH", "InProcessFault"]

CHAOS_PATH = "/_aivitals/chaos"


class InProcessFault(Fault):
    """A fault the service injects into itself; ``remote`` is its name there."""

    remote: ClassVar[str]
    free_params = True
    touches = (
        Touch(
            "",
            "changes the service's own state through its /_aivitals/chaos endpoint (no "
            "process, no file)",
            "the service: the revert asks it to stop, and it ends the fault itself 5 s "
            "after the duration",
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        token = ctx.require("chaos_token")
        url = ctx.require("target").rstrip("/") + CHAOS_PATH
        self.record("http_fault", url=url, token=token, fault=self.remote)
        params = {**self.values, "duration": self.duration + 5.0}
        body = {"fault": self.remote, "action": "start", "params": params}
        try:
            r = httpx.post(url, json=body, headers={"X-Aivitals-Token": token}, timeout=10.0)
        except httpx.HTTPError as exc:
            raise FaultError(f"fault {self.name!r}: service at {url} unreachable: {exc}") from exc
        if r.status_code == 404:
            raise FaultError(
                f"fault {self.name!r}: {url} not found; start the service with "
                "AIVITALS_CHAOS_TOKEN set"
            )
        if r.status_code in (400, 422):
            raise ConfigError(f"fault {self.name!r}: the service refused the params: {r.text}")
        if r.status_code != 200:
            raise FaultError(f"fault {self.name!r}: HTTP {r.status_code} from {url}: {r.text}")
        return FaultEffect(client_url=ctx.target, details={"service": r.json()})


def _inproc(name: str, remote: str) -> type[InProcessFault]:
    return type(
        "".join(p.title() for p in name.split("_")),
        (InProcessFault,),
        {"name": name, "remote": remote, "__doc__": f"In-process fault {remote!r}."},
    )


GpuMemoryLeak = _inproc("gpu_memory_leak", "gpu_leak")
GpuContention = _inproc("gpu_contention", "slow_inference")
EventLoopBlocked = _inproc("event_loop_blocked", "event_loop_block")
WorkerPoolSaturated = _inproc("worker_pool_saturated", "worker_pool_stuck")
ProcessMemoryLeak = _inproc("process_memory_leak", "process_memory_leak")
TimeoutsNotAborting = _inproc("timeouts_not_aborting", "no_abort_timeouts")
ColdStart = _inproc("cold_start", "cold_start")
# no signature knows these two: the diagnosis's generic ranking must find them
SlowDependency = _inproc("slow_dependency", "slow_dependency")
ThreadLeak = _inproc("thread_leak", "thread_leak")

IN_PROCESS: tuple[type[Fault], ...] = (
    GpuMemoryLeak,
    GpuContention,
    EventLoopBlocked,
    WorkerPoolSaturated,
    ProcessMemoryLeak,
    TimeoutsNotAborting,
    ColdStart,
    SlowDependency,
    ThreadLeak,
)
