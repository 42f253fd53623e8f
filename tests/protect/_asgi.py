"""A raw ASGI driver: chunked bodies, counted reads, stalls and disconnects on demand."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    bytes_read: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


async def call(
    app: Any,
    *,
    method: str = "POST",
    path: str = "/",
    chunks: Sequence[bytes] = (),
    headers: Sequence[tuple[str, str]] = (),
    stall_after: int | None = None,
    disconnect_after: float | None = None,
) -> Reply:
    """Drive ``app`` with the body split in ``chunks``.

    ``stall_after``: after that many chunks, ``receive`` never returns (a slow-loris).
    ``disconnect_after``: once the body is sent, report ``http.disconnect`` after
    that many seconds.
    """
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1234),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }
    pending = list(chunks) or [b""]
    reply = Reply(0, {}, b"")
    sent = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if stall_after is not None and sent >= stall_after:
            await asyncio.Event().wait()
        if sent < len(pending):
            chunk = pending[sent]
            sent += 1
            reply.bytes_read += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": sent < len(pending)}
        if disconnect_after is not None:
            await asyncio.sleep(disconnect_after)
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        reply.messages.append(message)
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            reply.body += message.get("body", b"")

    # A task per request, as a server runs it: context variables do not leak between calls.
    await asyncio.ensure_future(app(scope, receive, send))
    return reply


class Echo:
    """An ASGI app that reads the whole body and answers it back as JSON; records what it saw."""

    def __init__(self) -> None:
        self.calls = 0
        self.bodies: list[bytes] = []
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls += 1
        self.scopes.append(scope)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        payload = json.dumps({"received": len(body)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def sample(registry: Any, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)
