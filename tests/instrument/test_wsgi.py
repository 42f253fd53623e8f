"""The WSGI middleware called directly, with hand-built environs (no server)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

pytest.importorskip("flask")

from flask import Flask

import aivitals
from aivitals.errors import AivitalsError, ConfigError
from aivitals.instrument import (
    AivitalsWSGIMiddleware,
    configure_logging,
    ensure_multiprocess,
    instrument,
    instrument_wsgi,
)
from tests._wsgi import Answer, call, environ
from tests.instrument._wsgi_app import flask_app

ITEMS = "/v1/items/<int:item_id>"
Environ = dict[str, Any]


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, labels) or 0.0


def test_flask_routes_become_templates_and_requests_are_counted() -> None:
    reg = CollectorRegistry()
    app = flask_app(reg)
    assert instrument_wsgi(app, registry=reg) is app  # Flask: wrapped in place
    assert isinstance(app.wsgi_app, AivitalsWSGIMiddleware)
    for i in (1, 2):
        assert call(app, environ(path=f"/v1/items/{i}")).status == 200
    echo = call(app, environ("POST", "/v1/echo", b"abcdef"))
    assert json.loads(echo.body) == {"n": 6}
    assert call(app, environ(path="/no/such/path")).status == 404
    ok = {"status_class": "2xx", "status": "200"}
    assert value(reg, "http_request_duration_seconds_count", method="GET", route=ITEMS, **ok) == 2
    echo_labels = {"method": "POST", "route": "/v1/echo"}
    assert value(reg, "http_request_body_size_bytes_sum", **echo_labels) == 6
    assert value(reg, "http_response_body_size_bytes_sum", **echo_labels) == len(echo.body)
    assert value(reg, "http_unmatched_requests_total", method="GET") == 1
    missing = {"route": "<unmatched>", "status_class": "4xx", "status": "404"}
    assert value(reg, "http_request_duration_seconds_count", method="GET", **missing) == 1
    assert value(reg, "http_requests_in_flight", method="GET", route=ITEMS) == 0


def test_request_id_is_honoured_when_sane_echoed_and_seen_by_the_model_call() -> None:
    reg = CollectorRegistry()
    app = instrument_wsgi(flask_app(reg), registry=reg)
    given = call(app, environ("POST", "/v1/generate", b"x" * 8, {"x-request-id": "rid-7"}))
    assert given.headers["x-request-id"] == "rid-7"
    assert json.loads(given.body)["request_id"] == "rid-7"  # current_request_id() inside
    made = call(app, environ("POST", "/v1/generate", b"x", {"x-request-id": "no spaces allowed"}))
    rid = made.headers["x-request-id"]
    assert len(rid) == 32 and json.loads(made.body)["request_id"] == rid
    labels = {"model": "toy", "model_version": "v1.2.0", "device": "cpu"}
    assert value(reg, "model_inference_time_seconds_count", **labels) == 2
    assert value(reg, "model_inference_time_seconds_sum", **labels) >= 0.02


def test_declared_routes_exist_at_zero_from_the_first_request_even_a_scrape() -> None:
    reg = CollectorRegistry()
    app = instrument_wsgi(flask_app(reg), registry=reg)
    text = call(app, environ(path="/metrics")).body.decode()
    zero = 'http_request_duration_seconds_count{method="GET",route="/v1/boom",'
    assert zero + 'status="200",status_class="2xx"} 0.0' in text
    assert 'method="POST",route="/v1/echo"' in text
    assert 'method="HEAD"' not in text and 'method="OPTIONS"' not in text


def test_flask_handler_exception_is_a_counted_500() -> None:
    reg = CollectorRegistry()
    app = instrument_wsgi(flask_app(reg), registry=reg)
    app.logger.disabled = True  # Flask logs the traceback itself
    assert call(app, environ(path="/v1/boom")).status == 500
    labels = {"method": "GET", "route": "/v1/boom"}
    assert value(reg, "http_server_errors_total", exception="RuntimeError", **labels) == 1
    failed = {"status_class": "5xx", "status": "500"}
    assert value(reg, "http_request_duration_seconds_count", **labels, **failed) == 1


def test_raw_app_exception_is_recorded_then_reraised() -> None:
    reg = CollectorRegistry()

    def app(env: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        raise ValueError("broken")

    wrapped = instrument_wsgi(app, registry=reg, routes=["/x"])
    with pytest.raises(ValueError):
        call(wrapped, environ(path="/x"))
    labels = {"method": "GET", "route": "/x"}
    assert value(reg, "http_server_errors_total", exception="ValueError", **labels) == 1
    failed = {"status_class": "5xx", "status": "500"}
    assert value(reg, "http_request_duration_seconds_count", **labels, **failed) == 1
    assert value(reg, "http_requests_in_flight", **labels) == 0


def test_a_model_error_that_leaves_the_app_is_a_server_error_with_its_code(
    tmp_path: Path,
) -> None:
    reg = CollectorRegistry()

    def app(env: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        with aivitals.inference(model="toy", version="v1", registry=reg):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    wrapped = instrument_wsgi(app, registry=reg, routes=["/g"])
    path = tmp_path / "svc.jsonl"
    writer = configure_logging(path, registry=reg)
    try:
        with pytest.raises(RuntimeError):
            call(wrapped, environ(path="/g"))
    finally:
        writer.stop()
    labels = {"method": "GET", "route": "/g"}
    assert value(reg, "http_server_errors_total", exception="RuntimeError", **labels) == 1
    responded = [json.loads(x) for x in path.read_text().splitlines()][-1]
    assert responded["event"] == "responded" and responded["status"] == 500
    assert responded["error_code"] == "CUDA_OOM"  # the model call's code, not a generic one


def test_a_streamed_body_runs_inside_the_request(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    app = instrument_wsgi(flask_app(reg), registry=reg)
    path = tmp_path / "svc.jsonl"
    writer = configure_logging(path, registry=reg)
    try:
        answer = call(app, environ(path="/v1/stream", headers={"x-request-id": "s-1"}))
    finally:
        writer.stop()
    assert answer.body == b"tok0 tok1 tok2 "
    stream = {"method": "GET", "route": "/v1/stream"}
    assert value(reg, "http_time_to_first_byte_seconds_count", **stream) == 1
    model = {"model": "toy", "model_version": "v1", "device": "cpu"}
    assert value(reg, "model_inference_time_seconds_count", **model) == 1
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    responded = [x for x in lines if x["event"] == "responded"]
    # the model call ran while the server iterated the body, after the app returned
    assert responded[0]["request_id"] == "s-1" and responded[0]["model_version"] == "v1"
    assert responded[0]["response_size_bytes"] == len(answer.body)


def test_a_close_before_the_end_is_a_client_disconnect(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    app = instrument_wsgi(flask_app(reg), registry=reg)
    path = tmp_path / "svc.jsonl"
    writer = configure_logging(path, registry=reg)
    try:
        answer = Answer()
        result = app(environ(path="/v1/stream"), answer.start_response)
        iterator = iter(result)
        assert next(iterator) == b"tok0 "
        result.close()  # type: ignore[attr-defined]  # the server could not write: client gone
    finally:
        writer.stop()
    labels = {"method": "GET", "route": "/v1/stream"}
    assert value(reg, "http_client_disconnects_total", **labels) == 1
    assert value(reg, "http_requests_in_flight", **labels) == 0
    assert value(reg, "model_aborts_total", model="toy", reason="client_disconnect") == 1
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [x.get("client_disconnected") for x in lines if x["event"] == "responded"] == [True]


def test_lifecycle_lines_are_json_in_order_with_the_five_fields(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    app = instrument_wsgi(flask_app(reg), registry=reg)
    path = tmp_path / "svc.jsonl"
    writer = configure_logging(path, registry=reg)
    try:
        call(app, environ("POST", "/v1/generate", b"y" * 20, {"x-request-id": "l-1"}))
        call(app, environ(path="/v1/items/4", headers={"x-request-id": "l-2"}))
    finally:
        writer.stop()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    events = [(x["request_id"], x["event"]) for x in lines]
    assert events == [
        ("l-1", "received"),
        ("l-1", "started"),
        ("l-1", "responded"),
        ("l-2", "received"),
        ("l-2", "responded"),
    ]
    assert lines[0]["body_size_bytes"] == 20 and lines[0]["route"] == "/v1/generate"
    assert lines[2]["input_token_count"] == 6 and lines[2]["status"] == 200
    assert lines[2]["total_time_ms"] >= lines[2]["gpu_time_ms"] >= 10


def test_body_size_is_what_was_read_or_what_was_declared_when_left_unread() -> None:
    reg = CollectorRegistry()

    def app(env: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        if env["PATH_INFO"] == "/read":
            env["wsgi.input"].read(10)  # part of it
            env["wsgi.input"].read()  # the rest
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    wrapped = instrument_wsgi(app, registry=reg, routes=["/read", "/unread"])
    call(wrapped, environ("POST", "/read", b"z" * 300))
    env = environ("POST", "/unread", b"z" * 10, CONTENT_LENGTH="5000")
    call(wrapped, env)
    assert value(reg, "http_request_body_size_bytes_sum", method="POST", route="/read") == 300
    assert value(reg, "http_request_body_size_bytes_sum", method="POST", route="/unread") == 5000


def test_raw_app_templates_and_a_resolver_name_the_route() -> None:
    reg = CollectorRegistry()

    def app(env: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("200 OK", [])
        return [b""]

    wrapped = instrument_wsgi(app, registry=reg, routes=["/v1/items/{id}"])
    call(wrapped, environ(path="/v1/items/77"))
    ok = {"status_class": "2xx", "status": "200"}
    by_template = {"method": "GET", "route": "/v1/items/{id}", **ok}
    assert value(reg, "http_request_duration_seconds_count", **by_template) == 1
    reg2 = CollectorRegistry()
    seen: list[str] = []

    def resolver(env: Environ) -> str:
        seen.append(env["PATH_INFO"])
        return "/by/resolver"

    by_resolver = instrument_wsgi(app, registry=reg2, route_resolver=resolver, metrics_path=None)
    call(by_resolver, environ(path="/anything/1"))
    assert seen == ["/anything/1"]
    named = {"method": "GET", "route": "/by/resolver", **ok}
    assert value(reg2, "http_request_duration_seconds_count", **named) == 1


def test_metrics_path_never_shadows_a_flask_route(caplog: pytest.LogCaptureFixture) -> None:
    app = flask_app(CollectorRegistry())

    @app.get("/metrics")
    def own_metrics() -> str:
        return "the app's own"

    with pytest.raises(ConfigError, match=r"metrics_path '/metrics' is a path the app serves"):
        instrument_wsgi(app, registry=CollectorRegistry())
    reg = CollectorRegistry()
    instrument_wsgi(app, registry=reg, metrics_path="/aivitals/metrics")
    assert call(app, environ(path="/metrics")).body == b"the app's own"
    assert b"http_request_duration_seconds" in call(app, environ(path="/aivitals/metrics")).body

    # a route added after instrument_wsgi(): the app's route wins, and it is said loudly
    late = flask_app(CollectorRegistry())
    instrument_wsgi(late, registry=CollectorRegistry())

    @late.get("/metrics")
    def late_metrics() -> str:
        return "added later"

    with caplog.at_level(logging.ERROR, logger="aivitals.instrument"):
        assert call(late, environ(path="/metrics")).body == b"added later"
    assert any("is a path the app serves" in r.getMessage() for r in caplog.records)


def test_metrics_path_and_opaque_apps(caplog: pytest.LogCaptureFixture) -> None:
    def app(env: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("200 OK", [])
        return [b"app"]

    with pytest.raises(ConfigError, match="a path the app serves"):
        instrument_wsgi(app, registry=CollectorRegistry(), routes=["/metrics", "/v1/x"])
    with caplog.at_level(logging.WARNING, logger="aivitals.instrument"):
        opaque = instrument_wsgi(app, registry=CollectorRegistry())
    assert any("cannot see the app's own routes" in r.getMessage() for r in caplog.records)
    assert b"# HELP" in call(opaque, environ(path="/metrics")).body
    assert call(opaque, environ("POST", "/metrics")).status == 405
    head = call(opaque, environ("HEAD", "/metrics"))
    assert head.status == 200 and head.body == b""
    openmetrics = {"accept": "application/openmetrics-text"}
    scraped = call(opaque, environ(path="/metrics", headers=openmetrics))
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    passthrough = instrument_wsgi(app, registry=CollectorRegistry(), metrics_path=None)
    assert call(passthrough, environ(path="/metrics")).body == b"app"


async def _asgi(scope: Any, receive: Any, send: Any) -> None:
    return None


def test_what_is_not_a_wsgi_app_is_refused_with_what_to_do() -> None:
    cases: list[tuple[Any, str]] = [
        (42, "expected a WSGI application"),
        (_asgi, r"ASGI application; instrument it with aivitals.instrument\(app\)"),
        (lambda env: env, r"does not take \(environ, start_response\)"),
    ]
    for bad, message in cases:
        with pytest.raises(ConfigError, match=message) as caught:
            instrument_wsgi(bad, registry=CollectorRegistry())
        assert isinstance(caught.value, AivitalsError)
    with pytest.raises(ConfigError, match=r"WSGI application .*instrument_wsgi\(app\)"):
        instrument(Flask("x"), registry=CollectorRegistry())
    with pytest.raises(ConfigError, match="instrument_wsgi"):
        aivitals.instrument(lambda environ, start_response: [], registry=CollectorRegistry())


def test_instrumenting_twice_counts_once() -> None:
    reg = CollectorRegistry()
    app = flask_app(reg)
    instrument_wsgi(app, registry=reg)
    middleware = app.wsgi_app
    assert instrument_wsgi(app, registry=reg) is app and app.wsgi_app is middleware
    assert instrument_wsgi(middleware, registry=reg) is middleware
    call(app, environ(path="/v1/items/1"))
    ok = {"status_class": "2xx", "status": "200"}
    assert value(reg, "http_request_duration_seconds_count", method="GET", route=ITEMS, **ok) == 1


def test_several_processes_without_a_shared_directory_are_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = CollectorRegistry()
    app = instrument_wsgi(flask_app(reg), registry=reg)
    with caplog.at_level(logging.ERROR, logger="aivitals.instrument"):
        for i in range(3):
            call(app, environ(path=f"/v1/items/{i}", **{"wsgi.multiprocess": True}))
    found = [r for r in caplog.records if "wsgi.multiprocess" in r.getMessage()]
    assert len(found) == 1 and "PROMETHEUS_MULTIPROC_DIR" in found[0].getMessage()


def test_ensure_multiprocess_is_a_no_op_outside_gunicorn() -> None:
    assert ensure_multiprocess() is None


def test_legacy_write_callable_counts_the_bytes() -> None:
    reg = CollectorRegistry()

    def app(env: Environ, start_response: Callable[..., Any]) -> Iterator[bytes]:
        write = start_response("200 OK", [])
        write(b"12345")
        yield b"678"

    wrapped = instrument_wsgi(app, registry=reg, routes=["/w"])
    assert call(wrapped, environ(path="/w")).body == b"678"
    assert value(reg, "http_response_body_size_bytes_sum", method="GET", route="/w") == 8


def test_a_catch_all_flask_route_is_not_shadowed_but_served_in_front() -> None:
    app = flask_app(CollectorRegistry())

    @app.get("/<path:anything>")
    def page(anything: str) -> str:
        return "page"

    instrument_wsgi(app, registry=CollectorRegistry())  # no ConfigError: not this path's own
    assert b"http_request_duration_seconds" in call(app, environ(path="/metrics")).body
    assert call(app, environ(path="/anything")).body == b"page"
