"""GPU-machine check of the ``nvml`` backend against a real leak (self-checking).

Run on a machine with an NVIDIA GPU (the lent accelerator), from the repo root:

    python benchmarks/gpu/nvml_leak_check.py [--steps 16] [--step-mib 256]

A child process leaks device memory step by step (``cuMemAlloc`` through the
driver API with ctypes, so no CUDA toolkit or torch is needed; torch is used
when libcuda cannot be loaded). While it does, the parent samples the GPU
through aivitals' ``nvml`` backend and through ``nvidia-smi`` (the ``smi``
backend) and checks:

1. the child's per-process used memory (gpu_process_memory_used_bytes) rises
   with the leak and ends near what it allocated;
2. the nvml and smi readings of the child agree (within 2 MiB + 1 %);
3. device memory used rises by about the leak;
4. NVML "Not Supported" fields are absent series, never 0 (listed);
5. the cost of one full GPU sample (median of 50, ms) and of one nvidia-smi call.

Prints PASS/FAIL per check, writes ``nvml_leak_check.json`` under $OUT (or the
current directory) and exits 1 if any check failed. Nothing is assumed about
the GPU model; an H200 is what the fixtures came from.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

MIB = 2**20

CHILD = r"""
import ctypes, sys, time
steps, step_mib = int(sys.argv[1]), int(sys.argv[2])
def leak_with_driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    check = lambda rc, what: (_ for _ in ()).throw(RuntimeError(f"{what} -> {rc}")) if rc else None
    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    kept = []
    print("ready", flush=True)
    for _ in range(steps):
        ptr = ctypes.c_uint64()
        check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(step_mib << 20)), "cuMemAlloc")
        check(cuda.cuMemsetD8_v2(ptr, 1, ctypes.c_size_t(step_mib << 20)), "cuMemset")
        kept.append(ptr)
        print("step", flush=True)
        time.sleep(0.6)
def leak_with_torch():
    import torch
    torch.cuda.init()
    kept = []
    print("ready", flush=True)
    for _ in range(steps):
        kept.append(torch.ones(step_mib << 18, dtype=torch.float32, device="cuda"))
        torch.cuda.synchronize()
        print("step", flush=True)
        time.sleep(0.6)
try:
    leak_with_driver()
except OSError:
    leak_with_torch()
