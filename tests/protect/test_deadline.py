from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from aivitals.instrument import InferenceAborted, inference
from aivitals.protect import DeadlineMiddleware
from aivitals.protect._deadline import DEADLINE_SCOPE_KEY

from ._asgi import call, sample

pytestmark = pytest.mark.anyio

STEP = 0.02  # seconds per generated token


class Generator:
    """A handler whose model call is a token loop on a worker thread (like HF generate)."""

    def __init__(self, registry: CollectorRegistry, tokens: int = 500) -> None:
        self.registry = registry
        self.tokens = tokens
        self.steps: list[float] = []
        self.stopped_at: float | None = None
        self.aborted_with: str | None = None
        self.abort_fired_at: float | None = None
        self.done = threading.Event()

    def generate(self) -> None:
        try:
            with inference(model="toy", registry=self.registry) as model_call:
                model_call.on_abort(
                    lambda reason: setattr(self, "abort_fired_at", time.monotonic())
                )
                for _ in range(self.tokens):
                    model_call.token()  # raises InferenceAborted once aborted
                    time.sleep(STEP)
                    self.steps.append(time.monotonic())
        except InferenceAborted as exc:
            self.aborted_with = exc.reason
        finally:
            self.stopped_at = time.monotonic()
            self.done.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await asyncio.to_thread(self.generate)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"generated"})


async def wait_done(gen: Generator) -> None:
    for _ in range(200):
        if gen.done.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the generation never stopped")


async def test_deadline_aborts_the_generation_within_one_step() -> None:
    registry = CollectorRegistry()
    gen = Generator(registry)
    app = DeadlineMiddleware(gen, registry=registry)
    began = time.monotonic()
    reply = await call(app, chunks=[b"{}"], headers=[("x-request-timeout", "0.2")])
    answered = time.monotonic()
    assert reply.status == 504
    assert reply.json()["error"]["code"] == "TIMEOUT"
    assert 0.2 <= answered - began < 0.6
    await wait_done(gen)
    assert gen.aborted_with == "deadline"
    assert gen.stopped_at is not None and gen.abort_fired_at is not None
    assert gen.abort_fired_at - began < 0.2 + 0.2  # the hook fired at the deadline
    # the loop saw the abort at its next token: at most one step after the hook fired
    assert len([t for t in gen.steps if t > gen.abort_fired_at]) <= 1
    assert gen.stopped_at - gen.abort_fired_at <= STEP + 0.1
    assert sample(registry, "request_timeouts_total", route="*", reason="deadline") == 1


async def test_a_deadline_spent_before_the_work_began_is_reported_without_a_negative_time() -> None:
    """Admission sets the deadline at arrival; a guard or queue may use all of it first."""
    registry = CollectorRegistry()
    gen = Generator(registry)
    inner = DeadlineMiddleware(gen, registry=registry)

    async def arrived_earlier(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[DEADLINE_SCOPE_KEY] = time.monotonic() - 0.05  # spent while it waited
        await inner(scope, receive, send)

    reply = await call(arrived_earlier, chunks=[b"{}"])
    assert reply.status == 504
    message = reply.json()["error"]["message"]
    assert "with 0.000 s left when it began" in message and "-" not in message, message
    await wait_done(gen)
    assert gen.aborted_with == "deadline"


async def test_client_disconnect_aborts_the_generation_and_sends_nothing() -> None:
    registry = CollectorRegistry()
    gen = Generator(registry)
    app = DeadlineMiddleware(gen, registry=registry)
    reply = await call(app, chunks=[b"{}"], disconnect_after=0.1)
    assert reply.messages == []
    await wait_done(gen)
    assert gen.aborted_with == "client_disconnect"
    assert sample(registry, "request_timeouts_total", route="*", reason="client_disconnect") == 1


async def test_a_request_within_its_deadline_is_untouched() -> None:
    registry = CollectorRegistry()
    gen = Generator(registry, tokens=3)
    app = DeadlineMiddleware(gen, registry=registry)
    reply = await call(app, chunks=[b"{}"], headers=[("x-request-timeout", "5")])
    assert reply.status == 200 and reply.body == b"generated"
    assert gen.aborted_with is None and len(gen.steps) == 3
    assert sample(registry, "request_timeouts_total", route="*", reason="deadline") == 0


@pytest.mark.parametrize("value", ["-1", "0", "soon", "nan", "inf", "1e12"])
async def test_absurd_timeout_header_is_400(value: str) -> None:
    registry = CollectorRegistry()
    gen = Generator(registry, tokens=1)
    app = DeadlineMiddleware(gen, registry=registry, max_timeout=60)
    reply = await call(app, chunks=[b"{}"], headers=[("x-request-timeout", value)])
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "INPUT_REJECTED"
    assert "x-request-timeout" in reply.json()["error"]["message"]
    assert not gen.steps


async def test_deadline_after_the_stream_started_cuts_it_without_a_504() -> None:
    registry = CollectorRegistry()
    stopped = asyncio.Event()

    async def streamer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            for _ in range(100):
                await send({"type": "http.response.body", "body": b"tok ", "more_body": True})
                await asyncio.sleep(0.02)
        finally:
            stopped.set()

    app = DeadlineMiddleware(streamer, registry=registry)  # type: ignore[arg-type]
    reply = await call(app, method="GET", headers=[("x-request-timeout", "0.1")])
    assert reply.status == 200
    assert stopped.is_set()
    assert not any(
        m["type"] == "http.response.body" and not m.get("more_body") for m in reply.messages
    )
    assert sample(registry, "request_timeouts_total", route="*", reason="deadline") == 1


async def test_handler_errors_propagate_unchanged() -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise ValueError("boom")

    app = DeadlineMiddleware(broken, registry=CollectorRegistry())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="boom"):
        await call(app, method="GET")


async def test_works_through_httpx_asgi_transport() -> None:
    registry = CollectorRegistry()
    gen = Generator(registry, tokens=2)
    app = DeadlineMiddleware(gen, registry=registry)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post("/", content=b"{}")
    assert response.status_code == 200
