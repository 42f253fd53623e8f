"""Admission control as pure ASGI middleware: refuse cheaply, in front of the handler.

``AdmissionMiddleware`` reads the priority and timeout headers, refuses with
429 + ``Retry-After`` (or 400 for absurd headers) before the handler or any
preprocessing runs, then holds a slot of the ``AdmissionController`` while the
handler runs. With ``precheck_only=True`` it only refuses (no slot, no
memory): ``protect()`` puts one such in front of the input guard, so a flood
of refused requests never costs a body read, and the slot-holding one after
it, so a client stalling mid-body never holds a slot.

The memory cost comes from ``config.memory_estimator(prompt_tokens,
max_new_tokens)``: prompt tokens as counted by the input guard's tokenizer
(else body bytes / 4), ``max_new_tokens`` from the JSON body's
``max_new_tokens_fields`` (else ``default_max_new_tokens``).

**Usage**::

    controller = AdmissionController(AdmissionConfig(memory_capacity=40 * 2**30))
    app = AdmissionMiddleware(app, controller)
"""

from __future__ import annotations

import time
from typing import Any

from aivitals.errors import ConfigError
from aivitals.signals import ErrorCode

from ._admission import AdmissionController, AdmissionRefused
from ._asgi import ASGIApp, Receive, Scope, Send, ensure_request_id, header, log, send_error
from ._deadline import DEADLINE_SCOPE_KEY
from ._guard import GUARD_SCOPE_KEY, GuardResult

__all__ = ["AdmissionMiddleware", "request_lengths"]

_PRIORITY_KEY = "aivitals.priority"


class AdmissionMiddleware:
    """Queue and limit the requests of the routes it wraps (``config.paths`` prefixes)."""

    def __init__(
        self, app: ASGIApp, controller: AdmissionController, *, precheck_only: bool = False
    ) -> None:
        self.app = app
        self.controller = controller
        self.precheck_only = precheck_only
        cfg = controller.config
        self._priority_header = cfg.priority_header.lower().encode()
        self._timeout_header = cfg.timeout_header.lower().encode()

    def applies(self, scope: Scope) -> bool:
        paths = self.controller.config.paths
        if scope["type"] != "http":
            return False
        return paths is None or str(scope.get("path", "")).startswith(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.applies(scope):
            await self.app(scope, receive, send)
            return
        request_id = ensure_request_id(scope)
        try:
            priority, deadline = self._parse(scope)
            cost = 0 if self.precheck_only else self._cost(scope)
            self.controller.check(priority=priority, deadline=deadline, cost=cost)
            if self.precheck_only:
                await self.app(scope, receive, send)
                return
            async with self.controller.admit(priority=priority, deadline=deadline, cost=cost):
                await self.app(scope, receive, send)
        except ConfigError as exc:
            await send_error(
                send, ErrorCode.INPUT_REJECTED, str(exc), request_id=request_id, status=400
            )
        except AdmissionRefused as refused:
            await self._refuse(send, refused, request_id, scope)

    def _parse(self, scope: Scope) -> tuple[str, float]:
        if _PRIORITY_KEY in scope:
            return scope[_PRIORITY_KEY], scope[DEADLINE_SCOPE_KEY]
        raw_priority = header(scope, self._priority_header)
        raw_timeout = header(scope, self._timeout_header)
        priority = self.controller.parse_priority(
            None if raw_priority is None else raw_priority.decode("latin-1")
        )
        seconds = self.controller.parse_timeout(
            None if raw_timeout is None else raw_timeout.decode("latin-1")
        )
        # The deadline counts from arrival: body upload and queueing spend it too.
        deadline = time.monotonic() + seconds
        scope[_PRIORITY_KEY] = priority
        scope[DEADLINE_SCOPE_KEY] = deadline
        return priority, deadline

    def _cost(self, scope: Scope) -> int:
        cfg = self.controller.config
        if cfg.memory_capacity is None:
            return 0
        guarded = scope.get(GUARD_SCOPE_KEY)
        declared = header(scope, b"content-length")
        prompt_tokens, max_new = request_lengths(guarded, declared, cfg.max_new_tokens_fields)
        if max_new is None:
            max_new = cfg.default_max_new_tokens
        return int(cfg.memory_estimator(prompt_tokens, max_new))

    async def _refuse(
        self, send: Send, refused: AdmissionRefused, request_id: str, scope: Scope
    ) -> None:
        log.info(
            "admission refused: %s",
            refused,
            extra={
                "error_code": refused.code.value,
                "request_id": request_id,
                "reason": refused.reason,
                "priority": scope.get(_PRIORITY_KEY),
            },
        )
        await send_error(
            send,
            refused.code,
            str(refused),
            request_id=request_id,
            status=429,
            headers=[(b"retry-after", str(refused.retry_after).encode())],
        )


def request_lengths(
    guarded: Any, content_length: bytes | str | None, fields: tuple[str, ...]
) -> tuple[int, int | None]:
    """(prompt tokens, max new tokens or None) from the guard's result, else the body size."""
    if not isinstance(guarded, GuardResult):
        length = content_length
        size = int(length) if length is not None and length.isdigit() else 0
        return size // 4, None
    prompt = guarded.tokens if guarded.tokens is not None else guarded.body_bytes // 4
    document = guarded.document
    if isinstance(document, dict):
        for name in fields:
            value = document.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return prompt, value
    return prompt, None
