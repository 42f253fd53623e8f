"""GPU-machine check of the real co-tenant fault (``gpu_cotenant real=1``). Self-checking.

Run on a machine with an NVIDIA GPU, torch with CUDA and nvidia-ml-py::

    .venv/bin/python benchmarks/gpu/chaos_cotenant.py [--gpu 0] [--seconds 20]

It starts the fault through ``ChaosRunner`` (a helper process that takes 40% of
the device's memory for 2 s of every 4 s and runs fp16 matmuls), samples NVML
every 0.25 s from outside, and checks that:

1. the helper's pid appears in NVML's compute processes holding >= 30% of the
   device memory during an on-phase;
2. it releases that memory in the off-phases (the saw-tooth a batch job makes);
3. SM utilization rises above 50% while it runs;
4. after the revert no helper process is left and its memory is gone.

Prints one ``[ok]``/``[fail]`` line per check, writes
``benchmarks/results/gpu_chaos_cotenant.json`` and exits non-zero on a failure.
Not run in the development session (no GPU was lent).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
RESULT = ROOT / "benchmarks" / "results" / "gpu_chaos_cotenant.json"


def sample(handle: Any, pynvml: Any) -> dict[str, Any]:
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    util = pynvml.nvmlDeviceGetUtilizationRates(handle)
    return {
        "t": time.time(),
        "used": int(mem.used),
        "total": int(mem.total),
        "util": int(util.gpu),
        "procs": {int(p.pid): int(p.usedGpuMemory or 0) for p in procs},
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()

    import pynvml

    from aivitals.chaos import ChaosRunner, FaultContext
    from aivitals.chaos._procs import start_time

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    samples: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="aivitals-chaos-gpu-"))
    with ChaosRunner(FaultContext(gpu=args.gpu), root=root) as runner:
        active = runner.start(
            "gpu_cotenant", duration=args.seconds, real=1, share=0.4, on_seconds=2,
            period_seconds=4,
        )  # fmt: skip
        pid = active.effect.details["pid"]
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            samples.append(sample(handle, pynvml))
            time.sleep(0.25)
        runner.stop(active)
    time.sleep(1.0)
    after = sample(handle, pynvml)

    total = samples[0]["total"]
    held = [s["procs"].get(pid, 0) for s in samples]
    checks = [
        (max(held) >= 0.3 * total,
         f"co-tenant pid {pid} held up to {max(held) / 2**30:.1f} GiB of {total / 2**30:.0f}"),
        (any(h == 0 for h in held[len(held) // 3 :]),
         "memory released in the off-phases (saw-tooth)"),
        (max(s["util"] for s in samples) > 50,
         f"SM utilization peaked at {max(s['util'] for s in samples)}%"),
        (pid not in after["procs"] and start_time(pid) is None,
         "after the revert: no helper process, no memory held"),
    ]  # fmt: skip
    failed = 0
    for ok, text in checks:
        print(f"[{'ok' if ok else 'fail'}] {text}")
        failed += not ok
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"checks": [{"ok": ok, "text": t} for ok, t in checks],
                                  "samples": samples, "after": after}, indent=1))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
