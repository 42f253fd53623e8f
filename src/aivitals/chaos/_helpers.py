"""Helper processes that faults run: ``python -m aivitals.chaos._helpers KIND JSON``.

Each helper ends by itself at ``deadline`` (epoch seconds) even if the runner
that started it is gone; the runner (or ``aivitals chaos cleanup``) normally
ends it sooner.

``JSON`` may be ``@path`` of a file holding it.

Kinds: ``cpu`` (busy loops, the fallback when stress-ng is absent), ``disk``
(writes + fsync, the fallback when fio is absent), ``log_fill`` (log files
growing at a given rate to a bound), ``flood`` (idle keep-alive
connections), ``cotenant`` (periodic sim GPU allocations; ``cotenant_cuda`` with torch on a
real GPU), ``proxy`` (a TCP
proxy that can listen inside a network namespace and add delay), ``load``
(a load-generator loop with given request bodies).
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import errno
import json
import multiprocessing
import os
import random
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["main"]

CLONE_NEWNET = 0x40000000


# -- cpu -----------------------------------------------------------------------
def _spin(deadline: float, load: float) -> None:
    period = 0.1
    while time.time() < deadline:
        t0 = time.monotonic()
        while time.monotonic() - t0 < period * load:
            pass
        if load < 1.0:
            time.sleep(period * (1.0 - load))


def cpu(args: dict[str, Any]) -> None:
    deadline, load = float(args["deadline"]), float(args.get("load", 100)) / 100.0
    workers = [
        multiprocessing.Process(target=_spin, args=(deadline, load), daemon=True)
        for _ in range(int(args["workers"]))
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(max(0.0, deadline - time.time()) + 1.0)


# -- disk ----------------------------------------------------------------------
def disk(args: dict[str, Any]) -> None:
    directory, deadline = Path(args["dir"]), float(args["deadline"])
    size, block = int(args["size_bytes"]), 1 << 20
    data = os.urandom(block)
    path = directory / "aivitals-disk-fault.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        written = 0
        while time.time() < deadline:
            if written >= size:
                os.lseek(fd, 0, os.SEEK_SET)  # bounded: overwrite the same file
                written = 0
            os.write(fd, data)
            written += block
            os.fsync(fd)
    finally:
        os.close(fd)


# -- log volume ------------------------------------------------------------------
#: One log line as a service that logs every failure with its traceback writes it.
_LOG_LINE = (
    '{"ts": %.3f, "level": "ERROR", "logger": "aivitals.demo", "msg": "request failed", '
    '"request_id": "%08x", "traceback": "Traceback (most recent call last):\\n  File '
    '\\"/srv/app/handler.py\\", line 42, in handle\\n    return await call(payload)\\n'
    'TimeoutError: upstream did not answer"}\n'
)


def log_fill(args: dict[str, Any]) -> None:
    """Log files growing at ``rate`` bytes/s in ``dir`` until ``max_bytes`` are written
    or the filesystem is full (ENOSPC), in 64 KiB appends, each fsynced (a logger that
    must not lose lines), rotated every 32 MiB. Full, the files stay as they are until
    the deadline."""
    directory, deadline = Path(args["dir"]), float(args["deadline"])
    rate, limit = float(args["rate"]), int(args["max_bytes"])
    block, rotate = 64 << 10, 32 << 20
    written, n, started = 0, 0, time.monotonic()
    fd = -1
    try:
        while time.time() < deadline and written < limit:
            if fd < 0 or written // rotate != (written - 1) // rotate:
                if fd >= 0:
                    os.close(fd)
                name = directory / f"service.log.{written // rotate}"
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            lines = bytearray()
            while len(lines) < block:
                n += 1
                lines += (_LOG_LINE % (time.time(), n)).encode()
            chunk = bytes(lines[: min(block, limit - written)])
            try:
                done = os.write(fd, chunk)
                os.fsync(fd)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    break  # the volume is full: the logger's writes fail from here on
                raise
            written += done
            # keep the pace: never ahead of rate x elapsed
            ahead = written / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(min(ahead, max(0.0, deadline - time.time())))
    finally:
        if fd >= 0:
            os.close(fd)
    # nothing more to write: the files stay until the revert
    time.sleep(max(0.0, deadline - time.time()))


# -- flood ---------------------------------------------------------------------
def _raise_nofile(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        new_hard = hard if hard == resource.RLIM_INFINITY else max(hard, want)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, new_hard), new_hard))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


#: Seconds over which the flood's connections open, and the longest pause before one
#: reopens. Clients of a real pool are not in step. Opened at once, all 2,000 were closed
#: together by the server's keep-alive timeout (uvicorn: 5 s) and reopened together. The
#: open fds then dipped every cycle, the loop stalled on 2,000 reconnects and requests at
#: once, and FdsNearLimit's condition reset before its for: held.
_FLOOD_SPREAD_S = 5.0
_FLOOD_REOPEN_S = (0.1, 0.5)


async def _hold(host: str, port: int, request: bytes, deadline: float) -> None:
    await asyncio.sleep(random.uniform(0.0, _FLOOD_SPREAD_S))
    while time.time() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.5)
            continue
        try:
            if request:
                writer.write(request)
            # Idle: read (and drop) whatever comes until the server closes.
            while time.time() < deadline:
                chunk = await asyncio.wait_for(reader.read(65536), max(0.1, deadline - time.time()))
                if not chunk:
                    break
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()
        await asyncio.sleep(random.uniform(*_FLOOD_REOPEN_S))


async def _flood(args: dict[str, Any]) -> None:
    host, port, n = args["host"], int(args["port"]), int(args["connections"])
    path = args.get("path", "/")
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: keep-alive\r\n\r\n"
    deadline = float(args["deadline"])
    tasks = [asyncio.ensure_future(_hold(host, port, request.encode(), deadline)) for _ in range(n)]
    await asyncio.wait(tasks, timeout=max(0.0, deadline - time.time()) + 1.0)


def flood(args: dict[str, Any]) -> None:
    _raise_nofile(int(args["connections"]) + 256)
    asyncio.run(_flood(args))


# -- sim GPU co-tenant ------------------------------------------------------------
def cotenant(args: dict[str, Any]) -> None:
    from ..collect.gpu import SimGPU, SimOutOfMemoryError

    sim = SimGPU(args["state_dir"])
    gpu, me, deadline = int(args["gpu"]), os.getpid(), float(args["deadline"])
    on_s, period = float(args["on_seconds"]), float(args["period_seconds"])
    while time.time() < deadline:
        dev = sim.device(gpu)
        nbytes = int(dev.memory_total * float(args["share"]))
        try:
            sim.allocate(me, nbytes, gpu=gpu, tag="cotenant-batch-job")
            _busy(sim, gpu, min(on_s, deadline - time.time()))
            sim.free(me, gpu=gpu)
        except SimOutOfMemoryError:
            pass  # the serving process holds too much right now; try next period
        time.sleep(max(0.0, min(period - on_s, deadline - time.time())))


def _busy(sim: Any, gpu: int, seconds: float) -> None:
    end = time.time() + max(0.0, seconds)
    while time.time() < end:
        time.sleep(0.2)
        sim.busy(gpu, 0.2)  # the batch job's kernels keep the SMs busy


def cotenant_cuda(args: dict[str, Any]) -> None:
    """The same batch job on a real GPU: torch allocations and matmuls."""
    import torch  # only on a GPU machine with the demo extra

    dev = torch.device(f"cuda:{int(args['gpu'])}")
    deadline = float(args["deadline"])
    on_s, period = float(args["on_seconds"]), float(args["period_seconds"])
    while time.time() < deadline:
        _, total = torch.cuda.mem_get_info(dev)
        try:
            block = torch.empty(int(total * float(args["share"])), dtype=torch.uint8, device=dev)
            a = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
            end = min(time.time() + on_s, deadline)
            while time.time() < end:
                a = (a @ a).clamp_(-1, 1)
                torch.cuda.synchronize(dev)
            del block, a
        except torch.cuda.OutOfMemoryError:
            pass  # the serving process holds too much right now; try next period
        torch.cuda.empty_cache()
        time.sleep(max(0.0, min(period - on_s, deadline - time.time())))


# -- proxy ---------------------------------------------------------------------
def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _listen_in(netns: str | None, host: str, port: int) -> Any:
    import socket

    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY) if netns else None
    try:
        if target is not None:
            _setns(target)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(4096)
        sock.setblocking(False)
        return sock
    finally:
        if target is not None:
            _setns(own)  # upstream connections are made from the host's namespace
            os.close(target)
        os.close(own)


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Callable[[], float]
) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def pump_out() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    out = asyncio.ensure_future(pump_out())
    last_due = 0.0
    try:
        while True:
            data = await reader.read(65536)
            # Keep order: a chunk never leaves before the one read before it.
            last_due = max(loop.time() + delay(), last_due)
            await queue.put((last_due, data))
            if not data:
                break
        await out
    except (OSError, asyncio.CancelledError):
        out.cancel()
    finally:
        writer.close()


async def _proxy(args: dict[str, Any]) -> None:
    delay_s, jitter = float(args.get("delay", 0.0)), float(args.get("jitter", 0.0))
    rng = random.Random()

    def delay() -> float:
        return max(0.0, delay_s + (rng.uniform(-jitter, jitter) if jitter else 0.0))

    up_host, up_port = args["upstream"]

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(up_host, int(up_port))
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, uw, delay), _pipe(ur, w, delay))

    sock = _listen_in(args.get("netns"), args["listen"][0], int(args["listen"][1]))
    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        await asyncio.sleep(max(0.0, float(args["deadline"]) - time.time()))


def proxy(args: dict[str, Any]) -> None:
    _raise_nofile(65536)
    asyncio.run(_proxy(args))


# -- load ----------------------------------------------------------------------
def load(args: dict[str, Any]) -> None:
    from ..load import LoadConfig, RequestSpec, run_load

    specs = tuple(
        RequestSpec(
            s["method"],
            s["path"],
            base64.b64decode(s["body"]),
            tuple((k, v) for k, v in s.get("headers", [])),
            stream=bool(s.get("stream")),
        )
        for s in args["specs"]
    )
    duration = max(0.1, float(args["deadline"]) - time.time())
    options: dict[str, Any] = (
        {"rate": args.get("rate")}
        if args.get("rate")
        else {"concurrency": int(args["concurrency"])}
    )
    url = args["url"]
    fresh = args.get("fresh")
    if fresh:  # every request a new input, made by the load generator (input_pool 0)
        url = url.rstrip("/") + fresh["path"]
        options |= {
            "input_pool": 0,
            "prompt_tokens": int(fresh["prompt_tokens"]),
            "max_tokens": int(fresh["max_tokens"]),
        }
    config = LoadConfig(
        url=url,
        duration=duration,
        requests=specs,
        timeout=float(args.get("timeout", 30)),
        allow_hosts=tuple(args.get("allow_hosts", ())),
        max_connections=256,
        **options,
    )
    report = run_load(config)
    print(
        json.dumps({"sent": report.sent, "errors": report.errors, "codes": report.error_codes}),
        flush=True,
    )


HELPERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "cpu": cpu,
    "disk": disk,
    "log_fill": log_fill,
    "flood": flood,
    "cotenant": cotenant,
    "cotenant_cuda": cotenant_cuda,
    "proxy": proxy,
    "load": load,
}


def main(argv: list[str]) -> int:
    kind, raw = argv[0], argv[1]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if raw.startswith("@"):
        raw = Path(raw[1:]).read_text()
    HELPERS[kind](json.loads(raw))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
