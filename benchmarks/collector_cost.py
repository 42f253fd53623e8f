"""What the agent costs: CPU seconds per minute and peak RSS.

The agent runs as its own process (``aivitals agent``) with every collector at
1 s: host, process (the target server's pid), gpu (the SIMULATED backend: no
GPU here), kernel log. It scrapes 4 targets of 2,000 series each, served by a
separate process, at the scrape interval (15 s by default, Prometheus's
default; ``--scrape-interval`` to change), into its embedded store. CPU is
read from /proc/<pid>/stat over the steady state (after a warm-up that covers
imports and the first scrapes); peak RSS is the kernel's high-water mark
(VmHWM) over the whole run, start-up included.

    .venv/bin/python benchmarks/collector_cost.py [--minutes 5] [--scrape-interval 15]

The machine is shared with other work while this runs: the CPU figure is noisy
(other processes steal cycles and caches), so treat small differences as noise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "collector_cost.json"
TARGETS = 4
SERIES = 2000
WARMUP_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the scrape targets (run in a child process) ----------------------------------------
def exposition(target: int, tick: int) -> bytes:
    """2,000 series in 20 families x 100 label sets, values moving every scrape."""
    out: list[str] = []
    for f in range(20):
        name = f"bench_target_metric_{f}_total" if f % 2 else f"bench_target_gauge_{f}"
        kind = "counter" if f % 2 else "gauge"
        out.append(f"# HELP {name} Benchmark series {f}.\n# TYPE {name} {kind}\n")
        for i in range(SERIES // 20):
            value = tick * (i + 1) if f % 2 else (i * 7 + tick) % 100
            out.append(f'{name}{{target="{target}",shard="{i % 10}",id="{i}"}} {value}\n')
    return "".join(out).encode()


def serve_targets(ports: list[int]) -> None:
    ticks = dict.fromkeys(range(len(ports)), 0)

    def handler_for(index: int) -> type[BaseHTTPRequestHandler]:
        class H(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                ticks[index] += 1
                body = exposition(index, ticks[index])
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return H

    servers = [ThreadingHTTPServer(("127.0.0.1", p), handler_for(i)) for i, p in enumerate(ports)]
    import threading

    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    servers[0].serve_forever()


# --- measuring -------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def wait_ready(url: str, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("agent did not become ready")


def run(minutes: float, scrape_interval: float) -> dict[str, object]:
    import httpx

    ports = [free_port() for _ in range(TARGETS)]
    targets = subprocess.Popen(
        [sys.executable, __file__, "--serve-targets", ",".join(map(str, ports))],
        stdin=subprocess.DEVNULL,
    )
    sim_dir = tempfile.mkdtemp(prefix="aivitals-bench-sim-")
    agent_port = free_port()
    argv = [
        sys.executable, "-m", "aivitals.cli", "agent",
        "--listen", f"127.0.0.1:{agent_port}",
        "--gpu", "sim", "--sim-gpu-dir", sim_dir,
        "--pid", str(targets.pid),
        "--interval", "1s",
        "--scrape-interval", f"{scrape_interval}s",
        "--retention", "1h",
    ]  # fmt: skip
    for i, p in enumerate(ports):
        argv += ["--scrape", f"bench{i}=http://127.0.0.1:{p}/metrics"]
    agent = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{agent_port}"
    try:
        wait_ready(url, 60)
        time.sleep(WARMUP_S)
        cpu0, t0 = cpu_seconds(agent.pid), time.monotonic()
        rss_samples: list[int] = []
        end = t0 + minutes * 60
        while time.monotonic() < end:
            rss_samples.append(status_kb(agent.pid, "VmRSS"))
            time.sleep(1.0)
        cpu1, t1 = cpu_seconds(agent.pid), time.monotonic()
        peak_kb = status_kb(agent.pid, "VmHWM")
        q = httpx.get(url + "/api/v1/query", params={"query": "count(up == 1)"}, timeout=10)
        targets_up = float(q.json()["data"]["result"][0]["value"][1])
        series = httpx.get(
            url + "/api/v1/query", params={"query": "aivitals_tsdb_series"}, timeout=10
        ).json()["data"]["result"][0]["value"][1]
        collectors = httpx.get(
            url + "/api/v1/query",
            params={"query": "aivitals_collector_up"},
            timeout=10,
        ).json()["data"]["result"]
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
        targets.terminate()
        targets.wait(10)
    wall = t1 - t0
    cpu = cpu1 - cpu0
    return {
        "minutes": round(wall / 60, 2),
        "collector_interval_s": 1.0,
        "scrape_interval_s": scrape_interval,
        "targets": TARGETS,
        "series_per_target": SERIES,
        "targets_up": targets_up,
        "store_series": int(float(series)),
        "collectors": {c["metric"]["collector"]: float(c["value"][1]) for c in collectors},
        "cpu_seconds": round(cpu, 3),
        "cpu_seconds_per_minute": round(cpu / wall * 60, 3),
        "cpu_pct": round(cpu / wall * 100, 3),
        "rss_mb": round(peak_kb / 1024, 1),
        "rss_steady_max_mb": round(max(rss_samples) / 1024, 1),
        "note": "shared 2-core machine; gpu collector is the simulated backend",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--serve-targets", help=argparse.SUPPRESS)
    parser.add_argument("--no-save", action="store_true", help="Do not write the result json.")
    args = parser.parse_args()
    if args.serve_targets:
        serve_targets([int(p) for p in args.serve_targets.split(",")])
        return
    r = run(args.minutes, args.scrape_interval)
    print(f"agent cost over {r['minutes']} min (after {WARMUP_S:.0f} s warm-up)")
    print(f"  collectors at 1 s: {', '.join(f'{k}={v:g}' for k, v in r['collectors'].items())}")  # type: ignore[union-attr]
    print(
        f"  scrapes: {TARGETS} targets x {SERIES} series every {r['scrape_interval_s']} s, "
        f"{r['targets_up']:g} up; store holds {r['store_series']} series"
    )
    print(f"  {'metric':<26} {'value':>10} {'target':>10}")
    print(f"  {'cpu % of one core':<26} {r['cpu_pct']:>10} {'< 1.0':>10}")
    print(f"  {'cpu s per minute':<26} {r['cpu_seconds_per_minute']:>10} {'< 0.6':>10}")
    print(f"  {'peak RSS MB (VmHWM)':<26} {r['rss_mb']:>10} {'< 80':>10}")
    print("  (shared machine: CPU figures are noisy)")
    if not args.no_save:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(r, indent=2) + "\n")
    print(f"RESULT cpu_pct={r['cpu_pct']} rss_mb={r['rss_mb']}")


if __name__ == "__main__":
    main()
