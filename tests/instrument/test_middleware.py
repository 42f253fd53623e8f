from __future__ import annotations

import asyncio
import logging
import random
import string
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from aivitals.errors import ConfigError
from aivitals.instrument import AivitalsMiddleware, InstrumentConfig, current_request_id
from tests.instrument._apps import fastapi_app


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.anyio
async def test_route_template_status_and_sizes_are_recorded() -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)
    async with await _client(app) as client:
        r = await client.post("/v1/echo", content=b"x" * 300)
        assert r.status_code == 200
        r2 = await client.get("/v1/items/42")
        assert r2.status_code == 200
    post = {"method": "POST", "route": "/v1/echo"}
    assert (
        _value(reg, "http_request_duration_seconds_count", **post, status_class="2xx", status="200")
        == 1
    )
    assert _value(reg, "http_request_body_size_bytes_sum", **post) == 300
    assert _value(reg, "http_response_body_size_bytes_sum", **post) == len(r.content)
    get = {"method": "GET", "route": "/v1/items/{item_id}"}
    assert (
        _value(reg, "http_request_duration_seconds_count", **get, status_class="2xx", status="200")
        == 1
    )
    assert _value(reg, "http_requests_in_flight", **post) == 0


@pytest.mark.anyio
async def test_request_id_is_honoured_when_sane_and_generated_otherwise() -> None:
    reg = CollectorRegistry()
    seen: list[str | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(current_request_id())
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    wrapped = AivitalsMiddleware(app, registry=reg, routes=["/"])
    async with await _client(wrapped) as client:
        good = await client.get("/", headers={"X-Request-ID": "abc-123"})
        too_long = await client.get("/", headers={"X-Request-ID": "a" * 200})
        bad_chars = await client.get("/", headers={"X-Request-ID": "a b<script>"})
        none = await client.get("/")
    assert good.headers["x-request-id"] == "abc-123"
    for r in (too_long, bad_chars, none):
        assert len(r.headers["x-request-id"]) == 32
    assert seen == ["abc-123", *(r.headers["x-request-id"] for r in (too_long, bad_chars, none))]
    assert current_request_id() is None


@pytest.mark.anyio
async def test_body_size_counts_bytes_received_not_content_length() -> None:
    reg = CollectorRegistry()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    wrapped = AivitalsMiddleware(app, registry=reg, routes=["/up"])
    chunks = iter([b"a" * 10, b"b" * 20, b"c" * 5])

    async def body() -> Any:
        for chunk in chunks:
            yield chunk

    async with await _client(wrapped) as client:
        r = await client.post("/up", content=body(), headers={"Content-Length": "999999"})
    assert r.status_code == 200
    assert _value(reg, "http_request_body_size_bytes_sum", method="POST", route="/up") == 35


@pytest.mark.anyio
async def test_a_body_refused_unread_counts_what_its_content_length_declared() -> None:
    # an input guard answers 413 from the Content-Length alone, never reading the body:
    # the client sent 100 kB all the same (it was measured as a 0-byte request)
    reg = CollectorRegistry()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 413, "headers": []})
        await send({"type": "http.response.body", "body": b"too large"})

    wrapped = AivitalsMiddleware(app, registry=reg, routes=["/up"])
    async with await _client(wrapped) as client:
        r = await client.post("/up", content=b"x" * 100_000)
        bad = await client.post("/up", content=b"x" * 10, headers={"Content-Length": "ten"})
    assert r.status_code == 413 and bad.status_code == 413
    # 100,000 declared and refused unread; a malformed length counts as nothing unread
    got = _value(reg, "http_request_body_size_bytes_sum", method="POST", route="/up")
    assert got == 100_000


@pytest.mark.anyio
async def test_app_exception_is_counted_then_reraised_and_in_flight_returns_to_zero() -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.get("/v1/boom")
    assert r.status_code == 500
    labels = {"method": "GET", "route": "/v1/boom"}
    assert _value(reg, "http_server_errors_total", **labels, exception="RuntimeError") == 1
    assert (
        _value(
            reg, "http_request_duration_seconds_count", **labels, status_class="5xx", status="500"
        )
        == 1
    )
    assert _value(reg, "http_requests_in_flight", **labels) == 0


@pytest.mark.anyio
async def test_exception_propagates_out_of_raw_app() -> None:
    reg = CollectorRegistry()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("broken")

    wrapped = AivitalsMiddleware(app, registry=reg, routes=["/x"])
    async with await _client(wrapped) as client:
        with pytest.raises(ValueError, match="broken"):
            await client.get("/x")
    assert _value(reg, "http_requests_in_flight", method="GET", route="/x") == 0
    assert (
        _value(reg, "http_server_errors_total", method="GET", route="/x", exception="ValueError")
        == 1
    )


