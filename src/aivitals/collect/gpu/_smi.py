"""The ``smi`` backend: ``nvidia-smi --query-gpu`` / ``--query-compute-apps`` CSV.

For hosts where NVML cannot be loaded into the agent. nvidia-smi can hang on
a sick GPU, so every call is bounded by ``timeout`` (the process is killed and
the read counts as a ``timeout``). ``[N/A]`` and ``[Not Supported]`` fields
are left absent and counted, never reported as 0.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from ...errors import CollectorError
from ...signals import Sample
from .._event import Event
from ._common import CountError

__all__ = ["COMPUTE_FIELDS", "GPU_FIELDS", "SmiBackend", "parse_compute_apps", "parse_query_gpu"]

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.mem",
    "pstate",
    "ecc.errors.uncorrected.volatile.total",
    "clocks_throttle_reasons.active",
)
COMPUTE_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
_MIB = 1024.0 * 1024.0
# field -> (metric, scale to our unit)
_NUMERIC = {
    "memory.total": ("gpu_memory_total_bytes", _MIB),
    "memory.used": ("gpu_memory_used_bytes", _MIB),
    "memory.free": ("gpu_memory_free_bytes", _MIB),
    "utilization.gpu": ("gpu_utilization_ratio", 0.01),
    "utilization.memory": ("gpu_memory_utilization_ratio", 0.01),
    "temperature.gpu": ("gpu_temperature_celsius", 1.0),
    "power.draw": ("gpu_power_watts", 1.0),
    "power.limit": ("gpu_power_limit_watts", 1.0),
    "clocks.sm": ("gpu_sm_clock_hertz", 1e6),
    "clocks.mem": ("gpu_memory_clock_hertz", 1e6),
}
Runner = Callable[[list[str], float], str]


def _missing(value: str) -> bool:
    return value.startswith("[") or value in ("", "N/A")


def parse_query_gpu(text: str) -> list[dict[str, str]]:
    """Rows of ``--query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits`` as dicts.

    Lines that are not CSV rows of the right width (``+ nvidia-smi`` echoes,
    warnings) are skipped.
    """
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(GPU_FIELDS) and cells[0].isdigit():
            rows.append(dict(zip(GPU_FIELDS, cells, strict=True)))
    return rows


def parse_compute_apps(text: str) -> list[dict[str, str]]:
    """Rows of ``--query-compute-apps`` (with or without the leading gpu_uuid)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3:
            cells = ["", *cells]
        if len(cells) == 4 and cells[1].isdigit():
            rows.append(dict(zip(COMPUTE_FIELDS, cells, strict=True)))
    return rows


def _run(argv: list[str], timeout: float) -> str:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass  # stuck in the driver (D state): abandon it rather than hang with it
        raise TimeoutError(f"{argv[0]} did not answer within {timeout} s") from None
    if proc.returncode != 0:
        raise CollectorError(f"{argv[0]} exited {proc.returncode}: {err.strip()[:200]}")
    return out


class SmiBackend:
    """GPU samples parsed from nvidia-smi.

    **Usage**::

        backend = SmiBackend(timeout=5.0)
        collector = GpuCollector(backend)
    """

    name = "smi"

    def __init__(
        self, *, binary: str = "nvidia-smi", timeout: float = 5.0, runner: Runner | None = None
    ) -> None:
        path = shutil.which(binary) if runner is None else binary
        if path is None:
            raise CollectorError(f"{binary} not found on PATH")
        self.binary = path
        self.timeout = timeout
        self.runner: Runner = runner or _run

    def read(self, count: CountError) -> list[Sample]:
        gpu_csv = self.runner(
            [
                self.binary,
                f"--query-gpu={','.join(GPU_FIELDS)}",
                "--format=csv,noheader,nounits",
            ],
            self.timeout,
        )
        rows = parse_query_gpu(gpu_csv)
        if not rows:
            raise CollectorError("nvidia-smi answered no GPU rows")
        out: list[Sample] = []
        uuid_to_gpu: dict[str, str] = {}
        for row in rows:
            uuid_to_gpu[row["uuid"]] = row["index"]
            out += self._gpu_samples(row, count)
        try:
            apps = self.runner(
                [
                    self.binary,
                    f"--query-compute-apps={','.join(COMPUTE_FIELDS)}",
                    "--format=csv,noheader,nounits",
                ],
                self.timeout,
            )
        except (TimeoutError, CollectorError):
            count("compute_apps_error")
            return out
        for app in parse_compute_apps(apps):
            if _missing(app["used_memory"]):
                count("process_memory_unavailable")
                continue
            labels = {
                "gpu": uuid_to_gpu.get(app["gpu_uuid"], rows[0]["index"]),
                "backend": "smi",
                "pid": app["pid"],
                "process": app["process_name"].rsplit("/", 1)[-1],
            }
            value = float(app["used_memory"]) * _MIB
            out.append(Sample("gpu_process_memory_used_bytes", labels, value))
        return out

    def _gpu_samples(self, row: dict[str, str], count: CountError) -> list[Sample]:
        lab = {"gpu": row["index"], "backend": "smi"}
        info = {
            "gpu": row["index"],
            "uuid": row["uuid"],
            "name": row["name"],
            "driver": row["driver_version"],
            "backend": "smi",
        }
        out = [Sample("gpu_info", info, 1.0)]
        for field, (metric, scale) in _NUMERIC.items():
            value = row[field]
            if _missing(value):
                count("not_supported")
                continue
            try:
                out.append(Sample(metric, lab, float(value) * scale))
            except ValueError:
                count(f"{field}_parse")
        ecc = row["ecc.errors.uncorrected.volatile.total"]
        if not _missing(ecc) and ecc.isdigit():
            out.append(Sample("gpu_ecc_errors_total", {**lab, "type": "uncorrected"}, float(ecc)))
        reasons = row["clocks_throttle_reasons.active"]
        if reasons.startswith("0x"):
            from ._nvml import CLOCK_EVENT_REASONS

            mask = int(reasons, 16)
            out += [
                Sample("gpu_clock_event_active", {**lab, "reason": r}, float(bool(mask & bit)))
                for bit, r in CLOCK_EVENT_REASONS.items()
            ]
        return out

    def drain_events(self) -> list[Event]:
        return []  # nvidia-smi has no event stream; Xids come from the kernel log

    def close(self) -> None:
        return None
