from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aivitals.protect import AdmissionConfig, GuardConfig, HealthConfig, Protected, protect

from ._asgi import call, sample

pytestmark = pytest.mark.anyio


class Slow:
    """A handler that holds its admission slot until released; counts what reached it."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.entered = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls += 1
        await receive()
        self.entered.set()
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def protected(handler: Any, registry: CollectorRegistry, **admission: Any) -> Protected:
    admission.setdefault("adaptive", False)
    guard = admission.pop("guard", None)
    return protect(
        handler,
        guard=guard,
        admission=AdmissionConfig(**admission),
        health=HealthConfig(),
        registry=registry,
    )


async def test_full_queue_is_429_with_retry_after_and_never_reads_the_body() -> None:
    registry = CollectorRegistry()
    slow = Slow()
    app = protected(slow, registry, initial_limit=1, queue_size=0)
    first = asyncio.ensure_future(call(app, chunks=[b"{}"]))
    await slow.entered.wait()
    reply = await call(app, chunks=[b"x" * 1000, b"y" * 1000])
    assert reply.status == 429
    assert reply.headers["retry-after"].isdigit() and int(reply.headers["retry-after"]) >= 1
    assert reply.json()["error"]["code"] == "QUEUE_FULL"
    assert reply.json()["request_id"]
    assert reply.bytes_read == 0  # refused before any preprocessing, body included
    assert slow.calls == 1
    assert (
        sample(registry, "admission_rejections_total", priority="interactive", reason="queue_full")
        == 1
    )
    slow.release.set()
    assert (await first).status == 200


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ([("x-priority", "urgent")], "unknown priority"),
        ([("x-request-timeout", "-5")], "positive"),
        ([("x-request-timeout", "0")], "positive"),
        ([("x-request-timeout", "ten")], "number"),
        ([("x-request-timeout", "86400")], "maximum"),
    ],
)
async def test_absurd_headers_are_400_with_a_clear_message(
    headers: list[tuple[str, str]], needle: str
) -> None:
    registry = CollectorRegistry()
    slow = Slow()
    app = protected(slow, registry)
    reply = await call(app, chunks=[b"{}"], headers=headers)
    assert reply.status == 400
    assert reply.json()["error"]["code"] == "INPUT_REJECTED"
    assert needle in reply.json()["error"]["message"]
    assert slow.calls == 0 and reply.bytes_read == 0


async def test_memory_reservation_uses_the_guard_token_count_and_max_new_tokens() -> None:
    registry = CollectorRegistry()
    slow = Slow()
    slow.release.set()
    app = protected(
        slow,
        registry,
        guard=GuardConfig(tokenizer=lambda text: len(text.split())),
        memory_capacity=10_000,
        memory_estimator=lambda prompt, new: (prompt + new) * 10,
    )
    headers = [("content-type", "application/json")]
    small = json.dumps({"prompt": "a b c", "max_new_tokens": 100}).encode()
    assert (await call(app, chunks=[small], headers=headers)).status == 200
    big = json.dumps({"prompt": "a b c", "max_new_tokens": 5000}).encode()
    reply = await call(app, chunks=[big], headers=headers)
    assert reply.status == 429
    assert reply.json()["error"]["code"] == "MEMORY_RESERVATION"
    assert "retry-after" in reply.headers
    assert (
        sample(registry, "admission_rejections_total", priority="interactive", reason="memory") == 1
    )
    assert app.controller is not None and app.controller.reserved == 0


async def test_a_slow_loris_never_holds_a_slot() -> None:
    registry = CollectorRegistry()
    slow = Slow()
    slow.release.set()
    app = protected(
        slow, registry, guard=GuardConfig(body_timeout=0.3), initial_limit=1, queue_size=0
    )
    loris = asyncio.ensure_future(call(app, chunks=[b"x", b"y"], stall_after=1))
    await asyncio.sleep(0.05)
    assert app.controller is not None and app.controller.in_flight == 0
    normal = await call(app, chunks=[b"{}"])
    assert normal.status == 200  # the only slot was free for it
    stalled = await loris
    assert stalled.status == 408
    assert slow.calls == 1


async def test_guard_rejections_happen_before_admission() -> None:
    registry = CollectorRegistry()
    slow = Slow()
    app = protected(slow, registry)
    reply = await call(app, chunks=[b"\x00"])
    assert reply.status == 422
    assert app.controller is not None and app.controller.snapshot()["in_flight"] == 0
    assert slow.calls == 0


async def test_health_paths_answer_while_every_slot_is_taken() -> None:
    registry = CollectorRegistry()
    slow = Slow()
    app = protected(slow, registry, initial_limit=1, queue_size=0)
    first = asyncio.ensure_future(call(app, chunks=[b"{}"]))
    await slow.entered.wait()
    assert (await call(app, method="GET", path="/healthz")).status == 200
    queue = await call(app, method="GET", path="/health/queue")
    assert queue.status == 200
    assert queue.json()["queue"]["in_flight"] == 1
    assert queue.json()["queue"]["limit"] == 1
    assert queue.json()["queue"]["queue_capacity"] == 0
    slow.release.set()
    await first
    assert app.health is not None
    await app.health.stop()


async def test_deadline_from_protect_aborts_and_answers_504() -> None:
    registry = CollectorRegistry()
    slow = Slow()
    app = protected(slow, registry)
    reply = await call(app, chunks=[b"{}"], headers=[("x-request-timeout", "0.1")])
    assert reply.status == 504
    assert reply.json()["error"]["code"] == "TIMEOUT"
    assert app.controller is not None and app.controller.in_flight == 0


async def test_behind_the_instrumentation_middleware_the_request_id_is_shared() -> None:
    from aivitals.instrument import AivitalsMiddleware

    registry = CollectorRegistry()
    slow = Slow()
    app = AivitalsMiddleware(protected(slow, registry), registry=registry)
    reply = await call(app, chunks=[b"\x00"], headers=[("x-request-id", "shared-1")])
    assert reply.status == 422
    assert reply.json()["request_id"] == "shared-1"
    assert sample(registry, "input_rejections_total", route="*", reason="INPUT_CONTROL_CHARS") == 1


def test_protecting_an_instrumented_app_is_refused_with_the_fix_named() -> None:
    # instrument inside protect: 429s never reach the HTTP metrics and /metrics is queued
    from fastapi import FastAPI

    from aivitals.errors import ConfigError
    from aivitals.instrument import AivitalsMiddleware, instrument

    registry = CollectorRegistry()
    fastapi_app = FastAPI()
    instrument(fastapi_app, registry=registry)  # added to the app's own stack
    with pytest.raises(ConfigError, match=r"instrument\(protect\(app"):
        protect(fastapi_app, registry=registry)
    with pytest.raises(ConfigError, match="instrumented already"):
        protect(AivitalsMiddleware(Slow(), registry=registry), registry=registry)
    # the right order is accepted
    wrapped = instrument(protect(FastAPI(), registry=registry), registry=registry)
    assert isinstance(wrapped, AivitalsMiddleware)