@pytest.mark.anyio
async def test_streaming_time_to_first_byte_is_less_than_total() -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)
    async with await _client(app) as client:
        r = await client.get("/v1/stream")
    assert r.text.startswith("tok0")
    labels = {"method": "GET", "route": "/v1/stream"}
    ttfb = _value(reg, "http_time_to_first_byte_seconds_sum", **labels)
    total = _value(
        reg, "http_request_duration_seconds_sum", **labels, status_class="2xx", status="200"
    )
    assert 0 < ttfb < total
    assert total - ttfb >= 0.06  # four more tokens 20 ms apart after the first
    ttft = _value(reg, "model_time_to_first_token_seconds_sum", model="toy")
    wall = _value(
        reg,
        "model_inference_wall_time_seconds_sum",
        model="toy",
        model_version="v1.0.0",
        device="cpu",
    )
    assert 0 < ttft < wall
    assert _value(reg, "model_output_tokens_sum", model="toy") == 5


@pytest.mark.slow
@pytest.mark.anyio
async def test_random_404_flood_adds_at_most_one_series() -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)
    rng = random.Random(7)

    def series() -> set[tuple[tuple[str, str], ...]]:
        return {
            tuple(sorted(s.labels.items()))
            for fam in reg.collect()
            for s in fam.samples
            if s.name.startswith("http_") and not s.name.endswith("_bucket")
        }

    async with await _client(app) as client:
        await client.get("/v1/items/1")
        before = series()
        for _ in range(10_000):
            middle = "".join(rng.choices(string.ascii_lowercase + "/", k=12))
            r = await client.get(f"/{middle}x")
            assert r.status_code == 404
    added = series() - before
    # one label set per family of the unmatched route (duration with its status, sizes, ...)
    assert {dict(labels).get("route") for labels in added} == {"<unmatched>", None}
    durations = {labels for labels in added if ("status", "404") in labels}
    assert len(durations) == 1
    assert _value(reg, "http_unmatched_requests_total", method="GET") == 10_000


@pytest.mark.anyio
async def test_unknown_methods_fold_into_other() -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)
    async with await _client(app) as client:
        for i in range(5):
            await client.request(f"BREW{i}", "/v1/echo")
    assert (
        _value(
            reg,
            "http_request_duration_seconds_count",
            method="<other>",
            route="/v1/echo",
            status_class="4xx",
            status="405",
        )
        == 5
    )


@pytest.mark.anyio
async def test_route_values_past_the_cap_fold_into_other_and_are_counted() -> None:
    reg = CollectorRegistry()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    wrapped = AivitalsMiddleware(
        app, registry=reg, max_route_values=3, route_resolver=lambda scope: scope["path"]
    )
    async with await _client(wrapped) as client:
        for i in range(10):
            await client.get(f"/r{i}")
    assert (
        _value(
            reg,
            "http_request_duration_seconds_count",
            method="GET",
            route="<other>",
            status_class="2xx",
            status="200",
        )
        == 7
    )
    assert (
        _value(reg, "aivitals_cardinality_folded_total", metric="http_request_duration_seconds")
        == 7
    )


@pytest.mark.anyio
async def test_metrics_path_serves_the_exposition() -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)
    async with await _client(app) as client:
        await client.get("/v1/items/1")
        r = await client.get("/metrics")
        post = await client.post("/metrics")
    assert r.status_code == 200
    assert 'http_request_duration_seconds_count{method="GET",route="/v1/items/{item_id}"' in r.text
    assert post.status_code == 405