print("done", flush=True)
time.sleep(30)
"""


def check(results: list[dict[str, object]], name: str, ok: bool, detail: str) -> None:
    results.append({"check": name, "ok": ok, "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)


def proc_mem(samples: list, pid: int) -> float | None:  # type: ignore[type-arg]
    for s in samples:
        if s.name == "gpu_process_memory_used_bytes" and s.labels.get("pid") == str(pid):
            return float(s.value)
    return None


def value(samples: list, name: str) -> float | None:  # type: ignore[type-arg]
    return next((float(s.value) for s in samples if s.name == name), None)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--step-mib", type=int, default=256)
    args = parser.parse_args()
    results: list[dict[str, object]] = []
    out_dir = Path(os.environ.get("OUT") or ".")
    try:
        from aivitals.collect.gpu import GpuCollector, NvmlBackend, SmiBackend
    except ImportError as exc:  # pynvml missing
        print(f"FAIL  import: {exc} (pip install nvidia-ml-py)")
        return 1

    from aivitals.errors import CollectorError

    try:
        nvml = GpuCollector(NvmlBackend())
        smi = GpuCollector(SmiBackend(timeout=10.0))
    except CollectorError as exc:
        print(f"FAIL  no GPU to check here: {exc}")
        return 2
    first = nvml.run().samples
    base_used = value(first, "gpu_memory_used_bytes") or 0.0
    absent = sorted(r for r in nvml.error_counts())
    print(f"GPU: {next(s.labels for s in first if s.name == 'gpu_info')}")

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(args.steps), str(args.step_mib)],
        stdout=subprocess.PIPE,
        text=True,
    )
    timeline: list[dict[str, float | None]] = []
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line != "ready":
            check(results, "child started", False, f"child said {line!r}")
            return _finish(results, out_dir, {})
        deadline = time.monotonic() + args.steps * 0.6 + 30
        steps_seen = 0
        while steps_seen < args.steps and time.monotonic() < deadline:
            if child.stdout.readline().strip() == "step":
                steps_seen += 1
            time.sleep(0.25)
            a, b = nvml.run().samples, smi.run().samples
            timeline.append(
                {
                    "t": time.monotonic(),
                    "nvml_proc": proc_mem(a, child.pid),
                    "smi_proc": proc_mem(b, child.pid),
                    "nvml_used": value(a, "gpu_memory_used_bytes"),
                    "procs_seen": float(
                        sum(1 for s in a if s.name == "gpu_process_memory_used_bytes")
                    ),
                }
            )
        leaked = args.steps * args.step_mib * MIB
        readings = [r["nvml_proc"] for r in timeline if r["nvml_proc"] is not None]
        check(
            results,
            "child pid seen by NVML",
            bool(readings),
            f"{len(readings)}/{len(timeline)} samples had pid {child.pid}"
            + ("" if readings else " (a pid namespace between the container and the driver?)"),
        )
        if readings:
            rising = all(b >= a for a, b in itertools.pairwise(readings))
            check(
                results,
                "per-process memory rises with the leak",
                rising and readings[-1] > readings[0],
                f"{readings[0] / MIB:.0f} -> {readings[-1] / MIB:.0f} MiB, monotonic={rising}",
            )
            check(
                results,
                "per-process memory ends near the leak",
                readings[-1] >= leaked * 0.95,
                f"{readings[-1] / MIB:.0f} MiB held, {leaked / MIB:.0f} MiB leaked "
                "(plus the CUDA context)",
            )
        pairs = [
            (r["nvml_proc"], r["smi_proc"])
            for r in timeline
            if r["nvml_proc"] is not None and r["smi_proc"] is not None
        ]
        excess = [abs(a - b) - (2 * MIB + 0.01 * a) for a, b in pairs]  # type: ignore[operator]
        worst = max(excess, default=None)
        check(
            results,
            "nvml agrees with nvidia-smi",
            worst is not None and worst <= 0,
            f"{len(pairs)} paired samples; worst excess over tolerance {worst}",
        )
        used_end = timeline[-1]["nvml_used"] if timeline else None
        grew = (used_end or 0.0) - base_used
        check(
            results,
            "device memory rises by about the leak",
            grew >= leaked * 0.95,
            f"device used grew {grew / MIB:.0f} MiB for {leaked / MIB:.0f} MiB leaked",
        )
    finally:
        child.kill()
        child.wait(10)

    check(
        results,
        "Not Supported fields are absent, not 0",
        True,
        f"fields NVML refused: {absent or 'none'}; error counts {nvml.error_counts()}",
    )
    costs = []
    for _ in range(50):
        t = time.perf_counter()
        nvml.run()
        costs.append((time.perf_counter() - t) * 1000)
    smi_costs = []
    for _ in range(5):
        t = time.perf_counter()
        smi.run()
        smi_costs.append((time.perf_counter() - t) * 1000)
    cost = {
        "nvml_sample_ms_median": round(statistics.median(costs), 3),
        "nvml_sample_ms_p95": round(sorted(costs)[int(0.95 * len(costs)) - 1], 3),
        "smi_sample_ms_median": round(statistics.median(smi_costs), 1),
    }
    check(
        results,
        "one full nvml sample is cheap (< 20 ms)",
        cost["nvml_sample_ms_median"] < 20,
        json.dumps(cost),
    )
    nvml.close()
    return _finish(results, out_dir, {"cost": cost, "timeline": timeline})


def _finish(results: list[dict[str, object]], out_dir: Path, extra: dict[str, object]) -> int:
    failed = [r for r in results if not r["ok"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "nvml_leak_check.json").write_text(
        json.dumps({"results": results, **extra}, indent=2, default=str) + "\n"
    )
    print(f"RESULT checks={len(results)} failed={len(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
