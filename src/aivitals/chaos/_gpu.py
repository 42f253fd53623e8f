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
from ._spec import FaultSpec, Grading, Knob, Needs, Runs, SweepBasis, capped, down, rise, up

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


# -- gpu_xid -----------------------------------------------------------------------------
GPU_XID = FaultSpec(
    name="gpu_xid",
    layer="model",
    description="an Xid error on the (simulated) GPU; 79 = fallen off the bus",
    alerts=("GPUXidError",),
    signature="gpu_xid",
    hurts_clients=True,  # 79: the GPU is gone, every model call fails until it is reset
    consequences={
        # The rule asks an idle device AND a queue or a P99 over 2 x SLA; on the sim a lost
        # device refuses the KV reservation at once, so requests fail fast: nothing in the
        # demo is known to cause the second half.
        "GPUUtilizationLow": "a device fallen off the bus does no work while requests keep "
        "arriving (unproven: the rule also needs a queue or a slow P99)",
        "ServiceNotReady": "the readiness probe's inference fails on the lost device (the "
        "sim keeps an Xid 79 device lost until the revert resets it)",
    },
    needs=Needs(
        "gpu",
        external="it raises an Xid on the demo's simulated GPU; a real device's Xid cannot "
        "be caused from outside the service",
    ),
    runs=Runs(params={"code": 79}, quick_params={"code": 79}),
    grading=Grading(
        knob=lambda b: Knob(
            param=None,
            unit="Xid events",
            bound=1.0,
            source="GPUXidError: any Xid",
            note="one magnitude: an event",
        ),
        measure=lambda w, b: w.delta("sum(gpu_xid_errors_total)"),
    ),
)


class GpuXid(Fault):
    """An Xid (``code``, default 79: GPU has fallen off the bus) on the sim GPU,
    attributed to the service's pid, repeated every ``interval`` seconds (0: once)."""

    name = "gpu_xid"
    spec = GPU_XID
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


# -- gpu_cotenant ------------------------------------------------------------------------
def _cotenant_knob(b: SweepBasis) -> Knob:
    # GPUMemoryHigh (device > gpu_memory_ratio) with the service's weights on the device;
    # the co-tenant's share is what is left to the bound.
    ratio = b.pack.gpu_memory_ratio
    weights = b.sim_weights_bytes / b.sim_gpu_memory_total
    need = ratio - weights
    free = 1.0 - weights
    # twice the share does not fit beside the weights (the sim refuses the whole
    # allocation): the most that fits, a step below the free share for the KV
    # reservations of requests in flight, is severe, and moderate lies halfway to it
    most = down(free - 0.01, 0.01)
    return Knob(
        param="share",
        unit="share of the device taken by the co-tenant",
        bound=need,
        source=f"GPUMemoryHigh gpu_memory_ratio {ratio:g} minus the demo's "
        f"weights ({weights:.3f} of the sim device)",
        threshold={"share": up(need, 0.01)},
        moderate={"share": capped(up(need, 0.01), 2 * need, most, 0.01)},
        note=f"capped: 2 x {need:.3f} does not fit in the {free:.3f} left free; severe is "
        f"the most that fits ({most:g}), moderate halfway to it",
        severe={"share": most},
    )


GPU_COTENANT = FaultSpec(
    name="gpu_cotenant",
    layer="model",
    description="another process periodically takes a large share of the GPU memory",
    alerts=("GPUMemoryHigh",),
    signature="gpu_cotenant",
    consequences={
        "GPUUtilizationHigh": "the batch job's kernels keep the SMs busy through each "
        "on-phase, whatever the share of memory it takes",
    },
    needs=Needs("gpu", external_params={"real": 1}),
    runs=Runs(
        # a share of the whole device: with the service's 14 GiB of weights on 24 GiB,
        # 0.36 takes it past 90% while the batch job runs. The full run keeps quick's
        # 7-of-8 duty at the real time scale (x60): the fault's default 5 s of every 10
        # never holds GPUMemoryHigh for its 5-minute for:
        params={"share": 0.36, "period_seconds": 480, "on_seconds": 420},
        quick_params={"share": 0.36, "period_seconds": 8, "on_seconds": 7},
    ),
    grading=Grading(
        knob=_cotenant_knob,
        magnitude=lambda p, b: float(p["share"]),
        measure=lambda w, b: rise(
            w, "max(gpu_memory_used_bytes / gpu_memory_total_bytes)", "gpu_memory_used_bytes"
        ),
    ),
)


class GpuCotenant(Fault):
    """Another process takes ``share`` of the GPU's memory for ``on_seconds`` of
    every ``period_seconds`` (an offline batch job), keeping the SMs busy.

    ``real`` 0 (default) acts on the simulated GPU of ``sim_gpu_dir``; ``real`` 1
    allocates on CUDA device ``gpu`` with torch and runs matmuls (a GPU machine).
    """

    name = "gpu_cotenant"
    spec = GPU_COTENANT
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


# -- gpu_oom -----------------------------------------------------------------------------
GPU_OOM = FaultSpec(
    name="gpu_oom",
    layer="model",
    description="over-long inputs whose KV-cache reservation no longer fits on the GPU",
    alerts=("GPUOutOfMemoryErrors",),
    signature="gpu_oom",
    consequences={
        "GPUMemoryHigh": "the fault books 97 % of the device's free memory to the service "
        "(the fragmentation it stands for), past GPUMemoryHigh's 90 %",
        # quick: 480 + 64 tokens reserve 272 MiB of the 307 MiB left; the full run's
        # 480 + 256 reserve 368 MiB and never fit
        "InferenceLatencyHigh": "a long request that still fits in what is left (one at a "
        "time in quick runs) runs a 480-token prompt through the model, far past the SLA",
        "HostCPUSaturated": "those long generations run back to back on the CPU-run demo "
        "model, which spreads each over every core",
    },
    needs=Needs(
        "gpu",
        external="it fills the demo's simulated GPU memory; on a real device only its "
        "over-long inputs would act, which overlong_inputs already tests",
    ),
    runs=Runs(quick_params={"concurrency": 2, "max_tokens": 64}, error_codes=("CUDA_OOM",)),
    grading=Grading(
        knob=lambda b: Knob(
            param=None,
            unit="CUDA_OOM errors",
            bound=1.0,
            source="GPUOutOfMemoryErrors: any CUDA OOM",
            note="one magnitude: an event",
        ),
        measure=lambda w, b: w.delta('sum(model_inference_errors_total{error_code="CUDA_OOM"})'),
    ),
)


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
    spec = GPU_OOM
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
