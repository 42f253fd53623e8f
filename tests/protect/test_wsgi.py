"""protect_wsgi called directly: the guard, admission control from threads, the wiring."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.instrument import instrument_wsgi
from aivitals.protect import (
    GUARD_SCOPE_KEY,
    AdmissionConfig,
    AdmissionController,
    AdmissionRefused,
    GuardConfig,
    GuardResult,
    ProtectedWSGI,
    protect_wsgi,
)
from tests._wsgi import Answer, Environ, call, environ

ONE_SLOT = AdmissionConfig(initial_limit=1, min_limit=1, max_limit=1, adaptive=False, queue_size=0)


class Recorder:
    """A WSGI app that remembers what it was given, optionally slow or streaming."""

    def __init__(self, *, delay: float = 0.0, chunks: int = 1) -> None:
        self.delay = delay
        self.chunks = chunks
        self.bodies: list[bytes] = []
        self.environs: list[Environ] = []

    def __call__(self, env: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        self.environs.append(env)
        self.bodies.append(env["wsgi.input"].read(int(env.get("CONTENT_LENGTH") or 0)))
        time.sleep(self.delay)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return (b"ok" for _ in range(self.chunks))


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, labels) or 0.0


class Unreadable(io.RawIOBase):
    def read(self, size: int = -1) -> bytes:
        raise AssertionError("the guard read a body it should have refused unread")


def test_oversize_body_is_refused_by_content_length_before_a_byte_is_read() -> None:
    reg = CollectorRegistry()
    app = Recorder()
    service = protect_wsgi(app, guard=GuardConfig(max_body_bytes=100), registry=reg)
    env = environ("POST", "/v1/generate", b"", {"x-request-id": "big-1"})
    env.update({"CONTENT_LENGTH": "5000", "wsgi.input": Unreadable()})
    answer = call(service, env)
    assert answer.status == 413
    assert json.loads(answer.body) == {
        "error": {
            "code": "INPUT_TOO_LARGE",
            "message": "body of 5000 bytes (Content-Length) is over the limit of 100 bytes",
        },
        "request_id": "big-1",
    }
    assert app.environs == []
    assert value(reg, "input_rejections_total", route="*", reason="INPUT_TOO_LARGE") == 1


def test_oversize_chunked_body_is_refused_while_it_is_read() -> None:
    reg = CollectorRegistry()
    service = protect_wsgi(Recorder(), guard=GuardConfig(max_body_bytes=100), registry=reg)
    env = environ("POST", "/x", b"")
    env.update({"wsgi.input": io.BytesIO(b"a" * 70_000), "wsgi.input_terminated": True})
    answer = call(service, env)
    assert answer.status == 413 and b"refused at" in answer.body


def test_bad_bodies_are_refused_and_good_ones_replayed_with_the_guards_findings() -> None:
    reg = CollectorRegistry()
    app = Recorder()
    cfg = GuardConfig(fullwidth="normalize", tokenizer=lambda text: len(text.split()))
    service = protect_wsgi(app, guard=cfg, registry=reg)
    control = call(service, environ("POST", "/x", b"bad\x01byte"))
    assert control.status == 422 and b"INPUT_CONTROL_CHARS" in control.body
    broken = call(service, environ("POST", "/x", b"\xff\xfe"))
    assert broken.status == 400 and b"INPUT_INVALID_UTF8" in broken.body
    fullwidth_hello = "\uff48\uff45\uff4c\uff4c\uff4f"
    env = environ("POST", "/x", json.dumps({"prompt": f"{fullwidth_hello} world"}).encode())
    env["CONTENT_TYPE"] = "application/json"
    assert call(service, env).status == 200
    assert app.bodies == [b'{"prompt": "hello world"}']  # normalised, with a matching length
    seen = app.environs[0]
    assert seen["CONTENT_LENGTH"] == str(len(app.bodies[0]))
    result = seen[GUARD_SCOPE_KEY]
    assert isinstance(result, GuardResult) and result.normalized and result.tokens == 2


def test_a_body_that_ends_early_is_a_client_disconnect() -> None:
    reg = CollectorRegistry()
    service = protect_wsgi(Recorder(), registry=reg)
    env = environ("POST", "/x", b"short")
    env["CONTENT_LENGTH"] = "50"
    assert call(service, env).status == 400
    assert value(reg, "request_timeouts_total", route="*", reason="client_disconnect") == 1


def test_full_admission_answers_429_with_retry_after_from_another_thread() -> None:
    reg = CollectorRegistry()
    app = Recorder(delay=0.5)
    service = protect_wsgi(app, admission=ONE_SLOT, registry=reg)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(call, service, environ(path="/v1/slow"))
        time.sleep(0.2)  # the first holds the only slot
        refused = call(service, environ(path="/v1/slow", headers={"x-request-id": "r-2"}))
        assert first.result().status == 200
    assert refused.status == 429 and refused.headers["retry-after"] == "1"
    assert json.loads(refused.body)["error"]["code"] == "QUEUE_FULL"
    assert json.loads(refused.body)["request_id"] == "r-2"
    rejected = {"priority": "interactive", "reason": "queue_full"}
    assert value(reg, "admission_rejections_total", **rejected) == 1
    assert service.controller.in_flight == 0  # given back at the end of the response
    assert call(service, environ(path="/v1/slow")).status == 200


def test_bad_admission_headers_are_a_400() -> None:
    service = protect_wsgi(Recorder(), registry=CollectorRegistry())
    bad = call(service, environ(path="/x", headers={"x-priority": "urgent"}))
    assert bad.status == 400 and b"unknown priority" in bad.body
    absurd = call(service, environ(path="/x", headers={"x-request-timeout": "nan"}))
    assert absurd.status == 400 and b"x-request-timeout" in absurd.body


def test_the_slot_is_held_until_the_streamed_response_is_closed() -> None:
    reg = CollectorRegistry()
    service = protect_wsgi(Recorder(chunks=3), admission=ONE_SLOT, registry=reg)
    answer = Answer()
    result = service(environ(path="/s"), answer.start_response)
    iterator = iter(result)
    assert next(iterator) == b"ok"
    assert service.controller.in_flight == 1  # still streaming
    assert call(service, environ(path="/s")).status == 429
    result.close()  # type: ignore[attr-defined]  # the server gave up mid-stream
    assert service.controller.in_flight == 0


def test_queued_threads_are_admitted_in_turn_and_never_past_the_limit() -> None:
    controller = AdmissionController(
        AdmissionConfig(initial_limit=2, max_limit=2, adaptive=False, queue_size=16),
        registry=CollectorRegistry(),
    )
    running = 0
    peak = 0
    lock = threading.Lock()

    def work(_: int) -> None:
        nonlocal running, peak
        with controller.admit_blocking(timeout=10):
            with lock:
                running += 1
                peak = max(peak, running)
            time.sleep(0.02)
            with lock:
                running -= 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(24)))
    assert peak == 2
    assert controller.in_flight == 0 and controller.queue_length == 0


def test_a_queued_thread_leaves_with_429_before_its_deadline_passes() -> None:
    config = AdmissionConfig(initial_limit=1, max_limit=1, queue_size=4, adaptive=False)
    controller = AdmissionController(config, registry=CollectorRegistry())
    with controller.admit_blocking(timeout=5):
        start = time.monotonic()
        with pytest.raises(AdmissionRefused) as caught, controller.admit_blocking(timeout=0.2):
            pass
        assert time.monotonic() - start < 1.0
    assert caught.value.reason == "deadline" and caught.value.retry_after >= 1
    assert controller.in_flight == 0 and controller.queue_length == 0


def test_instrumentation_outside_sees_the_routes_and_counts_the_refusals() -> None:
    from tests.instrument._wsgi_app import flask_app

    reg = CollectorRegistry()
    app = flask_app(reg)
    service = instrument_wsgi(
        protect_wsgi(app, guard=GuardConfig(max_body_bytes=10), registry=reg), registry=reg
    )
    assert call(service, environ(path="/v1/items/5")).status == 200
    assert call(service, environ("POST", "/v1/echo", b"x" * 50)).status == 413
    ok = {"status_class": "2xx", "status": "200"}
    items = {"method": "GET", "route": "/v1/items/<int:item_id>"}
    assert value(reg, "http_request_duration_seconds_count", **items, **ok) == 1
    refused = {"method": "POST", "route": "/v1/echo", "status_class": "4xx", "status": "413"}
    assert value(reg, "http_request_duration_seconds_count", **refused) == 1
    assert value(reg, "http_request_body_size_bytes_sum", method="POST", route="/v1/echo") == 50


def test_protect_wsgi_refuses_what_it_cannot_protect() -> None:
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        return None

    with pytest.raises(ConfigError, match=r"ASGI apps take aivitals\.protect\.protect"):
        protect_wsgi(asgi, registry=CollectorRegistry())  # type: ignore[arg-type]
    instrumented = instrument_wsgi(Recorder(), registry=CollectorRegistry(), metrics_path=None)
    with pytest.raises(ConfigError, match=r"instrument_wsgi\(protect_wsgi\(app"):
        protect_wsgi(instrumented, registry=CollectorRegistry())


def test_used_alone_the_request_id_does_not_outlive_the_request() -> None:
    from aivitals.instrument import current_request_id

    seen: list[str | None] = []

    def app(env: Environ, start_response: Callable[..., Any]) -> Iterator[bytes]:
        seen.append(current_request_id())
        start_response("200 OK", [])
        return iter([b""])

    service = protect_wsgi(app, registry=CollectorRegistry())
    assert isinstance(service, ProtectedWSGI)
    call(service, environ(path="/a", headers={"x-request-id": "alone-1"}))
    assert seen == ["alone-1"] and current_request_id() is None
