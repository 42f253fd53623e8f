"""GPU-machine check: ``aivitals validate`` on a real GPU for the GPU faults. Self-checking.

Run on a machine with an NVIDIA GPU, torch with CUDA and nvidia-ml-py::

    .venv/bin/python benchmarks/gpu/validate_gpu.py [--out DIR] [--full]

It runs ``aivitals validate --gpu nvml`` (the demo service's models on the
GPU, the agent reading NVML, no simulated device) over the GPU memory leak,
GPU OOM and co-tenant scenarios (``--quick`` unless ``--full``), and checks:

1. the run really used the real device: the report's environment says
   ``gpu: nvml`` and the service log names a ``cuda`` device;
2. every scenario ran (none skipped, none errored);
3. each scenario's checks passed (alerts fired, diagnosis, logs, resolve).

Prints one ``[ok]``/``[fail]`` line per check plus validate's own lines,
writes ``benchmarks/results/gpu_validate.json`` (and the validate report and
its Markdown under ``--out``), exits non-zero on any failure.
Not run in the development session (no GPU was lent).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "gpu_validate.json"
SCENARIOS = ("gpu_memory_leak", "gpu_oom", "gpu_cotenant")


def _check(lines: list[dict[str, Any]], name: str, ok: bool, text: str) -> None:
    lines.append({"check": name, "ok": ok, "text": text})
    print(f"[{'ok' if ok else 'fail'}] {text}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="where reports and logs go")
    p.add_argument("--full", action="store_true", help="full-length phases, not --quick")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="aivitals-gpu-validate-"))
    out.mkdir(parents=True, exist_ok=True)
    report, md, work = out / "validate.json", out / "validate.md", out / "work"
    argv = [
        sys.executable, "-m", "aivitals.cli", "validate", "--gpu", "nvml",
        "--scenarios", ",".join(SCENARIOS), "--report", str(report),
        "--markdown", str(md), "--workdir", str(work),
        *([] if args.full else ["--quick"]),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    rc = subprocess.run(argv, env=env, check=False, timeout=3000).returncode
    checks: list[dict[str, Any]] = []
    if not report.is_file():
        _check(checks, "report", False, f"validate wrote no report (exit {rc})")
        return _finish(checks, rc, out)
    data = json.loads(report.read_text())
    gpu = data.get("environment", {}).get("gpu")
    log = work / "service.jsonl"
    devices = (
        {
            str(json.loads(line).get("gpu_device_id"))
            for line in log.read_text().splitlines()
            if line.startswith("{")
        }
        if log.is_file()
        else set()
    )
    _check(
        checks,
        "real_gpu",
        gpu == "nvml" and any(d.startswith("cuda") for d in devices),
        f"ran on the real GPU (environment gpu={gpu}, service devices {sorted(devices)[:4]})",
    )
    ran = {s["fault"]: s for s in data["scenarios"]}
    for name in SCENARIOS:
        s = ran.get(name)
        if s is None or s["skipped"] or s["error"]:
            why = "missing" if s is None else (s["skipped"] or s["error"])
            _check(checks, name, False, f"{name} did not run: {why}")
            continue
        failed = [c["text"] for c in s["checks"] if c["ok"] is False]
        _check(
            checks,
            name,
            not failed,
            f"{name}: " + ("all checks passed" if not failed else "; ".join(failed)),
        )
    return _finish(checks, rc, out)


def _finish(checks: list[dict[str, Any]], rc: int, out: Path) -> int:
    passed = all(c["ok"] for c in checks) and rc == 0
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(
        json.dumps(
            {"passed": passed, "validate_exit": rc, "checks": checks, "out": str(out)}, indent=2
        )
        + "\n"
    )
    print(f"RESULT passed={int(passed)} validate_exit={rc} checks={len(checks)}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
