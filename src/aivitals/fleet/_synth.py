"""A SYNTHETIC fleet built from a recorded GPU's shapes: thousands of nodes without them.

The shapes are a real recording (an H200 under the demo's load, one row every
0.5 s: ``tests/fixtures/gpu/h200/scenarios.csv``): the ``normal`` phase gives
every healthy GPU its memory, utilization, power, clock, temperature and server
process memory (each GPU from its own random offset in the phase, with a little
noise), the ``leak`` phase gives the faulty GPU its growth. One recorded row is
one sample, ``step`` seconds apart, so a 40-row leak spans 40 steps. Nothing
here is measured on this fleet: the series say ``backend="sim"`` and the nodes
``sim-node-<i>``.

Faults: ``gpu_memory_leak`` (one GPU of one node), ``slow_replica`` (one node's
request latency three times its peers'), ``redis_down`` (every node's cache
lookups fail: one shared dependency), or None.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["FAULTS", "RecordedShapes", "SynthFleet"]

FAULTS = ("gpu_memory_leak", "slow_replica", "redis_down")
_COLUMNS = ("mem_used", "mem_total", "util_gpu", "power_w", "sm_mhz", "temp_c", "server_proc_mem")
#: Bucket bounds of the synthetic request-latency histograms (a subset of the catalogue's).
_LE = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class RecordedShapes:
    """The recording's phases, column -> array of values."""

    normal: dict[str, np.ndarray]
    leak: dict[str, np.ndarray]
    source: str

    @classmethod
    def load(cls, path: Path | str) -> RecordedShapes:
        p = Path(path)
        try:
            rows = list(csv.DictReader(p.open(encoding="utf-8")))
        except OSError as exc:
            raise ConfigError(f"GPU recording {p}: {exc}") from exc
        phases: dict[str, dict[str, list[float]]] = {}
        for row in rows:
            try:
                values = {c: float(row[c]) for c in _COLUMNS}
            except (KeyError, TypeError, ValueError):
                continue  # a row without a GPU sample (the header of a phase, a gap)
            for c, v in values.items():
                phases.setdefault(row.get("phase", ""), {}).setdefault(c, []).append(v)
        if not {"normal", "leak"} <= set(phases):
            raise ConfigError(f"GPU recording {p}: needs 'normal' and 'leak' phases")
        arr = {k: {c: np.asarray(v) for c, v in cols.items()} for k, cols in phases.items()}
        return cls(arr["normal"], arr["leak"], str(p))


