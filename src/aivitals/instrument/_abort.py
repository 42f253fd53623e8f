"""Abort hooks: how a timeout or a departed client stops the model's work.

Cancelling the coroutine that awaits a generation leaves the generation
running on its thread or on the GPU. Instead, each running inference call is
registered under its request id; ``abort_request(rid, reason)`` flags the
calls, runs their ``on_abort`` callbacks (an engine's ``abort_request``, a
stopping criterion), and the next ``call.token()`` raises ``InferenceAborted``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ..errors import AivitalsError

__all__ = ["InferenceAborted", "abort_request", "active_requests"]

_log = logging.getLogger("aivitals.instrument")

#: How long an abort for a request with no call yet is remembered (seconds).
PENDING_TTL = 30.0
_MAX_PENDING = 10_000


class InferenceAborted(AivitalsError):
    """The model call was aborted (deadline passed, client gone) through its abort hook."""

    def __init__(self, reason: str, request_id: str | None = None) -> None:
        self.reason = reason
        self.request_id = request_id
        super().__init__(f"inference aborted ({reason}) for request {request_id!r}")


class Abortable(Protocol):
    def abort(self, reason: str) -> bool: ...


_calls: dict[str, list[Abortable]] = {}
_pending: dict[str, tuple[float, str]] = {}
_lock = threading.Lock()


def register(request_id: str, call: Abortable) -> str | None:
    """Track ``call`` under ``request_id``; returns the reason if it was already aborted."""
    with _lock:
        pending = _pending.pop(request_id, None)
        _calls.setdefault(request_id, []).append(call)
    if pending is not None and time.monotonic() - pending[0] < PENDING_TTL:
        return pending[1]
    return None


def unregister(request_id: str, call: Abortable) -> None:
    with _lock:
        calls = _calls.get(request_id)
        if calls is None:
            return
        try:
            calls.remove(call)
        except ValueError:
            pass
        if not calls:
            del _calls[request_id]


def abort_request(request_id: str, reason: str = "timeout") -> int:
    """Abort every running model call of ``request_id``; returns how many were running.

    With none running yet, the abort is remembered for ``PENDING_TTL`` seconds
    so a call that starts late is refused at once.

    **Usage**::

        aivitals.instrument.abort_request(rid, "deadline")   # from a timeout handler
    """
    with _lock:
        calls = list(_calls.get(request_id, ()))
        if not calls:
            _remember(request_id, reason)
    return sum(1 for call in calls if call.abort(reason))


def _remember(request_id: str, reason: str) -> None:
    now = time.monotonic()
    if len(_pending) >= _MAX_PENDING:
        for rid in [r for r, (t, _) in _pending.items() if now - t >= PENDING_TTL]:
            del _pending[rid]
        if len(_pending) >= _MAX_PENDING:
            _pending.pop(next(iter(_pending)))
    _pending[request_id] = (now, reason)


def active_requests() -> list[str]:
    """Request ids with a model call running now."""
    with _lock:
        return list(_calls)


def run_callbacks(callbacks: list[Callable[[str], object]], reason: str) -> None:
    """Run abort callbacks; one failing must not keep the others from running."""
    for fn in callbacks:
        try:
            fn(reason)
        except Exception:
            _log.exception("abort_callback_failed", extra={"reason": reason})
