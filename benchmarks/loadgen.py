"""The load generator against a trivial endpoint, beside wrk, in the same run.

Three processes on the two cores of this machine:

- a minimal HTTP/1.1 keep-alive server (uvloop + a raw protocol, fixed "ok"
  answer) pinned to core 1, so it is never the bottleneck;
- ``aivitals.load`` pinned to core 0 (one core, open loop, Poisson arrivals,
  latency counted from each intended send time);
- ``wrk`` (Debian) pinned to core 0 too, one thread.

``rps``: open loop at rising offered rates; the highest throughput our
generator delivered while keeping up (no failures, at least 95% of the offered
rate answered). The P99 lag between intended and actual send is printed too.

``p50_ratio_vs_wrk``: both at the same offered rate (5,000/s) over the same
number of connections. wrk is closed-loop and has no rate option, so it is
paced with its Lua ``delay()`` hook: each connection waits connections/rate
seconds after every answer, which offers about the same rate. wrk's latency is
send-to-answer on a connection; ours is intended-send-to-answer, which adds our
dispatch lag: the ratio shows what measuring without coordinated omission costs
at this rate. A ratio near 1 means both see the same service time. The
ratio from our actual send times (what wrk measures) is reported beside it.
Five alternating rounds each; medians.

The machine is shared with other work while this runs: figures are noisy,
compare the ratio measured in one run rather than absolute numbers.

    .venv/bin/python benchmarks/loadgen.py [--duration 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "loadgen.json"
SERVER_CORE, CLIENT_CORE = 1, 0
MATCHED_RATE = 5000.0
CONNECTIONS = 16
LADDER = (5000.0, 8000.0, 12000.0, 16000.0, 24000.0, 32000.0)
ROUNDS = 5

_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


# -- the trivial server (child process) ------------------------------------------------
class _Trivial(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        n = self.buf.count(b"\r\n\r\n")  # GETs without bodies: one head, one answer
        if n:
            self.buf = self.buf[self.buf.rfind(b"\r\n\r\n") + 4 :]
            self.transport.write(_ANSWER * n)  # type: ignore[attr-defined]


def serve(port: int) -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Trivial, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# -- our generator (child process, one core) ------------------------------------------
def generate(port: int, rate: float, duration: float, connections: int) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from aivitals.load import LoadConfig, run_load

    config = LoadConfig(
        url=f"http://127.0.0.1:{port}/",
        rate=rate,
        duration=duration,
        connections=connections,
        max_connections=connections,
        seed=1,
    )
    rep = run_load(config)
    out = {
        "offered": rate,
        "sent": rep.sent,
        "completed": rep.completed,
        "failed": rep.failed,
        "rps": rep.request_throughput,
        "p50_ms": rep.e2e.median_ms,
        "p99_ms": rep.e2e.p99_ms,
        "p50_from_send_ms": rep.e2e_from_send.median_ms if rep.e2e_from_send else float("nan"),
        "lag_p99_ms": rep.send_lag_p99_ms,
        "max_queue": rep.max_client_queue,
    }
    print(json.dumps(out))


# -- the driver -----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pinned(core: int) -> list[str]:
    cores = os.sched_getaffinity(0)
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and core in cores else []


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("trivial server did not start")


def ours(port: int, rate: float, duration: float) -> dict[str, Any]:
    argv = [*_pinned(CLIENT_CORE), sys.executable, __file__, "--gen", str(port), str(rate),
            str(duration), str(CONNECTIONS)]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 120, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def _wrk_ms(text: str, label: str) -> float:
    m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    if m is None:
        raise RuntimeError(f"no {label} in wrk output:\n{text}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def wrk(port: int, delay_ms: float, duration: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(f"function delay()\n  return {delay_ms:.3f}\nend\n")
        script = fh.name
    try:
        argv = [*_pinned(CLIENT_CORE), "wrk", "-t1", f"-c{CONNECTIONS}",
                f"-d{max(1, round(duration))}s", "--latency", "-s", script,
                f"http://127.0.0.1:{port}/"]  # fmt: skip
        text = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60,
                              check=True).stdout  # fmt: skip
    finally:
        os.unlink(script)
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    return {
        "delay_ms": delay_ms,
        "rps": float(m.group(1)) if m else float("nan"),
        "p50_ms": _wrk_ms(text, "50%"),
        "p99_ms": _wrk_ms(text, "99%"),
    }


def wrk_delay_for(port: int, rate: float) -> float:
    """wrk's per-connection pause that offers ``rate``. wrk sleeps on millisecond
    timers, so the pause it is given is not the pause it makes: two short
    calibration runs correct it, clamped to [0.5, 1] x connections/rate."""
    nominal = CONNECTIONS / rate * 1000.0
    pause = nominal
    for _ in range(2):
        got = wrk(port, pause, 2.0)["rps"]
        pause *= got / rate  # too slow -> shorter pause, too fast -> longer
        pause = min(nominal, max(0.5 * nominal, pause))
    return pause


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install wrk")
    port = free_port()
    server = subprocess.Popen([*_pinned(SERVER_CORE), sys.executable, __file__, "--serve",
                               str(port)])  # fmt: skip
    try:
        _wait_port(port)
        ladder = [ours(port, rate, args.duration) for rate in LADDER]
        delay = wrk_delay_for(port, MATCHED_RATE)
        rounds_ours, rounds_wrk = [], []
        for _ in range(ROUNDS):  # alternate, so both see the same background load
            rounds_ours.append(ours(port, MATCHED_RATE, args.duration))
            rounds_wrk.append(wrk(port, delay, args.duration))
    finally:
        server.terminate()
        server.wait(10)
    kept = [r for r in ladder if r["failed"] == 0 and r["rps"] >= 0.95 * r["offered"]]
    rps = max((r["rps"] for r in kept), default=0.0)
    ours_p50 = statistics.median(r["p50_ms"] for r in rounds_ours)
    ours_send_p50 = statistics.median(r["p50_from_send_ms"] for r in rounds_ours)
    wrk_p50 = statistics.median(r["p50_ms"] for r in rounds_wrk)
    ratio = ours_p50 / wrk_p50

    print(f"{'offered/s':>10} {'sent':>8} {'done/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'lag p99 ms':>10} {'queue':>6}")  # fmt: skip
    for r in ladder:
        print(f"{r['offered']:>10.0f} {r['sent']:>8} {r['rps']:>9.0f} {r['p50_ms']:>8.3f} "
              f"{r['p99_ms']:>8.3f} {r['lag_p99_ms']:>10.3f} {r['max_queue']:>6}")  # fmt: skip
    print(f"\nmatched rate {MATCHED_RATE:.0f}/s over {CONNECTIONS} connections, "
          f"{ROUNDS} alternating rounds:")  # fmt: skip
    for o, w in zip(rounds_ours, rounds_wrk, strict=True):
        print(f"  ours {o['rps']:>6.0f}/s p50 {o['p50_ms']:.3f} ms "
              f"(from send {o['p50_from_send_ms']:.3f})   wrk {w['rps']:>6.0f}/s "
              f"p50 {w['p50_ms']:.3f} ms (pause {w['delay_ms']:.2f} ms)")  # fmt: skip
    print(f"  median p50: ours {ours_p50:.3f} ms, wrk {wrk_p50:.3f} ms; ratio from our "
          f"send times {ours_send_p50 / wrk_p50:.3f}")  # fmt: skip
    print(f"  load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores "
          "(shared machine: noisy; the ratio is what counts)")  # fmt: skip
    result = {
        "rps": round(rps, 1),
        "p50_ratio_vs_wrk": round(ratio, 3),
        "p50_ratio_vs_wrk_from_send": round(ours_send_p50 / wrk_p50, 3),
        "ours_p50_ms": ours_p50,
        "ours_p50_from_send_ms": ours_send_p50,
        "wrk_p50_ms": wrk_p50,
        "matched_rate": MATCHED_RATE,
        "connections": CONNECTIONS,
        "load_average": os.getloadavg()[0],
        "ladder": ladder,
        "rounds_ours": rounds_ours,
        "rounds_wrk": rounds_wrk,
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"RESULT rps={result['rps']} p50_ratio_vs_wrk={result['p50_ratio_vs_wrk']}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) > 2 and sys.argv[1] == "--gen":
        generate(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