@dataclass(frozen=True)
class SynthFleet:
    """``nodes`` x ``gpus`` series over ``points`` steps ending at ``end``; ``fault`` on
    node ``faulty_node`` (1-based) from ``fault_at`` (a share of the window) on."""

    shapes: RecordedShapes
    nodes: int = 1000
    gpus: int = 8
    points: int = 121
    step: float = 15.0
    end: float = 1_800_000_000.0
    fault: str | None = "gpu_memory_leak"
    faulty_node: int = 1
    faulty_gpu: int = 3
    fault_at: float = 0.66
    seed: int = 0
    rps: float = 20.0

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ConfigError(f"fault={self.fault!r}: expected one of {FAULTS} or None")
        if not 1 <= self.faulty_node <= self.nodes or not 0 <= self.faulty_gpu < self.gpus:
            raise ConfigError("faulty_node / faulty_gpu outside the fleet")
        if self.points < 20:
            raise ConfigError(f"points={self.points}: at least 20 (the detector's baseline)")

    @property
    def times(self) -> np.ndarray:
        return self.end - self.step * np.arange(self.points - 1, -1, -1, dtype=np.float64)

    @property
    def onset(self) -> int:
        return int(self.points * self.fault_at)

    def node_name(self, i: int) -> str:
        return f"sim-node-{i}"

    def series(self) -> Iterator[tuple[str, dict[str, str], np.ndarray]]:
        """``(metric, labels, values)`` for every series, values on ``times``."""
        rng = np.random.default_rng(self.seed)
        normal, leak = self.shapes.normal, self.shapes.leak
        n_rows = len(normal["mem_used"])
        for i in range(1, self.nodes + 1):
            node = self.node_name(i)
            agent = {"node": node, "instance": f"{node}:9478", "job": "aivitals-agent"}
            service = {"node": node, "instance": f"{node}:8000", "job": "ai-service"}
            yield "up", dict(agent), np.ones(self.points)
            yield "up", dict(service), np.ones(self.points)
            for g in range(self.gpus):
                rows = (rng.integers(0, n_rows) + np.arange(self.points)) % n_rows
                col = {c: normal[c][rows] for c in _COLUMNS}
                noise = 1.0 + 0.01 * rng.standard_normal(self.points)
                if (
                    self.fault == "gpu_memory_leak"
                    and i == self.faulty_node
                    and g == self.faulty_gpu
                ):
                    grow = np.minimum(
                        np.arange(self.points - self.onset), len(leak["mem_used"]) - 1
                    )
                    for c in ("mem_used", "server_proc_mem"):
                        col[c] = col[c].copy()
                        col[c][self.onset :] = leak[c][grow]
                gl = {**agent, "gpu": str(g), "backend": "sim"}
                yield "gpu_memory_used_bytes", gl, col["mem_used"] * noise
                yield "gpu_memory_total_bytes", gl, col["mem_total"]
                yield "gpu_utilization_ratio", gl, np.clip(col["util_gpu"] / 100.0 * noise, 0, 1)
                yield "gpu_power_watts", gl, col["power_w"] * noise
                yield "gpu_sm_clock_hertz", gl, col["sm_mhz"] * 1e6
                yield "gpu_temperature_celsius", gl, col["temp_c"]
                pl = {**gl, "pid": str(1000 + g), "process": "python"}
                yield "gpu_process_memory_used_bytes", pl, col["server_proc_mem"] * noise
            yield from self._service(i, service, rng)

    def _service(
        self, i: int, labels: dict[str, str], rng: np.random.Generator
    ) -> Iterator[tuple[str, dict[str, str], np.ndarray]]:
        """Request counters and a latency histogram per node; the cache's lookups."""
        per_step = self.rps * self.step * (1.0 + 0.02 * rng.standard_normal(self.points))
        count = np.cumsum(np.maximum(per_step, 0.0))
        median = np.full(self.points, 0.08 * (1.0 + 0.05 * rng.standard_normal()))
        if self.fault == "slow_replica" and i == self.faulty_node:
            median[self.onset :] *= 3.0
        base = {**labels, "route": "/v1/embeddings", "method": "POST", "model": "minilm"}
        ok = {**base, "status": "200", "status_class": "2xx"}
        yield "http_request_duration_seconds_count", ok, count
        yield "http_request_duration_seconds_sum", ok, np.cumsum(per_step * median * 1.2)
        for le in _LE:
            # lognormal latencies around the median (sigma 0.5): the share under each bound
            share = 0.5 * (1.0 + _erf(np.log(le / median) / (0.5 * math.sqrt(2.0))))
            yield (
                "http_request_duration_seconds_bucket",
                {**ok, "le": repr(le)},
                np.cumsum(per_step * share),
            )
        yield "http_request_duration_seconds_bucket", {**ok, "le": "+Inf"}, count
        down = np.zeros(self.points, dtype=bool)
        if self.fault == "redis_down":
            down[self.onset :] = True
        lookups = per_step
        for result, part in (("hit", 0.5), ("miss", 0.5)):
            vals = np.where(down, 0.0, lookups * part)
            yield (
                "cache_requests_total",
                {**labels, "cache": "redis", "result": result},
                np.cumsum(vals),
            )
        errors = np.cumsum(np.where(down, lookups, 0.0))
        yield "cache_requests_total", {**labels, "cache": "redis", "result": "error"}, errors
        yield "errors_total", {**labels, "error_code": "DEPENDENCY_DOWN"}, errors

    def to_store(self) -> Any:
        """The fleet in an embedded ``Store`` (tests; small fleets)."""
        from ..tsdb import Store

        store = Store(retention=self.points * self.step + 3600.0, max_series=10_000_000)
        times = self.times.tolist()
        for name, labels, values in self.series():
            for t, v in zip(times, values.tolist(), strict=True):
                store.append(name, labels, float(v), t)
        return store

    def import_lines(self) -> Iterator[str]:
        """VictoriaMetrics' JSON line import format (``/api/v1/import``), one series a line."""
        ts = [int(t * 1000) for t in self.times.tolist()]
        ts_text = json.dumps(ts)
        for name, labels, values in self.series():
            metric = json.dumps({"__name__": name, **labels})
            vals = ",".join(f"{v:.6g}" for v in values.tolist())
            yield f'{{"metric":{metric},"values":[{vals}],"timestamps":{ts_text}}}'


def _erf(x: np.ndarray) -> np.ndarray:
    """Vectorised erf (Abramowitz-Stegun 7.1.26, |error| < 1.5e-7): no scipy needed."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return np.asarray(sign * (1.0 - poly * np.exp(-a * a)))
