"""A SIMULATED fleet's live ``/metrics``: every node's exposition from one light process.

``LiveFleet`` takes a ``SynthFleet`` (its recorded H200 shapes, nodes, GPUs, seed and
fault) and renders, at any wall time, what each node's agent and service would
expose: the same families and labels as ``SynthFleet.series()`` (GPU memory,
utilization, power, clock, temperature, the server process's GPU memory; request
counters, a latency histogram, Redis lookups), each node from its own offsets and
rates. The recording advances one row per ``step`` seconds of wall time, so two
scrapers in the same step read the same values. After ``warmup`` seconds the fault
starts (the faulty GPU follows the recording's ``leak`` phase). ``up`` is not
exposed: the scraper writes it; nor are ``node`` and ``instance``, which the scraper
attaches from the file_sd target (as it does for a real node).

``serve`` answers ``/node/<i>/agent/metrics`` and ``/node/<i>/service/metrics`` over
asyncio (keep-alive HTTP/1.1, no framework), and ``write_file_sd`` writes one file_sd
file per job whose targets carry ``__metrics_path__``, ``node`` and ``instance``, so a
real Prometheus or vmagent discovers 2 x ``nodes`` targets on one port. Nothing here is
a real machine: the nodes are ``sim-node-<i>`` and the GPU series say ``backend="sim"``.

    python -m aivitals.fleet._expose --nodes 1000 --port 9100 --sd-dir /tmp/sd --warmup 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ._synth import _LE, RecordedShapes, SynthFleet

__all__ = ["JOBS", "LiveFleet", "serve", "write_file_sd"]

#: The two scrape jobs of a node, as the exported prometheus.yml names them.
JOBS = ("aivitals-agent", "ai-service")
_PATH = re.compile(r"^/node/(\d+)/(agent|service)/metrics$")
_GPU_FAMILIES = (
    ("gpu_memory_used_bytes", "gauge", "mem_used"),
    ("gpu_memory_total_bytes", "gauge", "mem_total"),
    ("gpu_utilization_ratio", "gauge", "util_gpu"),
    ("gpu_power_watts", "gauge", "power_w"),
    ("gpu_sm_clock_hertz", "gauge", "sm_mhz"),
    ("gpu_temperature_celsius", "gauge", "temp_c"),
    ("gpu_process_memory_used_bytes", "gauge", "server_proc_mem"),
)
#: Series of one node's agent page and service page (the file_sd test and the benchmark
#: count on them).
AGENT_SERIES_PER_GPU = len(_GPU_FAMILIES)
SERVICE_SERIES = 2 + len(_LE) + 1 + 3 + 1


class LiveFleet:
    """``fleet``'s nodes rendered at wall time; the recording starts at ``start`` and the
    fault at ``start + warmup`` (``warmup=None``: no fault)."""

    def __init__(self, fleet: SynthFleet, *, start: float, warmup: float | None) -> None:
        if warmup is not None and warmup < 0:
            raise ConfigError(f"warmup={warmup}: must be 0 or positive")
        self.fleet = fleet
        self.start = start
        self.fault_t = None if warmup is None or fleet.fault is None else start + warmup
        rng = np.random.default_rng(fleet.seed)
        normal = fleet.shapes.normal
        self._rows = len(normal["mem_used"])
        self._normal = {c: np.asarray(v, dtype=np.float64) for c, v in normal.items()}
        self._leak = {c: np.asarray(v, dtype=np.float64) for c, v in fleet.shapes.leak.items()}
        self._offsets = rng.integers(0, self._rows, size=(fleet.nodes, fleet.gpus))
        self._rate = fleet.rps * np.maximum(1.0 + 0.02 * rng.standard_normal(fleet.nodes), 0.5)
        self._median = 0.08 * (1.0 + 0.05 * rng.standard_normal(fleet.nodes))

    def node_name(self, i: int) -> str:
        return self.fleet.node_name(i)

    def _check(self, i: int) -> None:
        if not 1 <= i <= self.fleet.nodes:
            raise ConfigError(f"node {i}: the fleet has nodes 1..{self.fleet.nodes}")

    def _faulted(self, t: float) -> bool:
        return self.fault_t is not None and t >= self.fault_t

    def gpu_values(self, i: int, t: float) -> dict[str, np.ndarray]:
        """Node ``i``'s GPU columns at ``t`` (one value per GPU), as exposed."""
        self._check(i)
        f = self.fleet
        k = max(int((t - self.start) // f.step), 0)
        rows = (self._offsets[i - 1] + k) % self._rows
        col = {c: self._normal[c][rows].copy() for _, _, c in _GPU_FAMILIES}
        # the same noise for every scraper within one step: seeded by (seed, node, step)
        noise = 1.0 + 0.01 * np.random.default_rng((f.seed, i, k)).standard_normal(f.gpus)
        if f.fault == "gpu_memory_leak" and i == f.faulty_node and self._faulted(t):
            assert self.fault_t is not None
            j = min(int((t - self.fault_t) // f.step), len(self._leak["mem_used"]) - 1)
            for c in ("mem_used", "server_proc_mem"):
                col[c][f.faulty_gpu] = self._leak[c][j]
        col["mem_used"] = col["mem_used"] * noise
        col["util_gpu"] = np.clip(col["util_gpu"] / 100.0 * noise, 0.0, 1.0)
        col["power_w"] = col["power_w"] * noise
        col["sm_mhz"] = col["sm_mhz"] * 1e6
        col["server_proc_mem"] = col["server_proc_mem"] * noise
        return col

    def agent_text(self, i: int, t: float) -> str:
        """Node ``i``'s agent exposition (the GPU families) at ``t``."""
        col = self.gpu_values(i, t)
        out: list[str] = []
        for name, kind, c in _GPU_FAMILIES:
            out.append(f"# HELP {name} SIMULATED node's GPU, shaped by a recorded H200.")
            out.append(f"# TYPE {name} {kind}")
            extra = (
                ',process="python",pid="{pid}"' if name == "gpu_process_memory_used_bytes" else ""
            )
            for g, v in enumerate(col[c].tolist()):
                labels = f'gpu="{g}",backend="sim"' + extra.format(pid=1000 + g)
                out.append(f"{name}{{{labels}}} {v!r}")
        return "\n".join(out) + "\n"

    def service_text(self, i: int, t: float) -> str:
        """Node ``i``'s service exposition (requests, latency histogram, cache) at ``t``."""
        self._check(i)
        f = self.fleet
        rate = float(self._rate[i - 1])
        elapsed = max(t - self.start, 0.0)
        count = rate * elapsed
        median = float(self._median[i - 1])
        fault_t = self.fault_t
        if f.fault == "slow_replica" and i == f.faulty_node and fault_t is not None:
            before = min(elapsed, max(fault_t - self.start, 0.0))
            latency_sum = rate * 1.2 * median * (before + 3.0 * (elapsed - before))
            median *= 3.0 if self._faulted(t) else 1.0
        else:
            latency_sum = count * median * 1.2
        base = 'route="/v1/embeddings",method="POST",model="minilm"'
        ok = base + ',status="200",status_class="2xx"'
        h = "http_request_duration_seconds"
        out = [
            f"# HELP {h} SIMULATED node's request latency.",
            f"# TYPE {h} histogram",
        ]
        for le in _LE:
            share = 0.5 * (1.0 + math.erf(math.log(le / median) / (0.5 * math.sqrt(2.0))))
            out.append(f'{h}_bucket{{{ok},le="{le!r}"}} {count * share!r}')
        out.append(f'{h}_bucket{{{ok},le="+Inf"}} {count!r}')
        out.append(f"{h}_sum{{{ok}}} {latency_sum!r}")
        out.append(f"{h}_count{{{ok}}} {count!r}")
        served, failed = count, 0.0
        if f.fault == "redis_down" and fault_t is not None and t >= fault_t:
            served = rate * max(fault_t - self.start, 0.0)
            failed = count - served
        cache = 'cache="redis"'
        out.append("# HELP cache_requests_total SIMULATED node's cache lookups.")
        out.append("# TYPE cache_requests_total counter")
        for result, v in (("hit", served * 0.5), ("miss", served * 0.5), ("error", failed)):
            out.append(f'cache_requests_total{{{cache},result="{result}"}} {v!r}')
        out.append("# HELP errors_total SIMULATED node's coded errors.")
        out.append("# TYPE errors_total counter")
        out.append(f'errors_total{{error_code="DEPENDENCY_DOWN"}} {failed!r}')
        return "\n".join(out) + "\n"

    def page(self, path: str, t: float) -> str | None:
        """The exposition a path asks for, or None for a path that is no node's."""
        m = _PATH.match(path)
        if m is None:
            return None
        i = int(m.group(1))
        if not 1 <= i <= self.fleet.nodes:
            return None
        return self.agent_text(i, t) if m.group(2) == "agent" else self.service_text(i, t)

    def file_sd(self, job: str, address: str) -> list[dict[str, object]]:
        """file_sd target groups of ``job``: one per node, all on ``address``."""
        if job not in JOBS:
            raise ConfigError(f"job {job!r}: expected one of {JOBS}")
        kind, port = ("agent", 9464) if job == "aivitals-agent" else ("service", 8000)
        return [
            {
                "targets": [address],
                "labels": {
                    "__metrics_path__": f"/node/{i}/{kind}/metrics",
                    "node": self.node_name(i),
                    # the instance a real node would have: not the one shared address
                    "instance": f"{self.node_name(i)}:{port}",
                },
            }
            for i in range(1, self.fleet.nodes + 1)
        ]


def write_file_sd(live: LiveFleet, address: str, directory: Path) -> dict[str, Path]:
    """One ``<job>.json`` file_sd file per job in ``directory``; job -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for job in JOBS:
        path = directory / f"{job}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(live.file_sd(job, address)), encoding="utf-8")
        tmp.replace(path)  # a scraper watching the file never reads half of it
        paths[job] = path
    return paths


async def _handle(
    live: LiveFleet, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Keep-alive HTTP/1.1: GET only, a body with its Content-Length, close on request."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            close = any(h.lower().startswith("connection:") and "close" in h.lower() for h in lines)
            text = live.page(parts[1].split("?", 1)[0], time.time()) if len(parts) == 3 else None
            if parts[0] != "GET" or text is None:
                status, body, ctype = "404 Not Found", b"no such node page\n", "text/plain"
            else:
                status, body = "200 OK", text.encode()
                ctype = "text/plain; version=0.0.4; charset=utf-8"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            if close:
                break
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(
    live: LiveFleet, host: str, port: int, ready: asyncio.Future[int] | None = None
) -> None:
    """Serve every node's pages on ``host:port`` until cancelled; ``ready`` gets the
    port bound (``port=0``: the one the OS chose)."""
    server = await asyncio.start_server(lambda r, w: _handle(live, r, w), host, port)
    async with server:
        if ready is not None:
            ready.set_result(int(server.sockets[0].getsockname()[1]))
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Serve a SIMULATED fleet's /metrics pages.")
    p.add_argument("--recording", required=True, help="the H200 recording (scenarios.csv)")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--fault", default="gpu_memory_leak")
    p.add_argument("--faulty-node", type=int, default=1)
    p.add_argument("--faulty-gpu", type=int, default=0)
    p.add_argument("--warmup", type=float, default=300.0, help="seconds before the fault")
    p.add_argument("--step", type=float, default=15.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sd-dir", type=Path, required=True)
    args = p.parse_args(argv)
    fleet = SynthFleet(
        RecordedShapes.load(args.recording),
        nodes=args.nodes,
        gpus=args.gpus,
        step=args.step,
        fault=None if args.fault == "none" else args.fault,
        faulty_node=args.faulty_node,
        faulty_gpu=args.faulty_gpu,
        seed=args.seed,
    )
    # two scrapers keep a connection per target open: 4 x nodes sockets, past a 1024 default
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * args.nodes + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        ceiling = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    live = LiveFleet(fleet, start=time.time(), warmup=args.warmup)

    async def run() -> None:
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(live, args.host, args.port, ready))
        await ready
        write_file_sd(live, f"{args.host}:{args.port}", args.sd_dir)
        print(f"serving {args.nodes} SIMULATED nodes on {args.host}:{args.port}", flush=True)
        await task

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
