"""Random input never makes the protected service answer 500 nor grow its memory."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from aivitals.protect import AdmissionConfig, GuardConfig, HealthConfig, Protected, protect

from ._asgi import call

ALLOWED = {200, 400, 408, 413, 422, 429}
PRINTABLE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)


async def handler(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def make_app() -> Protected:
    return protect(
        handler,
        guard=GuardConfig(
            max_body_bytes=4000,
            fullwidth="normalize",
            tokenizer=lambda text: len(text.split()),
            max_tokens=300,
        ),
        admission=AdmissionConfig(memory_capacity=10**9, max_timeout=120),
        health=HealthConfig(),
        registry=CollectorRegistry(),
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
bodies = st.one_of(
    st.binary(max_size=6000),
    st.text(max_size=1500).map(lambda s: s.encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["prompt", "max_new_tokens", "max_tokens"]), json_values).map(
        lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")
    ),
)
headers = st.lists(
    st.tuples(
        st.sampled_from(
            ["x-priority", "x-request-timeout", "content-type", "content-length", "x-request-id"]
        ),
        st.one_of(
            PRINTABLE,
            st.sampled_from(["interactive", "batch", "application/json", "-1", "0", "nan"]),
            st.floats(allow_nan=True, allow_infinity=True).map(str),
            st.integers(-(10**9), 10**12).map(str),
        ),
    ),
    max_size=4,
)

_RUN: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _loop_and_app() -> Iterator[None]:
    # One loop and one protected app for every example: memory is measured across them.
    loop = asyncio.new_event_loop()
    app = make_app()
    _RUN.update(loop=loop, app=app)
    yield
    assert app.health is not None
    loop.run_until_complete(app.health.stop())
    loop.close()
    _RUN.clear()


def request(body: bytes, chunked: bool, hdrs: list[tuple[str, str]]) -> int:
    chunks = [body[i : i + 512] for i in range(0, len(body), 512)] if chunked else [body]
    reply = _RUN["loop"].run_until_complete(call(_RUN["app"], chunks=chunks or [b""], headers=hdrs))
    return int(reply.status)


def timeout_of(hdrs: list[tuple[str, str]]) -> float | None:
    for key, value in hdrs:
        if key == "x-request-timeout":
            try:
                return float(value)
            except ValueError:
                return None
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, chunked=st.booleans(), hdrs=headers)
def test_no_input_is_a_500(body: bytes, chunked: bool, hdrs: list[tuple[str, str]]) -> None:
    status = request(body, chunked, hdrs)
    tiny = timeout_of(hdrs)
    if status == 504:
        # only a request that asked for a deadline shorter than the work may time out
        assert tiny is not None and tiny < 1.0
        return
    assert status in ALLOWED, status


def test_memory_stays_flat_under_random_input() -> None:
    rng = random.Random(1234)
    process = psutil.Process()

    def one() -> None:
        kind = rng.randrange(4)
        if kind == 0:
            body = rng.randbytes(rng.randrange(6000))
        elif kind == 1:
            body = json.dumps({"prompt": "x " * rng.randrange(400)}).encode()
        elif kind == 2:
            body = b"[" * rng.randrange(3000)
        else:
            body = "\uff21\u0000\u00e9".encode() * rng.randrange(500)
        hdrs = [("x-request-timeout", str(rng.uniform(-5, 500)))]
        if rng.random() < 0.5:
            hdrs.append(("content-type", "application/json"))
        request(body, rng.random() < 0.5, hdrs)

    for _ in range(500):  # warm caches and allocator pools first
        one()
    before = process.memory_info().rss
    for _ in range(3000):
        one()
    grown = process.memory_info().rss - before
    assert grown < 5 * 2**20, f"RSS grew by {grown / 2**20:.1f} MB over 3000 requests"
