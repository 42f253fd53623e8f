"""GPU memory and time accounting for the demo's requests.

On a machine with a CUDA device the models run there and the memory is real;
the accounting only keeps the leak fault's tensors alive. Elsewhere the demo
books its work on the simulated device (``aivitals.collect.gpu.SimGPU``), so
the collectors show GPU signals labelled ``backend="sim"``: KV-cache bytes per
token in flight (as a 7B fp16 model would hold) and busy seconds per call.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol

__all__ = ["CudaAccount", "GpuAccount", "NoGpuAccount", "SimAccount", "make_gpu_account"]


class GpuAccount(Protocol):
    backend: str
    gpu_index: int | None

    def reserve(self, nbytes: int) -> None: ...

    def release(self, nbytes: int) -> None: ...

    def leak(self, nbytes: int) -> None: ...

    def clear_leak(self) -> int: ...

    def busy(self, seconds: float) -> None: ...

    def set_slowdown(self, factor: float) -> None: ...

    def slowdown(self) -> float: ...

    def memory(self) -> tuple[int, int] | None: ...

    def close(self) -> None: ...


class NoGpuAccount:
    """No GPU and no sim device: nothing to book (the GPU signals are absent, not zero)."""

    backend = "none"
    gpu_index: int | None = None

    def reserve(self, nbytes: int) -> None:
        return None

    def release(self, nbytes: int) -> None:
        return None

    def leak(self, nbytes: int) -> None:
        return None

    def clear_leak(self) -> int:
        return 0

    def busy(self, seconds: float) -> None:
        return None

    def set_slowdown(self, factor: float) -> None:
        return None

    def slowdown(self) -> float:
        return 1.0

    def memory(self) -> tuple[int, int] | None:
        return None

    def close(self) -> None:
        return None


class SimAccount:
    """Books this process's work on the simulated GPU shared through ``state_dir``."""

    backend = "sim"

    def __init__(self, state_dir: Path, *, gpu: int, memory_total: int) -> None:
        from ..collect.gpu import SimGPU

        self._sim: Any = SimGPU(state_dir, devices=gpu + 1, memory_total=memory_total)
        self.gpu_index: int | None = gpu
        self._pid = os.getpid()
        self._leaked = 0
        self._lock = threading.Lock()
        self._slowdown = 1.0
        self._slowdown_at = 0.0
        self._busy_until = 0.0

    def hold_weights(self, nbytes: int) -> None:
        """Book the model weights for this process's life (the driver frees them at exit)."""
        self._sim.allocate(self._pid, nbytes, gpu=self.gpu_index, tag="weights")

    def reserve(self, nbytes: int) -> None:
        # Raises SimOutOfMemoryError, worded like torch's, when it does not fit.
        self._sim.allocate(self._pid, nbytes, gpu=self.gpu_index, tag="kv-cache")

    def release(self, nbytes: int) -> None:
        self._sim.free(self._pid, nbytes, gpu=self.gpu_index)

    def leak(self, nbytes: int) -> None:
        self._sim.allocate(self._pid, nbytes, gpu=self.gpu_index, tag="leak")
        with self._lock:
            self._leaked += nbytes

    def clear_leak(self) -> int:
        with self._lock:
            leaked, self._leaked = self._leaked, 0
        if leaked:
            self._sim.free(self._pid, leaked, gpu=self.gpu_index)
        return leaked

    def busy(self, seconds: float) -> None:
        """Book ``seconds`` of kernel time ending now, counting overlap with earlier calls once.

        Utilization is the share of time at least one kernel ran (as NVML reports it),
        so two workers computing at once keep the device busy once, not twice.
        """
        if seconds <= 0:
            return
        now = time.time()
        with self._lock:
            start = max(now - seconds, self._busy_until)
            self._busy_until = max(self._busy_until, now)
        if now > start:
            self._sim.busy(self.gpu_index, now - start)

    def set_slowdown(self, factor: float) -> None:
        self._sim.set_clock_slowdown(self.gpu_index, factor)
        self._slowdown_at = 0.0

    def slowdown(self) -> float:
        """The device's clock slowdown (set by this process or a fault runner), cached 0.5 s."""
        now = time.monotonic()
        if now - self._slowdown_at > 0.5:
            try:
                self._slowdown = float(self._sim.clock_slowdown(self.gpu_index))
            except Exception:
                self._slowdown = 1.0
            self._slowdown_at = now
        return self._slowdown

    def memory(self) -> tuple[int, int] | None:
        dev = self._sim.device(self.gpu_index)
        return int(dev.memory_used), int(dev.memory_total)

    def close(self) -> None:
        self.clear_leak()
        try:
            self._sim.free(self._pid, None, gpu=self.gpu_index)
        except Exception:
            pass


class CudaAccount:
    """A real CUDA device: torch owns the memory; the leak fault keeps real tensors."""

    backend = "nvml"

    def __init__(self, gpu: int = 0) -> None:
        self.gpu_index: int | None = gpu
        self._leaked: list[Any] = []
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> None:
        return None

    def release(self, nbytes: int) -> None:
        return None

    def leak(self, nbytes: int) -> None:
        import torch

        tensor = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{self.gpu_index}")
        with self._lock:
            self._leaked.append(tensor)

    def clear_leak(self) -> int:
        with self._lock:
            leaked = sum(int(t.numel()) for t in self._leaked)
            self._leaked.clear()
        import torch

        torch.cuda.empty_cache()
        return leaked

    def busy(self, seconds: float) -> None:
        return None

    def set_slowdown(self, factor: float) -> None:
        return None

    def slowdown(self) -> float:
        return 1.0

    def memory(self) -> tuple[int, int] | None:
        import torch

        free, total = torch.cuda.mem_get_info(self.gpu_index)
        return int(total - free), int(total)

    def close(self) -> None:
        self.clear_leak()


def make_gpu_account(
    device: str, sim_dir: Path | None, *, gpu: int, memory_total: int, weights: int = 0
) -> GpuAccount:
    """The account for ``device``; on the sim device ``weights`` bytes are booked at once."""
    if device.startswith("cuda"):
        return CudaAccount(gpu)
    if sim_dir is not None:
        account = SimAccount(sim_dir, gpu=gpu, memory_total=memory_total)
        if weights:
            account.hold_weights(weights)
        return account
    return NoGpuAccount()
