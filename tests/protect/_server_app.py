"""The app the real-uvicorn tests run: a token loop on a worker thread, behind protect().

Run as ``uvicorn tests.protect._server_app:app``. ``POST /generate`` generates
``tokens`` tokens (one per ``STEP`` seconds) through ``aivitals.instrument.inference``;
``GET /state`` reports how the last generation ended.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from aivitals.instrument import InferenceAborted, inference
from aivitals.protect import AdmissionConfig, GuardConfig, HealthConfig, protect

STEP = 0.02
STATE: dict[str, Any] = {"steps": 0, "aborted_with": None, "stopped_at": None, "running": False}
_lock = threading.Lock()


def generate(tokens: int) -> None:
    with _lock:
        STATE.update(steps=0, aborted_with=None, stopped_at=None, running=True)
    try:
        with inference(model="toy", registry=None) as model_call:
            for _ in range(tokens):
                model_call.token()
                time.sleep(STEP)
                with _lock:
                    STATE["steps"] += 1
    except InferenceAborted as exc:
        with _lock:
            STATE["aborted_with"] = exc.reason
    finally:
        with _lock:
            STATE.update(stopped_at=time.time(), running=False)


async def send_json(send: Any, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def handler(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/state":
        with _lock:
            await send_json(send, 200, dict(STATE))
        return
    message = await receive()
    tokens = int(json.loads(message.get("body") or b"{}").get("tokens", 3))
    await asyncio.to_thread(generate, tokens)
    await send_json(send, 200, {"tokens": tokens})


app = protect(
    handler,
    guard=GuardConfig(body_timeout=0.5),
    admission=AdmissionConfig(initial_limit=1, adaptive=False, queue_size=0, paths=("/generate",)),
    health=HealthConfig(),
    registry=None,
)