@pytest.mark.anyio
async def test_lifespan_and_websocket_scopes_pass_through() -> None:
    reg = CollectorRegistry()
    calls: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["type"])

    wrapped = AivitalsMiddleware(app, registry=reg)
    await wrapped({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    await wrapped({"type": "websocket", "path": "/ws"}, None, None)  # type: ignore[arg-type]
    assert calls == ["lifespan", "websocket"]


@pytest.mark.anyio
async def test_client_disconnect_is_counted_and_in_flight_returns_to_zero() -> None:
    reg = CollectorRegistry()
    started = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        message = await receive()  # the body
        message = await receive()  # blocks until the client goes away
        assert message["type"] == "http.disconnect"

    wrapped = AivitalsMiddleware(app, registry=reg, routes=["/slow"])
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await messages.put({"type": "http.request", "body": b"", "more_body": False})

    async def send(message: Any) -> None:
        raise AssertionError("nothing is sent")

    scope = {"type": "http", "method": "GET", "path": "/slow", "headers": []}
    task = asyncio.create_task(wrapped(scope, messages.get, send))
    await started.wait()
    await messages.put({"type": "http.disconnect"})
    await task
    labels = {"method": "GET", "route": "/slow"}
    assert _value(reg, "http_client_disconnects_total", **labels) == 1
    assert _value(reg, "http_requests_in_flight", **labels) == 0
    assert (
        _value(
            reg, "http_request_duration_seconds_count", **labels, status_class="4xx", status="499"
        )
        == 1
    )


@pytest.mark.anyio
async def test_cancelled_request_counts_as_disconnect() -> None:
    reg = CollectorRegistry()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(10)

    wrapped = AivitalsMiddleware(app, registry=reg, routes=["/c"])
    scope = {"type": "http", "method": "GET", "path": "/c", "headers": []}
    task = asyncio.create_task(wrapped(scope, None, None))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _value(reg, "http_client_disconnects_total", method="GET", route="/c") == 1
    assert _value(reg, "http_requests_in_flight", method="GET", route="/c") == 0


@pytest.mark.anyio
async def test_non_utf8_header_bytes_do_not_break_the_request() -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)
    scope_headers = [(b"x-request-id", b"\xff\xfe\x80"), (b"user-agent", b"\xc3\x28")]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/items/3",
        "raw_path": b"/v1/items/3",
        "query_string": b"",
        "root_path": "",
        "headers": scope_headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 200
    rid = dict(sent[0]["headers"])[b"x-request-id"]
    assert len(rid) == 32 and rid != b"\xff\xfe\x80"


def test_bad_config_names_the_key_and_value() -> None:
    with pytest.raises(ConfigError, match="metrics_path"):
        InstrumentConfig(metrics_path="metrics")
    with pytest.raises(ConfigError, match="request_id_header"):
        InstrumentConfig(request_id_header="X Request")
    with pytest.raises(ConfigError, match="max_route_values"):
        InstrumentConfig(max_route_values=0)
    with pytest.raises(ConfigError, match="routes"):
        InstrumentConfig(routes=["v1/x"])
    with pytest.raises(TypeError):
        InstrumentConfig("/metrics")  # type: ignore[misc]


def test_mounted_router_gives_the_full_template() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    reg = CollectorRegistry()
    app = Starlette(routes=[Mount("/api", routes=[Route("/users/{uid}", hello)])])
    wrapped = AivitalsMiddleware(app, registry=reg)

    async def go() -> None:
        async with await _client(wrapped) as client:
            assert (await client.get("/api/users/7")).status_code == 200

    asyncio.run(go())
    assert (
        _value(
            reg,
            "http_request_duration_seconds_count",
            method="GET",
            route="/api/users/{uid}",
            status_class="2xx",
            status="200",
        )
        == 1
    )


def test_families_are_shared_with_other_packages_on_one_registry() -> None:
    from aivitals import signals
    from aivitals.instrument import InstrumentedQueue

    reg = CollectorRegistry()
    theirs = signals.metric("queue_length", registry=reg)  # e.g. the protection layer's
    queue: InstrumentedQueue[int] = InstrumentedQueue(3, name="shared", registry=reg)
    queue.put_nowait(1)
    assert reg.get_sample_value("queue_length", {"queue": "shared"}) == 1
    assert theirs is not None


@pytest.mark.anyio
async def test_instrumenting_twice_counts_once() -> None:
    from aivitals.instrument import instrument

    reg = CollectorRegistry()
    app = fastapi_app(reg)
    assert instrument(app, registry=reg) is app
    wrapped = AivitalsMiddleware(app, registry=CollectorRegistry())
    assert instrument(wrapped) is wrapped
    async with await _client(app) as client:
        await client.get("/v1/items/1")
    get = {"method": "GET", "route": "/v1/items/{item_id}", "status_class": "2xx", "status": "200"}
    assert _value(reg, "http_request_duration_seconds_count", **get) == 1


@pytest.mark.anyio
async def test_metrics_app_speaks_openmetrics_when_asked() -> None:
    from aivitals.instrument import metrics_app

    reg = CollectorRegistry()
    app = fastapi_app(reg)
    async with await _client(app) as client:
        await client.get("/v1/items/1")
    async with await _client(metrics_app(registry=reg)) as client:
        r = await client.get("/", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        head = await client.head("/")
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.endswith("# EOF\n")
    assert "http_request_duration_seconds_bucket" in r.text
    assert head.status_code == 200 and head.content == b""


@pytest.mark.anyio
async def test_declared_routes_export_zero_series_before_any_request() -> None:
    # an idle service must export its HTTP series (count 0), or absent() alerts page on it
    reg = CollectorRegistry()
    app = fastapi_app(reg)
    async with await _client(app) as client:
        exposition = (await client.get("/metrics")).text  # the first call: not a request
        post = {"method": "POST", "route": "/v1/echo", "status_class": "2xx", "status": "200"}
        get = {"method": "GET", "route": "/v1/items/{item_id}", "status_class": "2xx"}
        assert reg.get_sample_value("http_request_duration_seconds_count", post) == 0
        assert (
            reg.get_sample_value("http_request_duration_seconds_count", get | {"status": "200"})
            == 0
        )
        assert 'route="/v1/echo"' in exposition
        # no HEAD twin, no /metrics series, no method a route does not take
        assert (
            reg.get_sample_value("http_request_duration_seconds_count", post | {"method": "HEAD"})
            is None
        )
        assert (
            reg.get_sample_value("http_request_duration_seconds_count", post | {"method": "GET"})
            is None
        )
        await client.post("/v1/echo", content=b"x")
    assert reg.get_sample_value("http_request_duration_seconds_count", post) == 1


@pytest.mark.anyio
async def test_raw_app_templates_are_declared_at_lifespan_startup() -> None:
    reg = CollectorRegistry()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})

    wrapped = AivitalsMiddleware(app, registry=reg, routes=["/v1/generate"])
    sent: list[Any] = []

    async def receive() -> dict[str, str]:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        sent.append(message)

    await wrapped({"type": "lifespan"}, receive, send)
    labels = {"route": "/v1/generate", "status_class": "2xx", "status": "200"}
    for method in ("GET", "POST"):
        count = reg.get_sample_value(
            "http_request_duration_seconds_count", labels | {"method": method}
        )
        assert count == 0
    assert sent == [{"type": "lifespan.startup.complete"}]


