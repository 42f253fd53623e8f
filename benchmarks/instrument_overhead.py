"""Per-request overhead of aivitals' instrumentation against bare and peer libraries.

Two measurements, both interleaved in one run (the machine is shared, so only
figures measured side by side mean anything):

1. Micro (in-process, no network): every variant's app is called directly
   through ASGI, in interleaved blocks; a variant's overhead is the median
   over blocks of (variant - bare) measured back to back (``micro_min_*``:
   the fastest blocks compared, the least disturbed by other work). A log
   writer is drained inside the timed block, so the background formatting
   is counted.
2. HTTP: the same trivial POST endpoint served by uvicorn (uvloop + httptools,
   one worker pinned to core 0), load from ``wrk`` pinned to core 1, >= 3
   rounds with fresh server processes every round (identical servers differ
   by a few microseconds a request), each round several short passes over
   every variant in alternating order. overhead_us = the median over passes
   of 1e6/rps_variant - 1e6/rps_bare of the same pass: the machine's speed
   drifts by tens of microseconds a request over seconds, and a bare run a
   few seconds away is the fairest reference (``median_rps_overhead_us`` in
   the JSON: the same from the medians of all runs). Every response must be
   a 200: a variant answering errors (say, a 422 from a mis-declared
   endpoint) stops the run rather than timing the error path.

3. Shared core: each variant and bare served at once, both pinned to core 0
   (the scheduler splits it evenly), each loaded by its own wrk on core 1;
   the difference of their CPU microseconds per request over the same
   seconds (``shared_*`` keys). Whatever slows the machine slows both alike,
   so this is the steadiest figure (spread ~1-2 us against ~15-20 us for runs
   seconds apart) and the headline one; the two servers also disturb each
   other's caches, so if anything it reads higher than a server owning its
   core would cost.

The HTTP part also reads the server's CPU time from /proc around each run:
CPU microseconds per request is what 1e6/rps measures when the server owns
its core (``cpu_*_us`` keys).

Variants: bare, prometheus-fastapi-instrumentator, starlette-exporter,
OpenTelemetry FastAPI instrumentation, aivitals metrics (+ request id + body
size), aivitals full (+ received/responded JSON lines written to a file).

4. WSGI, in-process: the same POST endpoint as a Flask app, bare, with
   ``instrument_wsgi`` (metrics, and full with the JSON lines) and with
   prometheus-flask-exporter (grouped by route, as aivitals labels), each
   called directly (environ, start_response, iterate, close) in interleaved
   blocks, as the ASGI micro part does (``wsgi_*`` and ``flask_exporter_*``
   keys; ``--wsgi-only`` runs this part alone and merges it into the JSON).

Run: ``.venv/bin/python benchmarks/instrument_overhead.py``. Ends with
``RESULT metrics_us=... full_us=... instrumentator_us=... starlette_exporter_us=...
otel_us=... full_throughput_ratio=... wsgi_metrics_us=... wsgi_full_us=...
flask_exporter_us=...`` (the headline overheads are the shared-core pairs;
``seq_*``: the passes seconds apart, ``cpu_*``: their server CPU, ``micro_*``:
in-process; the WSGI figures are in-process)
and writes ``benchmarks/results/instrument_overhead.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# At module level, not inside build_app: with postponed annotations FastAPI
# resolves ``request: Request`` in the module's globals, and an unresolved
# name silently turns into a required query parameter (every request a 422).
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "benchmarks" / "results" / "instrument_overhead.json"
VARIANTS = (
    "bare",
    "instrumentator",
    "starlette_exporter",
    "otel",
    "aivitals_metrics",
    "aivitals_full",
)
WSGI_VARIANTS = ("wsgi_bare", "wsgi_metrics", "wsgi_full", "flask_exporter")
BODY = b'{"prompt": "hello world, how are you today?"}'
LUA = f"""wrk.method = "POST"
wrk.body = '{BODY.decode()}'
wrk.headers["Content-Type"] = "application/json"
"""
SCOPE = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/echo",
    "raw_path": b"/echo",
    "query_string": b"",
    "root_path": "",
    "headers": [
        (b"host", b"t"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
    ],
    "client": ("127.0.0.1", 1),
    "server": ("127.0.0.1", 80),
}


# ---- the apps ---------------------------------------------------------------------------
def build_app(variant: str, log_dir: str, *, own_registry: bool = False) -> tuple[Any, Any]:
    """The FastAPI app of one variant, and its log writer (aivitals_full) or None.

    ``own_registry`` gives the Prometheus-based variants a private registry so
    all of them can live in one process (the in-process benchmark).
    """
    from prometheus_client import REGISTRY, CollectorRegistry

    app = FastAPI()
    registry = CollectorRegistry() if own_registry else REGISTRY
    writer = None

    @app.post("/echo")
    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        return JSONResponse({"n": len(body)})

    if variant == "instrumentator":
        from prometheus_fastapi_instrumentator import Instrumentator

        Instrumentator(registry=registry).instrument(app).expose(app)
    elif variant == "starlette_exporter":
        from starlette_exporter import PrometheusMiddleware, handle_metrics

        app.add_middleware(PrometheusMiddleware)
        app.add_route("/metrics", handle_metrics)
    elif variant == "otel":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        FastAPIInstrumentor.instrument_app(
            app, tracer_provider=TracerProvider(), meter_provider=MeterProvider()
        )
    elif variant in ("aivitals_metrics", "aivitals_full"):
        import aivitals

        full = variant == "aivitals_full"
        aivitals.instrument(app, lifecycle_logs=full, registry=registry)
        if full:
            path = os.path.join(log_dir, f"aivitals-bench-{os.getpid()}.jsonl")
            writer = aivitals.instrument.configure_logging(path, registry=registry)
    elif variant != "bare":
        raise SystemExit(f"unknown variant {variant!r}")
    return app, writer


def serve(variant: str, port: int, log_dir: str) -> None:
    import uvicorn

    app, _ = build_app(variant, log_dir)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


# ---- in-process measurement -----------------------------------------------------------
async def _call(app: Any) -> int:
    """One request through ``app``; returns the response status."""
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(dict(SCOPE), receive, send)
    return status


async def _block(app: Any, writer: Any, calls: int) -> float:
    """Seconds per call over ``calls`` calls; a log writer is drained inside the timing."""
    t0 = time.perf_counter()
    for _ in range(calls):
        await _call(app)
    if writer is not None:
        writer.flush()  # the formatting and writing the background thread would do
    return (time.perf_counter() - t0) / calls


def micro_benchmark(blocks: int, calls: int) -> dict[str, dict[str, float]]:
    log_dir = tempfile.mkdtemp(prefix="aivitals-micro-")
    apps = {v: build_app(v, log_dir, own_registry=True) for v in VARIANTS}

    async def run() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for variant, (app, writer) in apps.items():
            status = await _call(app)
            if status != 200:  # a benchmark of the error path would measure nothing useful
                raise SystemExit(f"{variant}: the endpoint answered {status}, not 200")
            await _block(app, writer, 300)  # warm up
        for b in range(blocks):
            shift = b % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                times[variant].append(await _block(*apps[variant], calls))
        return times

    try:
        times = asyncio.run(run())
    finally:
        for _, writer in apps.values():
            if writer is not None:
                writer.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
    out = {}
    for v in VARIANTS:
        diffs = [(x - b) * 1e6 for x, b in zip(times[v], times["bare"], strict=True)]
        out[v] = {
            "us_per_request": statistics.median(times[v]) * 1e6,
            "overhead_us": statistics.median(diffs),
            # the least-disturbed blocks: closest to a quiet machine when others load it
            "min_overhead_us": (min(times[v]) - min(times["bare"])) * 1e6,
        }
    return out


# ---- WSGI, in-process ------------------------------------------------------------------
ENVIRON = {
    "REQUEST_METHOD": "POST",
    "PATH_INFO": "/echo",
    "SCRIPT_NAME": "",
    "QUERY_STRING": "",
    "SERVER_NAME": "t",
    "SERVER_PORT": "80",
    "SERVER_PROTOCOL": "HTTP/1.1",
    "HTTP_HOST": "t",
    "CONTENT_TYPE": "application/json",
    "CONTENT_LENGTH": str(len(BODY)),
    "wsgi.version": (1, 0),
    "wsgi.url_scheme": "http",
    "wsgi.multithread": False,
    "wsgi.multiprocess": False,
    "wsgi.run_once": False,
}


def build_wsgi_app(variant: str, log_dir: str) -> tuple[Any, Any]:
    """The Flask app of one WSGI variant (its own registry), and its log writer or None."""
    from flask import Flask, request
    from prometheus_client import CollectorRegistry

    app = Flask(f"bench_{variant}", static_folder=None)
    registry = CollectorRegistry()
    writer = None

    @app.post("/echo")
    def echo() -> dict[str, int]:
        return {"n": len(request.get_data())}

    if variant == "flask_exporter":
        from prometheus_flask_exporter import PrometheusMetrics

        PrometheusMetrics(app, registry=registry, group_by="url_rule")
    elif variant in ("wsgi_metrics", "wsgi_full"):
        import aivitals

        full = variant == "wsgi_full"
        aivitals.instrument_wsgi(app, lifecycle_logs=full, registry=registry)
        if full:
            path = os.path.join(log_dir, f"aivitals-wsgi-bench-{os.getpid()}.jsonl")
            writer = aivitals.instrument.configure_logging(path, registry=registry)
    elif variant != "wsgi_bare":
        raise SystemExit(f"unknown variant {variant!r}")
    return app, writer


def _wsgi_call(app: Any) -> int:
    """One request as a WSGI server makes it: call, iterate the body, close."""
    import io

    status = 0

    def start_response(line: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        nonlocal status
        status = int(line[:3])
        return None

    environ = dict(ENVIRON)
    environ["wsgi.input"] = io.BytesIO(BODY)
    environ["wsgi.errors"] = sys.stderr
    result = app(environ, start_response)
    try:
        for _ in result:
            pass
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return status


def _wsgi_block(app: Any, writer: Any, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        _wsgi_call(app)
    if writer is not None:
        writer.flush()  # the formatting and writing the background thread would do
    return (time.perf_counter() - t0) / calls


def wsgi_micro_benchmark(blocks: int, calls: int) -> dict[str, dict[str, float]]:
    """Overhead per request of each WSGI variant over the bare Flask app, in-process.

    Run after the ASGI part has stopped its log writer: two writers on the
    ``aivitals`` loggers at once would push both off their direct lane.
    """
    log_dir = tempfile.mkdtemp(prefix="aivitals-wsgi-micro-")
    apps = {v: build_wsgi_app(v, log_dir) for v in WSGI_VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in WSGI_VARIANTS}
    try:
        for variant, (app, writer) in apps.items():
            status = _wsgi_call(app)
            if status != 200:
                raise SystemExit(f"{variant}: the endpoint answered {status}, not 200")
            _wsgi_block(app, writer, 300)  # warm up
        for b in range(blocks):
            shift = b % len(WSGI_VARIANTS)
            for variant in WSGI_VARIANTS[shift:] + WSGI_VARIANTS[:shift]:
                times[variant].append(_wsgi_block(*apps[variant], calls))
    finally:
        for _, writer in apps.values():
            if writer is not None:
                writer.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
    out = {}
    for v in WSGI_VARIANTS:
        diffs = [(x - b) * 1e6 for x, b in zip(times[v], times["wsgi_bare"], strict=True)]
        out[v] = {
            "us_per_request": statistics.median(times[v]) * 1e6,
            "overhead_us": statistics.median(diffs),
            "min_overhead_us": (min(times[v]) - min(times["wsgi_bare"])) * 1e6,
        }
    return out


def wsgi_result(wsgi: dict[str, dict[str, float]]) -> dict[str, float]:
    """The RESULT keys of the WSGI part."""
    names = {"wsgi_metrics": "wsgi_metrics", "wsgi_full": "wsgi_full"}
    names["flask_exporter"] = "flask_exporter"
    out = {f"{k}_us": round(wsgi[v]["overhead_us"], 2) for k, v in names.items()}
    out |= {f"{k}_min_us": round(wsgi[v]["min_overhead_us"], 2) for k, v in names.items()}
    return out


def print_wsgi(wsgi: dict[str, dict[str, float]]) -> None:
    head = f"{'WSGI variant':22s} {'us/request':>11s} {'overhead us':>12s}"
    print(f"\n{head} {'min-block overhead':>19s}")
    for v in WSGI_VARIANTS:
        m = wsgi[v]
        print(
            f"{v:22s} {m['us_per_request']:11.1f} {m['overhead_us']:12.1f} "
            f"{m['min_overhead_us']:19.1f}"
        )


# ---- HTTP measurement -------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(variant: str, log_dir: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = ["taskset", "-c", "0", sys.executable, __file__, "--serve", variant]
    cmd += ["--port", str(port), "--log-dir", log_dir]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, port
        except OSError:
            time.sleep(0.1)
    stop_server(proc)
    raise SystemExit(f"{variant}: server did not start")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    return float(match.group(1)) * _UNITS[match.group(2)] if match else float("nan")


def _find(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    if match is None:
        raise SystemExit(f"wrk output without {pattern!r}:\n{text}")
    return match.group(1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads (the log writer included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wrk_cmd(port: int, duration: float, connections: int, script: str) -> list[str]:
    cmd = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(duration))}s"]
    return [*cmd, "-s", script, f"http://127.0.0.1:{port}/echo"]


def run_wrk(
    server: tuple[subprocess.Popen[bytes], int], duration: float, connections: int, script: str
) -> dict[str, float]:
    proc, port = server
    cmd = [*_wrk_cmd(port, duration, connections, script), "--latency"]
    cpu0 = cpu_seconds(proc.pid)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60).stdout
    cpu = cpu_seconds(proc.pid) - cpu0
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    requests = int(_find(r"(\d+) requests in", out))
    if errors:  # an error path costs differently: the comparison would mean nothing
        raise SystemExit(f"port {port}: {errors.group(1)} of {requests} responses were not 2xx")
    return {
        "rps": float(_find(r"Requests/sec:\s+([\d.]+)", out)),
        "p50_ms": _ms(_find(r"\s50%\s+(\S+)", out)),
        "p99_ms": _ms(_find(r"\s99%\s+(\S+)", out)),
        "non2xx": float(errors.group(1)) if errors else 0.0,
        # server CPU per request: what 1e6/rps measures when the server owns its core,
        # and far steadier when other work on the machine steals the core
        "cpu_us_per_request": cpu / max(1, requests) * 1e6,
    }


def http_benchmark(
    rounds: int, passes: int, duration: float, connections: int
) -> dict[str, dict[str, Any]]:
    if not shutil.which("wrk") or not shutil.which("taskset"):
        raise SystemExit("wrk and taskset are needed: apt-get install wrk util-linux")
    log_dir = tempfile.mkdtemp(prefix="aivitals-bench-")
    script = os.path.join(log_dir, "post.lua")
    Path(script).write_text(LUA)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    try:
        for r in range(rounds):
            # Fresh server processes every round: two identical servers differ by
            # several microseconds a request (memory layout, hash seeds), so one
            # process per variant for the whole run would bias the comparison.
            servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
            try:
                for v in VARIANTS:
                    servers[v] = start_server(v, log_dir)
                for v in VARIANTS:
                    run_wrk(servers[v], 1, connections, script)  # warm up
                # Short passes over every variant, direction alternating: the
                # machine's speed drifts over seconds, so each variant is
                # compared with the bare run of the same pass, seconds away.
                for p in range(passes):
                    order = VARIANTS if (r * passes + p) % 2 == 0 else tuple(reversed(VARIANTS))
                    for v in order:
                        runs[v].append(run_wrk(servers[v], duration, connections, script))
                    line = " ".join(f"{v}={runs[v][-1]['rps']:.0f}" for v in VARIANTS)
                    print(f"  round {r + 1} pass {p + 1}: {line}", flush=True)
            finally:
                for proc, _ in servers.values():
                    stop_server(proc)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    out: dict[str, dict[str, Any]] = {}
    for v in VARIANTS:
        out[v] = {k: statistics.median(r[k] for r in runs[v]) for k in runs[v][0]}
        out[v]["runs_rps"] = [r["rps"] for r in runs[v]]
        out[v]["runs_cpu_us"] = [round(r["cpu_us_per_request"], 2) for r in runs[v]]
        pairs = list(zip(runs[v], runs["bare"], strict=True))
        # the headline: the median over passes of (variant - bare of the same pass)
        out[v]["overhead_us"] = statistics.median(1e6 / x["rps"] - 1e6 / b["rps"] for x, b in pairs)
        out[v]["cpu_overhead_us"] = statistics.median(
            x["cpu_us_per_request"] - b["cpu_us_per_request"] for x, b in pairs
        )
    bare = out["bare"]["rps"]
    for v in VARIANTS:
        # the same from the medians of all runs, for comparison with older results
        out[v]["median_rps_overhead_us"] = 1e6 / out[v]["rps"] - 1e6 / bare
        out[v]["throughput_ratio"] = out[v]["rps"] / bare
    return out


def shared_core_benchmark(rounds: int, duration: float, connections: int) -> dict[str, Any]:
    """Each variant and bare served at the same time, both on core 0, loaded at once.

    The scheduler gives the two servers equal shares of the core, and whatever
    slows the machine down slows both alike, so the difference of their CPU
    microseconds per request, measured over the same seconds, is far steadier
    than runs seconds apart (one server's cache is also disturbed by the
    other's, so absolute costs read higher than with a core each).
    """
    log_dir = tempfile.mkdtemp(prefix="aivitals-bench-")
    script = os.path.join(log_dir, "post.lua")
    Path(script).write_text(LUA)
    diffs: dict[str, list[float]] = {v: [] for v in VARIANTS if v != "bare"}
    try:
        for r in range(rounds):
            for v in diffs:
                servers = {name: start_server(name, log_dir) for name in ("bare", v)}
                try:
                    for server in servers.values():
                        run_wrk(server, 1, connections, script)  # warm up
                    cpu0 = {name: cpu_seconds(proc.pid) for name, (proc, _) in servers.items()}
                    loads = {
                        name: subprocess.Popen(
                            _wrk_cmd(port, duration, connections, script),
                            stdout=subprocess.PIPE,
                            text=True,
                        )
                        for name, (_, port) in servers.items()
                    }
                    outs = {
                        name: load.communicate(timeout=duration + 60)[0]
                        for name, load in loads.items()
                    }
                    per_request = {}
                    for name, (proc, _) in servers.items():
                        if "Non-2xx" in outs[name]:
                            raise SystemExit(f"{name}: responses that were not 2xx")
                        n = int(_find(r"(\d+) requests in", outs[name]))
                        per_request[name] = (cpu_seconds(proc.pid) - cpu0[name]) / max(1, n) * 1e6
                    diffs[v].append(per_request[v] - per_request["bare"])
                    print(f"  shared core, round {r + 1}: {v} {diffs[v][-1]:+.1f} us", flush=True)
                finally:
                    for proc, _ in servers.values():
                        stop_server(proc)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    return {
        v: {"overhead_us": statistics.median(d), "runs_us": [round(x, 2) for x in d]}
        for v, d in diffs.items()
    }


# ---- report ---------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description="aivitals instrumentation overhead")
    parser.add_argument("--rounds", type=int, default=8, help="HTTP rounds (>= 3)")
    parser.add_argument("--passes", type=int, default=2, help="passes per round")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per wrk run")
    parser.add_argument(
        "--shared-rounds", type=int, default=4, help="rounds of the shared-core pairs (0: none)"
    )
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=40, help="in-process blocks per variant")
    parser.add_argument("--calls", type=int, default=500, help="in-process calls per block")
    parser.add_argument("--skip-http", action="store_true", help="micro only (no JSON written)")
    parser.add_argument(
        "--wsgi-only",
        action="store_true",
        help="only the in-process WSGI part; its figures are merged into the results JSON",
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--log-dir", default=tempfile.gettempdir(), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.log_dir)
        return
    if args.rounds < 3:
        raise SystemExit("--rounds must be at least 3")
    if args.wsgi_only:
        wsgi_only(args.blocks, args.calls)
        return
    print(f"in-process: {args.blocks} interleaved blocks x {args.calls} direct ASGI calls")
    micro = micro_benchmark(args.blocks, args.calls)
    print(f"\n{'variant':22s} {'us/request':>11s} {'overhead us':>12s} {'min-block overhead':>19s}")
    for v in VARIANTS:
        m = micro[v]
        print(
            f"{v:22s} {m['us_per_request']:11.1f} {m['overhead_us']:12.1f} "
            f"{m['min_overhead_us']:19.1f}"
        )
    print(f"\nin-process: {args.blocks} interleaved blocks x {args.calls} direct WSGI calls")
    wsgi = wsgi_micro_benchmark(args.blocks, args.calls)
    print_wsgi(wsgi)
    if args.skip_http:
        return
    print(
        f"\nHTTP: {args.rounds} rounds x {args.passes} passes x {args.duration}s per variant "
        f"(uvicorn on core 0, wrk -c{args.connections} on core 1)"
    )
    http = http_benchmark(args.rounds, args.passes, args.duration, args.connections)
    print(
        f"\n{'variant':22s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'overhead us':>12s} "
        f"{'cpu us/req':>11s} {'cpu overhead':>13s}"
    )
    for v in VARIANTS:
        h = http[v]
        print(
            f"{v:22s} {h['rps']:9.0f} {h['p50_ms']:8.3f} {h['p99_ms']:8.3f} "
            f"{h['overhead_us']:12.1f} {h['cpu_us_per_request']:11.1f} {h['cpu_overhead_us']:13.1f}"
        )
    names = {
        "metrics": "aivitals_metrics",
        "full": "aivitals_full",
        "instrumentator": "instrumentator",
        "starlette_exporter": "starlette_exporter",
        "otel": "otel",
    }
    seq = {f"seq_{k}_us": round(http[v]["overhead_us"], 2) for k, v in names.items()}
    result: dict[str, float] = {}
    shared: dict[str, Any] = {}
    if args.shared_rounds > 0:
        print(f"\nshared core: {args.shared_rounds} rounds of (bare, variant) served at once")
        shared = shared_core_benchmark(args.shared_rounds, 4.0, args.connections)
        for v, row in shared.items():
            print(f"{v:22s} {row['overhead_us']:8.1f} us  runs {row['runs_us']}")
    # The headline figures: the shared-core pairs when measured (steadier, and
    # if anything pessimistic), else the passes seconds apart.
    for k, v in names.items():
        headline = shared[v]["overhead_us"] if shared else http[v]["overhead_us"]
        result[f"{k}_us"] = round(headline, 2)
    result["full_throughput_ratio"] = round(http["aivitals_full"]["throughput_ratio"], 3)
    result |= seq
    result |= {f"cpu_{k}_us": round(http[v]["cpu_overhead_us"], 2) for k, v in names.items()}
    result |= {f"micro_{k}_us": round(micro[v]["overhead_us"], 2) for k, v in names.items()}
    result |= {f"micro_min_{k}_us": round(micro[v]["min_overhead_us"], 2) for k, v in names.items()}
    result |= wsgi_result(wsgi)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "result": result,
        "http": http,
        "micro": micro,
        "wsgi": wsgi,
        "shared_core": shared,
        "config": {
            "rounds": args.rounds,
            "passes": args.passes,
            "shared_rounds": args.shared_rounds,
            "duration_s": args.duration,
            "connections": args.connections,
            "micro_blocks": args.blocks,
            "micro_calls": args.calls,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        },
        "note": "shared 2-core machine with other work running: absolute numbers are noisy; "
        "compare variants of the same run",
    }
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print("\nRESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


def wsgi_only(blocks: int, calls: int) -> None:
    """The WSGI part alone, its figures merged into the results of the last full run."""
    print(f"in-process: {blocks} interleaved blocks x {calls} direct WSGI calls")
    wsgi = wsgi_micro_benchmark(blocks, calls)
    print_wsgi(wsgi)
    figures = wsgi_result(wsgi)
    document: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    document.setdefault("result", {}).update(figures)
    document["wsgi"] = wsgi
    # said in the file: these figures come from a later run than the rest of it
    document.setdefault("config", {}).update(
        {
            "wsgi_blocks": blocks,
            "wsgi_calls": calls,
            "wsgi_separate_run_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print("\nRESULT " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
