"""ASGI plumbing shared by the guard, the admission controller, deadlines and health.

The type aliases follow starlette's ``types.py`` so any ASGI app fits; the
helpers send the one error body every refusal uses::

    {"error": {"code": "QUEUE_FULL", "message": "..."}, "request_id": "..."}
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

# The public names: protect depends on instrument's API, never on its private modules.
from aivitals.instrument import REQUEST_ID, current_request_id
from aivitals.signals import ERROR_CODES, ErrorCode

__all__ = [
    "ASGIApp",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "ensure_request_id",
    "error_payload",
    "header",
    "log",
    "send_error",
    "send_json",
    "shorten",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The logger every protection event goes to; fields ride in ``extra=``.
log = logging.getLogger("aivitals.protect")

# A client-chosen id ends up in logs and JSON: keep it short and printable.
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case bytes), or None."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def ensure_request_id(scope: Scope) -> str:
    """The request id in force, set in the context var if nothing set it yet.

    The instrumentation middleware normally sets it first; used alone, the
    protection layer honours a sane ``X-Request-ID`` or makes one up.
    """
    current = current_request_id()
    if current:
        return current
    raw = header(scope, b"x-request-id")
    text = raw.decode("latin-1") if raw is not None else ""
    request_id = text if _SAFE_ID.match(text) else uuid.uuid4().hex
    REQUEST_ID.set(request_id)
    return request_id


async def send_json(
    send: Send,
    status: int,
    payload: Any,
    *,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Send a complete JSON response."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(
    send: Send,
    code: ErrorCode,
    message: str,
    *,
    request_id: str | None,
    status: int | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    """Send the standard error body; the status defaults to the code's in the table."""
    chosen, payload = error_payload(code, message, request_id=request_id, status=status)
    await send_json(send, chosen, payload, headers=headers)


def error_payload(
    code: ErrorCode, message: str, *, request_id: str | None, status: int | None = None
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, the standard error body) of a refusal, for ASGI and WSGI alike."""
    payload = {"error": {"code": code.value, "message": message}, "request_id": request_id}
    return (ERROR_CODES[code].http_status if status is None else status), payload


def shorten(value: object, limit: int = 40) -> str:
    """``repr`` of a client-supplied value, cut so a 1 MB header cannot flood a log."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
