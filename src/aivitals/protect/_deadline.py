"""Timeouts that abort the work, not only the coroutine awaiting it.

When a request's deadline passes or its client disconnects, the middleware

1. calls ``aivitals.instrument.abort_request(request_id, reason)``: every model
   call of the request registered an abort hook (``call.on_abort(fn)``; a
   generation loop stops at its next token, a vLLM-like engine gets its own
   ``abort_request``), so the GPU stops working for nobody;
2. cancels the handler task;
3. answers 504 with error code TIMEOUT if nothing was sent yet (a client that
   left gets nothing), counts ``request_timeouts_total{route, reason}`` and
   logs the event with the request id and the error code.

Client disconnects are noticed while the handler runs: the middleware is the
only reader of the server's ``receive`` and hands the body on to the app. Put
it inside the input guard so the body it reads ahead is already bounded.

**Usage**::

    app = DeadlineMiddleware(app, default_timeout=30.0)
    # clients may ask for less (or up to max_timeout) with "X-Request-Timeout: 2.5"
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.signals import ErrorCode

from ._asgi import (
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    ensure_request_id,
    header,
    log,
    send_error,
)
from ._metrics import metrics_for

__all__ = ["DEADLINE_SCOPE_KEY", "DeadlineMiddleware", "parse_timeout"]

#: Absolute deadline (``time.monotonic``) a middleware further out already fixed.
DEADLINE_SCOPE_KEY = "aivitals.deadline"


def parse_timeout(value: str | None, *, header: str, default: float, maximum: float) -> float:
    """Seconds from a timeout header value; ``ConfigError`` for absurd values.

    Refused: non-numbers, NaN, infinities, zero, negatives, more than ``maximum``.
    """
    if value is None:
        return default
    shown = value[:40]
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{header} must be a number of seconds, got {shown!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{header} must be a positive number of seconds, got {shown!r}")
    if seconds > maximum:
        raise ConfigError(f"{header} of {seconds:g} s is over the maximum of {maximum:g} s")
    return seconds


class DeadlineMiddleware:
    """Enforce each request's deadline, and its client's presence, by aborting its work."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        default_timeout: float = 30.0,
        max_timeout: float = 600.0,
        timeout_header: str = "x-request-timeout",
        abort_grace: float = 1.0,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        for key, value in (("default_timeout", default_timeout), ("max_timeout", max_timeout)):
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ConfigError(f"DeadlineMiddleware: {key} must be > 0, got {value!r}")
        self.app = app
        self.default_timeout = float(default_timeout)
        self.max_timeout = float(max_timeout)
        self.timeout_header = timeout_header.lower()
        self.abort_grace = abort_grace
        self._metrics = metrics_for(registry)

    def deadline_of(self, scope: Scope) -> float:
        """The request's absolute deadline; ``ConfigError`` for an absurd header."""
        fixed = scope.get(DEADLINE_SCOPE_KEY)
        if isinstance(fixed, float):
            return fixed
        raw = header(scope, self.timeout_header.encode())
        seconds = parse_timeout(
            None if raw is None else raw.decode("latin-1"),
            header=self.timeout_header,
            default=self.default_timeout,
            maximum=self.max_timeout,
        )
        return time.monotonic() + seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ensure_request_id(scope)
        try:
            deadline = self.deadline_of(scope)
        except ConfigError as exc:
            await send_error(
                send, ErrorCode.INPUT_REJECTED, str(exc), request_id=request_id, status=400
            )
            return
        await _Run(self, scope, receive, send, request_id, deadline).run()


class _Run:
    """One request under a deadline: the app task, the receive pump, the abort."""

    def __init__(
        self,
        owner: DeadlineMiddleware,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
        deadline: float,
    ) -> None:
        self.owner, self.scope, self.receive, self.send = owner, scope, receive, send
        self.request_id, self.deadline = request_id, deadline
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.started = self.finished = self.cut = self.gone = False
        self.begun = time.monotonic()

    async def run(self) -> None:
        app_task = asyncio.ensure_future(self.owner.app(self.scope, self._receive, self._send))
        pump = asyncio.ensure_future(self._pump())
        try:
            remaining = max(0.0, self.deadline - time.monotonic())
            done, _ = await asyncio.wait(
                {app_task, pump}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if app_task in done or self.finished:
                # A disconnect right after the last byte is the normal end, not an abort.
                await app_task
                return
            reason = "client_disconnect" if pump in done else "deadline"
            await self._abort(app_task, reason)
        finally:
            pump.cancel()
            if not app_task.done():
                app_task.cancel()

    async def _pump(self) -> None:
        while True:
            try:
                message = await self.receive()
            except Exception:  # the server failed to read: as good as gone
                message = {"type": "http.disconnect"}
            self.inbox.put_nowait(message)
            if message["type"] == "http.disconnect":
                self.gone = True
                return

    async def _receive(self) -> Message:
        if self.gone and self.inbox.empty():
            return {"type": "http.disconnect"}
        return await self.inbox.get()

    async def _send(self, message: Message) -> None:
        if self.cut:
            return  # the request was aborted; the handler's late output goes nowhere
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self.send(message)

    async def _abort(self, app_task: asyncio.Future[Any], reason: str) -> None:
        self.cut = True
        aborted_calls = _abort_work(self.request_id, reason)
        app_task.cancel()
        await asyncio.wait({app_task}, timeout=self.owner.abort_grace)
        code = ErrorCode.TIMEOUT if reason == "deadline" else ErrorCode.CLIENT_DISCONNECT
        route = _route_label(self.scope)
        self.owner._metrics.request_timeouts.labels(route, reason).inc()
        elapsed = time.monotonic() - self.begun
        log.warning(
            "request aborted: %s after %.3f s",
            reason,
            elapsed,
            extra={
                "error_code": code.value,
                "request_id": self.request_id,
                "route": route,
                "reason": reason,
                "elapsed_ms": round(elapsed * 1000, 1),
                "aborted_calls": aborted_calls,
                "response_started": self.started,
            },
        )
        if reason == "deadline" and not self.started:
            await send_error(
                self.send,
                ErrorCode.TIMEOUT,
                # the deadline may have been set at arrival, before a queue or the
                # guard, so the time left when the work began can be below zero
                f"the request's deadline passed {elapsed:.3f} s into the work, with "
                f"{max(0.0, self.deadline - self.begun):.3f} s left when it began; "
                "the work was aborted",
                request_id=self.request_id,
            )


def _abort_work(request_id: str, reason: str) -> int:
    """Fire the abort hooks the request's model calls registered; how many there were."""
    from aivitals.instrument import abort_request

    try:
        return abort_request(request_id, reason)
    except Exception:  # one broken hook must not keep the request from being answered
        log.exception("abort hook failed", extra={"request_id": request_id, "reason": reason})
        return 0


def _route_label(scope: Scope) -> str:
    # The matched route template when the framework set one; never the raw path,
    # whose ids would explode the label's cardinality.
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "*"