@pytest.mark.anyio
async def test_metrics_path_never_shadows_a_route_the_app_serves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = fastapi_app(CollectorRegistry(), instrumented=False)

    @app.get("/metrics")
    async def own_metrics() -> str:
        return "the app's own"

    # instrument() on a FastAPI app adds the middleware, which Starlette builds at the first
    # call (the lifespan startup under a server): the overlap is refused there, before any
    # request is answered
    with pytest.raises(ConfigError, match=r"metrics_path '/metrics' is a path the app serves"):
        AivitalsMiddleware(app, registry=CollectorRegistry())
    free = "/aivitals/metrics"
    wrapped = AivitalsMiddleware(app, registry=CollectorRegistry(), metrics_path=free)
    async with await _client(wrapped) as client:
        assert (await client.get("/metrics")).json() == "the app's own"
        exposition = await client.get("/aivitals/metrics")
    assert "http_request_duration_seconds" in exposition.text

    # a route added after the middleware was built: the app's route wins, said loudly
    late = fastapi_app(CollectorRegistry(), instrumented=False)
    late_wrapped = AivitalsMiddleware(late, registry=CollectorRegistry())

    @late.get("/metrics")
    async def late_metrics() -> str:
        return "added later"

    with caplog.at_level(logging.ERROR, logger="aivitals.instrument"):
        async with await _client(late_wrapped) as client:
            assert (await client.get("/metrics")).json() == "added later"
    assert any("is a path the app serves" in r.getMessage() for r in caplog.records)


def test_metrics_path_and_raw_asgi_apps(caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    with pytest.raises(ConfigError, match="a path the app serves"):
        AivitalsMiddleware(app, registry=CollectorRegistry(), routes=["/metrics", "/v1/x"])
    with caplog.at_level(logging.WARNING, logger="aivitals.instrument"):
        AivitalsMiddleware(app, registry=CollectorRegistry())
    assert any("cannot see the app's own routes" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aivitals.instrument"):
        AivitalsMiddleware(app, registry=CollectorRegistry(), metrics_path=None)
    assert not caplog.records  # nothing served, nothing shadowed


@pytest.mark.anyio
async def test_a_catch_all_route_or_a_root_mount_is_not_shadowed_but_served_in_front() -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    async def page(request: Any) -> PlainTextResponse:
        return PlainTextResponse("page")

    catch_all = Starlette(routes=[Route("/{path:path}", page)])
    root_mount = Starlette(routes=[Mount("/", app=Starlette(routes=[Route("/{p:path}", page)]))])
    for app in (catch_all, root_mount):
        wrapped = AivitalsMiddleware(app, registry=CollectorRegistry())  # no ConfigError
        async with await _client(wrapped) as client:
            assert "http_request_duration_seconds" in (await client.get("/metrics")).text
            assert (await client.get("/anything")).text == "page"
