"""A fast HTTP/1.1 keep-alive client built on asyncio protocols, for load generation.

One request is in flight per connection (no pipelining). Completing a
response hands the connection straight to the next waiting request from a
callback, so no task is created per request: that is what lets one core send
thousands of requests a second. Responses are parsed incrementally; for
server-sent events the arrival time of every ``data:`` event is kept, which
gives time to first token and inter-token latency.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import Any, cast

from ._payload import RequestSpec
from ._report import RequestResult

__all__ = ["Engine"]

Pending = tuple[RequestSpec, bytes, float]


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _error_code(body: Any) -> str | None:
    """The service's error code from an error body (``error_code`` or ``error.code``)."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    for value in (
        body.get("error_code"),
        err.get("code") if isinstance(err, dict) else None,
        err.get("type") if isinstance(err, dict) else None,
        body.get("code"),
        body.get("detail", {}).get("error_code") if isinstance(body.get("detail"), dict) else None,
    ):
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    return None


def _usage(body: Any) -> tuple[int | None, int | None]:
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else None,
        completion if isinstance(completion, int) else None,
    )


class _Conn(asyncio.Protocol):
    """One keep-alive connection and the parse state of its current response."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.spec: RequestSpec | None = None
        self.intended = 0.0
        self.sent = 0.0
        self.used = False  # no request went on it yet
        self.buf = bytearray()
        self.body = bytearray()
        self.events: list[float] = []
        self.sse = bytearray()
        self.usage_in: int | None = None
        self.usage_out: int | None = None
        self.stream_error: str | None = None
        self.idle_since = 0.0
        self.expired = False
        self._reset()

    def _reset(self) -> None:
        # Called once per request: containers are only replaced when used.
        if self.buf:
            self.buf = bytearray()
        self.phase = 0  # 0 head, 1 content-length body, 2 chunked, 3 until close
        self.status = 0
        self.remaining = 0
        self.chunk_left = -1  # -1: expecting a size line; -2: trailers
        self.close_after = False
        self.keep_body = False
        if self.body:
            self.body = bytearray()
        if self.events:
            self.events = []
        if self.sse:
            self.sse = bytearray()
        self.usage_in = None
        self.usage_out = None
        self.stream_error = None

    # -- asyncio callbacks -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.engine._connected(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.spec is not None:
            if self.phase == 3:
                self._finish(perf_counter())
            else:
                self.fail("disconnected")
        self.engine._lost(self)

    def data_received(self, data: bytes) -> None:
        spec = self.spec
        if spec is None:
            return
        now = perf_counter()
        plain = not (spec.stream or spec.expects_json)
        if self.phase == 0 and plain and not self.buf and self._whole(data, spec, now):
            return
        self.buf += data
        if self.phase == 0 and not self._head():
            return
        if self.phase == 1:
            self._length_body(now)
        elif self.phase == 2:
            self._chunks(now)
        elif self.phase == 3:
            self._feed(bytes(self.buf), now)
            del self.buf[:]

    # -- requests ----------------------------------------------------------
    def send(self, spec: RequestSpec, wire: bytes, intended: float) -> None:
        assert self.transport is not None
        self._reset()
        self.spec = spec
        self.intended = intended
        self.sent = perf_counter()
        self.used = True
        self.transport.write(wire)

    def fail(self, error: str) -> None:
        spec, self.spec = self.spec, None
        if spec is None:
            return
        now = perf_counter()
        result = RequestResult(
            self.intended,
            self.sent,
            now - self.intended,
            self.status,
            error=error,
            prompt_tokens=spec.prompt_tokens,
        )
        self.engine._record(self, result, reuse=False)

    # -- parsing -----------------------------------------------------------
    def _whole(self, data: bytes, spec: RequestSpec, now: float) -> bool:
        """Fast path: a whole 2xx answer with Content-Length in one read (the common
        case under load); False leaves it to the general parser."""
        end = data.find(b"\r\n\r\n")
        if end < 0 or data[9:10] != b"2":
            return False
        head = data[:end].lower()
        i = head.find(b"\r\ncontent-length:")
        if i < 0 or b"transfer-encoding" in head:
            return False
        j = head.find(b"\r\n", i + 17)
        if len(data) != end + 4 + int(head[i + 17 : j if j >= 0 else end]):
            return False
        self.status = int(data[9:12])
        reuse = b"\r\nconnection: close" not in head and not data.startswith(b"HTTP/1.0")
        self.spec = None
        latency = now - self.intended
        result = RequestResult(self.intended, self.sent, latency, self.status,
                               prompt_tokens=spec.prompt_tokens)  # fmt: skip
        self.engine._record(self, result, reuse=reuse)
        return True

    def _head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = bytes(self.buf[:end]).split(b"\r\n")
        del self.buf[: end + 4]
        parts = lines[0].split(b" ", 2)
        try:
            self.status = int(parts[1])
        except (IndexError, ValueError):
            self.close_after = True
            self.fail("bad_response")
            return False
        length: int | None = None
        chunked = False
        self.close_after = parts[0] == b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"content-length":
                length = int(value)
            elif key == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif key == b"connection":
                self.close_after = b"close" in value.lower()
        assert self.spec is not None
        self.keep_body = self.spec.expects_json or self.status >= 400
        if chunked:
            self.phase = 2
        elif length is not None or self.status in (204, 304):
            self.phase, self.remaining = 1, length or 0
        else:
            self.phase = 3
        return True

    def _length_body(self, now: float) -> None:
        take = min(len(self.buf), self.remaining)
        if take:
            self._feed(bytes(self.buf[:take]), now)
            del self.buf[:take]
            self.remaining -= take
        if self.remaining == 0:
            self._finish(now)

    def _chunks(self, now: float) -> None:
        buf = self.buf
        while self.spec is not None:
            if self.chunk_left == -1:
                i = buf.find(b"\r\n")
                if i < 0:
                    return
                size = int(bytes(buf[:i]).split(b";")[0], 16)
                del buf[: i + 2]
                self.chunk_left = size if size else -2
            elif self.chunk_left == -2:
                if buf[:2] == b"\r\n":
                    del buf[:2]
                elif (i := buf.find(b"\r\n\r\n")) >= 0:
                    del buf[: i + 4]
                else:
                    return
                self._finish(now)
                return
            elif self.chunk_left > 0:
                take = min(len(buf), self.chunk_left)
                if not take:
                    return
                self._feed(bytes(buf[:take]), now)
                del buf[:take]
                self.chunk_left -= take
            else:  # chunk done: its trailing CRLF
                if len(buf) < 2:
                    return
                del buf[:2]
                self.chunk_left = -1

    def _feed(self, data: bytes, now: float) -> None:
        if self.keep_body:
            self.body += data
        assert self.spec is not None
        if self.spec.stream and self.status < 400:
            self.sse += data.replace(b"\r\n", b"\n")
            self._events(now)

    def _events(self, now: float) -> None:
        while (i := self.sse.find(b"\n\n")) >= 0:
            event = bytes(self.sse[:i])
            del self.sse[: i + 2]
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip(), now)

    def _event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            return
        if b'"usage"' in payload or b'"error"' in payload:
            obj = _json(payload)
            if isinstance(obj, dict) and "error" in obj:
                self.stream_error = _error_code(obj) or "stream_error"
                return
            usage_in, usage_out = _usage(obj)
            self.usage_in = usage_in if usage_in is not None else self.usage_in
            self.usage_out = usage_out if usage_out is not None else self.usage_out
            if isinstance(obj, dict) and not obj.get("choices"):
                return  # a usage-only final chunk carries no token
        self.events.append(now)

    def _finish(self, now: float) -> None:
        spec, self.spec = self.spec, None
        assert spec is not None
        result = RequestResult(
            self.intended,
            self.sent,
            now - self.intended,
            self.status,
            prompt_tokens=spec.prompt_tokens,
        )
        body = _json(bytes(self.body)) if self.keep_body and self.body else None
        if self.status >= 400:
            result.error = f"HTTP {self.status}"
            result.code = _error_code(body)
        elif self.stream_error is not None:
            result.error, result.code = "stream_error", self.stream_error
        if spec.stream and self.events:
            ev = self.events
            result.ttft = ev[0] - self.intended
            result.itl = [b - a for a, b in itertools.pairwise(ev)]
            result.output_tokens = self.usage_out or len(ev)
        usage_in, usage_out = _usage(body)
        if usage_out is not None:
            result.output_tokens = usage_out
        result.prompt_tokens = usage_in or self.usage_in or spec.prompt_tokens
        self.engine._record(self, result, reuse=not self.close_after)


#: Idle connections older than this are closed, not reused: below the keep-alive timeout
#: of common servers (uvicorn 5 s, gunicorn 2 s). A server closes an idle connection at
#: its timeout; a request sent on it in the same instant, before the close reached this
#: side (an event loop busy with other responses widens that instant), is lost
#: ("disconnected"), not answered: a client that keeps idle connections for ever loses
#: about 1 request in 1,000-3,500 of a bursty replay against uvicorn this way.
KEEPALIVE_EXPIRY_S = 1.5


class Engine:
    """Connections to one host:port and the requests waiting for one.

    ``submit`` sends at once on an idle connection (idle under ``keepalive_expiry``
    seconds: older ones are closed), else queues the
    request and opens a connection while under ``max_connections``. In
    closed-loop mode (``next_request`` set) every finished request is followed
    at once by the next one on the same connection until ``closed_until``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_connections: int,
        timeout: float,
        on_result: Callable[[RequestResult], None],
        keepalive_expiry: float = KEEPALIVE_EXPIRY_S,
    ) -> None:
        self.host, self.port = host, port
        self.max_connections = max_connections
        self.timeout = timeout
        self.on_result = on_result
        self.keepalive_expiry = keepalive_expiry
        #: used connections, idle, oldest first; reused newest first, so that on a
        #: keep-alive server the pool shrinks to what the rate needs and the rest expire
        self.idle: list[_Conn] = []
        #: connections no request went on yet, in the order they were opened, which is
        #: the order a server accepts them: they are used oldest first, because a server
        #: that serves one connection per worker (gunicorn's sync workers) has a worker
        #: blocked reading the oldest while newer ones wait in its accept queue
        self.fresh: deque[_Conn] = deque()
        self.busy: set[_Conn] = set()
        self.backlog: deque[Pending] = deque()
        self.max_backlog = 0
        self.n_conns = 0
        self.peak_conns = 0
        self.next_request: Callable[[], tuple[RequestSpec, bytes]] | None = None
        self.closed_until = 0.0
        self.stopping = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- public -----------------------------------------------------------
    def submit(self, spec: RequestSpec, wire: bytes, intended: float) -> None:
        if self.idle or self.fresh:
            self._expire_idle(perf_counter())
        if self.fresh:
            self._start(self.fresh.popleft(), spec, wire, intended)
            return
        if self.idle:
            self._start(self.idle.pop(), spec, wire, intended)
            return
        self.backlog.append((spec, wire, intended))
        self.max_backlog = max(self.max_backlog, len(self.backlog))
        if self.n_conns < self.max_connections:
            self.open()

    def open(self) -> None:
        self.n_conns += 1
        self.peak_conns = max(self.peak_conns, self.n_conns)
        task = asyncio.get_running_loop().create_task(self._connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def sweep(self, now: float) -> None:
        """Fail requests older than the timeout and drop their connections."""
        for conn in [c for c in self.busy if now - c.sent > self.timeout]:
            transport = conn.transport
            conn.fail("timeout")
            if transport is not None:
                transport.abort()

    def _expire_idle(self, now: float) -> None:
        """Close the idle connections older than ``keepalive_expiry`` (the list is oldest
        first: ``_release`` appends)."""
        stale = []
        while self.fresh and now - self.fresh[0].idle_since > self.keepalive_expiry:
            stale.append(self.fresh.popleft())
        n = 0
        while n < len(self.idle) and now - self.idle[n].idle_since > self.keepalive_expiry:
            n += 1
        if n:
            stale += self.idle[:n]
            self.idle[:n] = []
        for conn in stale:
            # counted out now, so the request that found it stale opens one new
            # connection, not two (its own and _lost's refill)
            conn.expired = True
            self.n_conns -= 1
            if conn.transport is not None:
                conn.transport.close()

    @property
    def idle_and_drained(self) -> bool:
        return not self.busy and not self.backlog

    def close(self) -> None:
        self.stopping = True
        for conn in [*self.idle, *self.fresh, *self.busy]:
            if conn.transport is not None:
                conn.transport.abort()
        self.idle.clear()
        self.fresh.clear()
        for task in list(self._tasks):
            task.cancel()

    # -- connection events ------------------------------------------------
    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except OSError as exc:
            self.n_conns -= 1
            self._connect_failed(type(exc).__name__)

    def _connect_failed(self, why: str) -> None:
        now = perf_counter()
        if self.backlog:
            _, _, intended = self.backlog.popleft()
            self.on_result(RequestResult(intended, now, now - intended, 0, error="connect_error"))
            if self.backlog and not self.stopping:
                self.open()
        elif self.next_request is not None and now < self.closed_until and not self.stopping:
            self.on_result(RequestResult(now, now, 0.0, 0, error="connect_error"))
            loop = asyncio.get_running_loop()
            loop.call_later(0.01, self._reopen_closed)

    def _reopen_closed(self) -> None:
        if not self.stopping and perf_counter() < self.closed_until:
            self.open()

    def _connected(self, conn: _Conn) -> None:
        if self.stopping:
            assert conn.transport is not None
            conn.transport.abort()
            return
        self._release(conn)

    def _lost(self, conn: _Conn) -> None:
        if conn.expired:
            return  # closed by _expire_idle, which counted it out
        self.n_conns -= 1
        self.busy.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        elif conn in self.fresh:
            self.fresh.remove(conn)
        if self.stopping:
            return
        refill = self.backlog and self.n_conns < self.max_connections
        if refill or (self.next_request is not None and perf_counter() < self.closed_until):
            self.open()

    def _record(self, conn: _Conn, result: RequestResult, *, reuse: bool) -> None:
        self.busy.discard(conn)
        self.on_result(result)
        if not reuse:
            if conn.transport is not None:
                conn.transport.close()
            return
        self._release(conn)

    def _release(self, conn: _Conn) -> None:
        if self.stopping:
            return
        if self.next_request is not None:
            now = perf_counter()
            if now < self.closed_until:
                spec, wire = self.next_request()
                self._start(conn, spec, wire, now)
                return
        elif self.backlog:
            self._start(conn, *self.backlog.popleft())
            return
        conn.idle_since = perf_counter()
        (self.idle if conn.used else self.fresh).append(conn)

    def _start(self, conn: _Conn, spec: RequestSpec, wire: bytes, intended: float) -> None:
        self.busy.add(conn)
        conn.send(spec, wire, intended)
