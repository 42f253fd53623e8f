"""GPU faults on the SIMULATED device (``SimGPU``): Xid, a co-tenant, OOM.

On a machine with a real GPU the same scenarios run through the service's
own code (in-process faults) and real torch; these three act on the sim
device that the demo service, the agent and this runner share through its
state directory.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

from ..errors import FaultRefused
from ..load import completions_request, make_prompt
from ._clients import client_load
from ._fault import Fault, FaultContext, FaultEffect, Touch

__all__ = ["GpuCotenant", "GpuOOM", "GpuXid"]


def _sim(ctx: FaultContext):  # type: ignore[no-untyped-def]
    from ..collect.gpu import SimGPU

    return SimGPU(Path(ctx.require("sim_gpu_dir")))


def _require_cuda(gpu: int) -> None:
    try:
        import torch
    except ImportError as exc:
        raise FaultRefused("real=1 needs torch (pip install 'aivitals[demo]')") from exc
    if not torch.cuda.is_available() or gpu >= torch.cuda.device_count():
        raise FaultRefused(f"real=1: no CUDA device {gpu} here; use the sim GPU (real=0)")


class GpuXid(Fault):
    """An Xid (``code``, default 79: GPU has fallen off the bus) on the sim GPU,
    attributed to the service's pid, repeated every ``interval`` seconds (0: once)."""

    name = "gpu_xid"
    params = {"code": (79, 1, 200), "interval": (0, 0, 3600)}
    touches = (
        Touch(
            "",
            "appends Xid events to the sim GPU's state dir (a runner thread repeats them "
            "when interval > 0); Xid 79 also marks the device lost, so every allocation "
            "fails until it is reset, as a GPU that fell off the bus does",
            "resets the sim device (a lost one works again); the thread ends with the fault",
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        from ..collect.gpu import XID_LOST

        sim = _sim(ctx)
        code = int(self.values["code"])
        if code == XID_LOST:  # journaled first: a crashed run's cleanup still resets it
            self.record("sim_lost", state_dir=str(ctx.sim_gpu_dir), gpu=ctx.gpu)
        sim.inject_xid(ctx.gpu, code, ctx.service_pid)
        interval = self.values["interval"]
        if interval > 0:

            def repeat() -> None:
                while not self._stopped.wait(interval):
                    sim.inject_xid(ctx.gpu, code, ctx.service_pid)

            threading.Thread(target=repeat, name="aivitals-xid", daemon=True).start()
        # An Xid is an event; 79 leaves the device lost until a reset (the revert's)
        return FaultEffect(client_url=ctx.target, details={"xid": code, "gpu": ctx.gpu})


class GpuCotenant(Fault):
    """Another process takes ``share`` of the GPU's memory for ``on_seconds`` of
    every ``period_seconds`` (an offline batch job), keeping the SMs busy.

    ``real`` 0 (default) acts on the simulated GPU of ``sim_gpu_dir``; ``real`` 1
    allocates on CUDA device ``gpu`` with torch and runs matmuls (a GPU machine).
    """

    name = "gpu_cotenant"
    params = {"share": (0.6, 0.01, 1.0), "period_seconds": (10, 1, 3600),
              "on_seconds": (5, 0.5, 3600), "real": (0, 0, 1)}  # fmt: skip
    choices = {"real": (0, 1)}
    touches = (
        Touch(
            "real=0",
            "starts a helper process that allocates on the sim GPU (state dir)",
            "the run: stopped and its sim allocation freed at revert; cleanup does both "
            "after a crash",
            processes=True,
        ),
        Touch(
            "real=1",
            "starts a helper process that allocates on CUDA device gpu with torch (refused "
            "without one)",
            "the run: stopped at revert (the driver frees its memory); cleanup stops it "
            "after a crash",
            processes=True,
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        common = {"gpu": ctx.gpu, "share": self.values["share"],
                  "on_seconds": self.values["on_seconds"],
                  "period_seconds": self.values["period_seconds"]}  # fmt: skip
        if self.values["real"]:
            _require_cuda(ctx.gpu)
            pid = self.helper("cotenant_cuda", "gpu_cotenant", **common)
            return FaultEffect(client_url=ctx.target, details={"pid": pid, "device": "cuda"})
        state_dir = str(ctx.require("sim_gpu_dir"))
        _sim(ctx)  # make sure the device exists before the helper uses it
        pid = self.helper("cotenant", "gpu_cotenant", state_dir=state_dir, **common)
        # The sim releases a dead process's memory; the entry frees it explicitly too.
        self.record("sim_alloc", state_dir=state_dir, gpu=ctx.gpu, pid=pid, nbytes=2**62)
        return FaultEffect(client_url=ctx.target, details={"pid": pid, "device": "sim"})


#: Over-long prompts the gpu_oom client cycles through (each different).
_OOM_PROMPTS = 64


class GpuOOM(Fault):
    """Over-long inputs whose KV-cache reservation no longer fits.

    A client sends prompts of ``prompt_tokens`` with ``max_tokens`` to
    ``/v1/completions`` at ``concurrency``. On the sim GPU, with ``fill`` > 0,
    the service's own GPU account first holds that share of the free sim memory
    (what allocator fragmentation and cached blocks do on a long-running
    server), so the long requests fail with CUDA OOM while short ones still
    fit. On a real GPU (no ``sim_gpu_dir``) only the inputs act.
    """

    name = "gpu_oom"
    params = {
        "prompt_tokens": (480, 16, 100_000),
        "max_tokens": (256, 1, 100_000),
        "concurrency": (8, 1, 256),
        "fill": (0.97, 0, 0.999),
    }
    touches = (
        Touch(
            "",
            "books fill of the sim GPU's free memory to the service's pid, and starts a "
            "load-generator helper process",
            "the run: the booking is freed and the helper stopped at revert; cleanup does "
            "both after a crash",
            processes=True,
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        fill = self.values["fill"]
        held = 0
        # Without a sim GPU (a real one) only the over-long inputs act.
        if fill > 0 and ctx.sim_gpu_dir is not None:
            sim = _sim(ctx)
            pid = int(ctx.require("service_pid"))
            held = int(sim.device(ctx.gpu).memory_free * fill)
            self.record(
                "sim_alloc", state_dir=str(ctx.sim_gpu_dir), gpu=ctx.gpu, pid=pid, nbytes=held
            )
            sim.allocate(pid, held, gpu=ctx.gpu, tag="chaos-fragmentation")
        # Distinct prompts, new at each injection: one fixed prompt that once got an
        # answer (right after a revert, with the memory back) was served from the
        # service's response cache the next time, and no request reached the model
        # (the second and third cases of a sweep had no OOM at all).
        rng = random.Random()
        specs = [
            completions_request(
                make_prompt(int(self.values["prompt_tokens"]), rng=rng),
                int(self.values["max_tokens"]),
                stream=False,
            )
            for _ in range(_OOM_PROMPTS)
        ]
        client = client_load(self, ctx, specs, concurrency=int(self.values["concurrency"]))
        return FaultEffect(client_url=ctx.target, details={"held_bytes": held, "pid": client})
