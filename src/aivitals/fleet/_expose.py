"""A SIMULATED fleet's live ``/metrics``: every node's exposition from one light process.

``LiveFleet`` takes a ``SynthFleet`` (its recorded H200 shapes, nodes, GPUs, seed and
fault) and renders, at any wall time, what each node's agent and service would
expose: the same families and labels as ``SynthFleet.series()`` (GPU memory,
utilization, power, clock, temperature, the server process's GPU memory; request
counters, a latency histogram, Redis lookups), each node from its own offsets and
rates, and on the agent's page the host, process, kernel-log and collector families a
real agent exports beside the GPU's (steady SIMULATED values, each node its own), so a
scraper stores and a rule pack evaluates as many series per node as on a real fleet.
The recording advances one row per ``step`` seconds of wall time, so two scrapers in
the same step read the same values. After ``warmup`` seconds the fault
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
#: A simulated node's host: CPUs, memory, its root filesystem and data disk, one NIC.
_CPUS = 64
_MEMORY = 2048 * 2**30
_DISK_SIZE = 3.84e12
#: share of the busy CPU time spent in each mode (the rest of the time is idle)
_BUSY_MODES = (("user", 0.72), ("system", 0.18), ("iowait", 0.02), ("softirq", 0.08))
_COLLECTORS = ("gpu", "host", "process", "kernel_log", "probe")
#: Series of one node's agent page (per GPU, and the host's besides) and service page
#: (the file_sd test and the benchmark count on them).
AGENT_SERIES_PER_GPU = len(_GPU_FAMILIES)
AGENT_HOST_SERIES = (
    (len(_BUSY_MODES) + 1)  # host_cpu_seconds_total by mode, idle included
    + 4  # host_cpus, host_load1/5/15
    + 7  # memory, swap, pages swapped in/out, OOM kills
    + 6  # the disk: busy, weighted, read/write time, reads/writes completed
    + 7  # the filesystem: size, free, available, files, files free, read-only, error
    + 8  # the NIC: bytes, packets, errors and drops, each way
    + 3  # TCP: segments out, retransmitted, connections established
    + 6  # the server process: memory, fds, max fds, threads, CPU, connections
    + 3  # kernel log: OOM kills, hung tasks, lines
    + 2 * len(_COLLECTORS)  # each collector's up and duration
    + 1  # aivitals_gpu_backend_info
)
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
        # each host its own steady level: the busy share of its CPUs, the memory the
        # model's workers hold, and how long it has been up (counters start there)
        self._busy = np.clip(0.3 + 0.05 * rng.standard_normal(fleet.nodes), 0.1, 0.6)
        self._used = np.clip(0.4 + 0.05 * rng.standard_normal(fleet.nodes), 0.2, 0.7)
        self._uptime = rng.uniform(1e5, 1e7, size=fleet.nodes)

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
        """Node ``i``'s agent exposition at ``t``: the GPU families, then the host's."""
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
        out += self._host_lines(i, t)
        return "\n".join(out) + "\n"

    def _host_lines(self, i: int, t: float) -> list[str]:
        """The host, process, kernel-log and collector families of node ``i`` at ``t``:
        steady levels from the node's own draw, with the same 1 % noise per step as the
        GPU's, and counters that grow at those levels from the node's uptime."""
        f = self.fleet
        k = max(int((t - self.start) // f.step), 0)
        at = float(self._uptime[i - 1]) + k * f.step  # counters move once a step too
        noise = 1.0 + 0.01 * float(np.random.default_rng((f.seed, i, k, 1)).standard_normal())
        busy = float(self._busy[i - 1])  # counters integrate the level, so no noise on it
        rate = float(self._rate[i - 1])
        requests = rate * at
        rows: list[tuple[str, str, str, float]] = []

        def add(name: str, kind: str, labels: str, value: float) -> None:
            rows.append((name, kind, labels, float(value)))  # numpy scalars repr otherwise

        cpu = _CPUS * at
        for mode, share in _BUSY_MODES:
            add("host_cpu_seconds_total", "counter", f'mode="{mode}"', cpu * busy * share)
        add("host_cpu_seconds_total", "counter", 'mode="idle"', cpu * (1.0 - busy))
        add("host_cpus", "gauge", "", float(_CPUS))
        for name, lag in (("host_load1", 1.0), ("host_load5", 0.99), ("host_load15", 0.98)):
            add(name, "gauge", "", _CPUS * busy * lag * noise)
        add("host_memory_total_bytes", "gauge", "", float(_MEMORY))
        add("host_memory_available_bytes", "gauge", "", _MEMORY * (1.0 - self._used[i - 1]))
        add("host_swap_total_bytes", "gauge", "", 0.0)
        add("host_swap_used_bytes", "gauge", "", 0.0)
        add("host_swap_in_pages_total", "counter", "", 0.0)
        add("host_swap_out_pages_total", "counter", "", 0.0)
        add("host_oom_kills_total", "counter", "", 0.0)
        disk = 'device="nvme0n1"'
        add("host_disk_io_time_seconds_total", "counter", disk, 0.05 * at)
        add("host_disk_io_time_weighted_seconds_total", "counter", disk, 0.08 * at)
        add("host_disk_read_time_seconds_total", "counter", disk, 0.03 * at)
        add("host_disk_write_time_seconds_total", "counter", disk, 0.05 * at)
        add("host_disk_reads_completed_total", "counter", disk, 40.0 * at)
        add("host_disk_writes_completed_total", "counter", disk, 120.0 * at)
        fs = 'mountpoint="/",device="/dev/nvme0n1p1",fstype="ext4"'
        free = _DISK_SIZE * (0.62 - 0.02 * (i % 7))
        add("host_filesystem_size_bytes", "gauge", fs, _DISK_SIZE)
        add("host_filesystem_free_bytes", "gauge", fs, free)
        add("host_filesystem_available_bytes", "gauge", fs, free - 0.05 * _DISK_SIZE)
        add("host_filesystem_files", "gauge", fs, 2.4e8)
        add("host_filesystem_files_free", "gauge", fs, 2.1e8)
        add("host_filesystem_readonly", "gauge", fs, 0.0)
        add("host_filesystem_device_error", "gauge", fs, 0.0)
        nic = 'interface="eth0"'
        for way, per in (("receive", 6000.0), ("transmit", 4000.0)):
            add(f"host_network_{way}_bytes_total", "counter", nic, requests * per)
            add(f"host_network_{way}_packets_total", "counter", nic, requests * per / 1400.0)
            add(f"host_network_{way}_errors_total", "counter", nic, 0.0)
            add(f"host_network_{way}_drops_total", "counter", nic, 0.0)
        segments = requests * 6.0
        add("host_tcp_out_segments_total", "counter", "", segments)
        add("host_tcp_retransmitted_segments_total", "counter", "", segments * 1e-4)
        add("host_tcp_connections", "gauge", 'port="8000",state="established"', 24.0)
        proc = 'pid="1000",process="python",role="listener"'
        add("service_process_resident_memory_bytes", "gauge", proc, 6.4e9 * noise)
        add("service_process_open_fds", "gauge", proc, 180.0)
        add("service_process_max_fds", "gauge", proc, 65536.0)
        add("service_process_threads", "gauge", proc, 48.0)
        add("service_process_cpu_seconds_total", "counter", proc, 1.5 * at)
        add("service_process_connections", "gauge", proc + ',state="established"', 24.0)
        add("kernel_oom_kills_total", "counter", 'process="python"', 0.0)
        add("kernel_hung_tasks_total", "counter", "", 0.0)
        add("kernel_log_lines_total", "counter", 'kind="info"', 0.02 * at)
        for c in _COLLECTORS:
            add("aivitals_collector_up", "gauge", f'collector="{c}"', 1.0)
            add("aivitals_collector_duration_seconds", "gauge", f'collector="{c}"', 0.004)
        add("aivitals_gpu_backend_info", "gauge", 'backend="sim"', 1.0)
        out: list[str] = []
        seen: set[str] = set()
        for name, kind, labels, value in rows:
            if name not in seen:  # one HELP and TYPE a family, before its first sample
                seen.add(name)
                out.append(f"# HELP {name} SIMULATED node's host, steady levels.")
                out.append(f"# TYPE {name} {kind}")
            out.append(f"{name}{{{labels}}} {value!r}" if labels else f"{name} {value!r}")
        return out

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
