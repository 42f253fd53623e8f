"""A tiny HTTP/1.1 server for the load tests, on 127.0.0.1 in a background thread.

Routes: ``GET /`` -> "ok"; ``POST /v1/embeddings`` -> JSON with usage;
``POST /v1/completions`` with ``stream`` -> SSE of ``max_tokens`` events,
``token_delay`` apart after ``ttft_delay``; ``/slow`` waits ``slow_delay``;
``/serial`` too, one request at a time;
``/error`` -> 503 with an error code; ``/close`` answers with Connection: close;
any other path -> "ok" (a user's own API, recorded like the rest).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class TinyServer:
    port: int = 0
    ttft_delay: float = 0.05
    token_delay: float = 0.01
    slow_delay: float = 0.2
    requests: int = 0
    connections: int = 0
    paths: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    #: each request's method and header lines, as sent
    heads: list[tuple[str, ...]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    chaos_token: str = "test-token-123"
    chaos_calls: list[dict[str, object]] = field(default_factory=list)
    serial_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _response(status: int, body: bytes, ctype: str = "text/plain", close: bool = False) -> bytes:
    reason = {200: "OK", 422: "Unprocessable", 503: "Service Unavailable"}.get(status, "X")
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\nContent-Type: {ctype}\r\n"
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode() + body


async def _handle(
    state: TinyServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    state.connections += 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = 0
            for line in lines[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = await reader.readexactly(length) if length else b""
            state.requests += 1
            state.paths.append(path)
            state.heads.append((method, *lines[1:]))
            state.bodies.append(body[:200])
            state.sizes.append(len(body))
            if not await _route(state, method, path, body, writer):
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _route(
    state: TinyServer, method: str, path: str, body: bytes, writer: asyncio.StreamWriter
) -> bool:
    if path == "/_aivitals/chaos":
        return _chaos(state, method, body, writer)
    if path == "/v1/completions":
        req = json.loads(body)
        if req.get("stream"):
            await _stream(state, int(req["max_tokens"]), len(req["prompt"].split()), writer)
        else:
            usage = {
                "prompt_tokens": len(req["prompt"].split()),
                "completion_tokens": req["max_tokens"],
            }
            out = json.dumps({"choices": [{"text": "x"}], "usage": usage}).encode()
            writer.write(_response(200, out, "application/json"))
        return True
    if path == "/v1/embeddings":
        n = len(json.loads(body)["input"].split())
        out = json.dumps({"data": [{"embedding": [0.0]}], "usage": {"prompt_tokens": n}}).encode()
        writer.write(_response(200, out, "application/json"))
        return True
    if path == "/slow":
        await asyncio.sleep(state.slow_delay)
    if path == "/serial":  # one request at a time, like a single worker
        async with state.serial_lock:
            await asyncio.sleep(state.slow_delay)
    if path == "/error":
        err = json.dumps({"error": {"code": "QUEUE_FULL", "message": "busy"}}).encode()
        writer.write(_response(503, err, "application/json"))
        return True
    if path == "/close":
        writer.write(_response(200, b"bye", close=True))
        await writer.drain()
        return False
    writer.write(_response(200, b"ok"))
    return True


def _chaos(state: TinyServer, method: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
    # The demo's contract, reduced: the token is checked by the test through the calls.
    call = json.loads(body) if body else {}
    state.chaos_calls.append(call)
    if call.get("fault") == "bad_params":
        writer.write(_response(422, b'{"detail": "bad"}', "application/json"))
    else:
        writer.write(_response(200, json.dumps({"started": call}).encode(), "application/json"))
    return True


async def _stream(state: TinyServer, n: int, prompt: int, writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    await asyncio.sleep(state.ttft_delay)
    for i in range(n):
        if i:
            await asyncio.sleep(state.token_delay)
        ev = b"data: " + json.dumps({"choices": [{"text": f"t{i}"}]}).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
        await writer.drain()
    usage = {"prompt_tokens": prompt, "completion_tokens": n}
    for ev in (
        b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n",
        b"data: [DONE]\n\n",
    ):
        writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
    writer.write(b"0\r\n\r\n")
    await writer.drain()


@contextmanager
def tiny_server(**kwargs: float) -> Iterator[TinyServer]:
    state = TinyServer(**kwargs)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    server_box: list[asyncio.Server] = []

    async def start() -> None:
        srv = await asyncio.start_server(
            lambda r, w: _handle(state, r, w), "127.0.0.1", 0, backlog=4096
        )
        state.port = srv.sockets[0].getsockname()[1]
        server_box.append(srv)
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield state
    finally:

        async def stop() -> None:
            server_box[0].close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
