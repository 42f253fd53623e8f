from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from aivitals.instrument import enable_otel, inference
from tests.instrument._apps import fastapi_app

pytest.importorskip("opentelemetry.sdk.metrics")


def _points(reader: Any) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


@pytest.mark.anyio
async def test_otel_view_maps_to_genai_semantic_conventions() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    view = enable_otel(provider)
    reg = CollectorRegistry()
    try:
        with inference(
            model="toy", version="v2.1.0-3-g1234567", input_tokens=7, registry=reg
        ) as call:
            for _ in range(3):
                call.token()
        app = fastapi_app(reg)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await client.get("/v1/items/5")
    finally:
        view.close()
        provider.shutdown()
    points = _points(reader)
    usage = {p.attributes["gen_ai.token.type"]: p for p in points["gen_ai.client.token.usage"]}
    assert usage["input"].sum == 7 and usage["output"].sum == 3
    assert usage["input"].attributes["gen_ai.request.model"] == "toy"
    assert usage["input"].attributes["aivitals.model_version"] == "v2.1.0"
    assert points["gen_ai.server.time_to_first_token"][0].count == 1
    assert points["gen_ai.server.time_per_output_token"][0].count == 1
    assert points["aivitals.model.inference.duration"][0].count == 1
    request = points["gen_ai.server.request.duration"][0]
    assert request.attributes["http.route"] == "/v1/items/{item_id}"
    assert request.attributes["http.response.status_code"] == 200


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.anyio
async def test_traceparent_is_continued_returned_and_linked_from_openmetrics_exemplars() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    meters = MeterProvider()
    view = enable_otel(meters, tracer_provider=tracers)
    reg = CollectorRegistry()
    try:
        app = fastapi_app(reg)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            traced = await client.get(
                "/v1/items/5", headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"}
            )
            scrape = await client.get(
                "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
            )
            plain = await client.get("/metrics")
        failing = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=failing, base_url="http://t") as client:
            boom = await client.get("/v1/boom")
    finally:
        view.close()
        meters.shutdown()
        tracers.shutdown()
    server, failed = spans.get_finished_spans()
    assert boom.status_code == 500
    assert failed.status.status_code.name == "ERROR"
    assert failed.attributes is not None and failed.attributes["error.type"] == "500"
    assert server.name == "GET /v1/items/{item_id}"
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert server.parent is not None and format(server.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert server.attributes is not None and server.attributes["http.response.status_code"] == 200
    span_id = format(server.context.span_id, "016x")
    assert traced.headers["traceparent"].startswith(f"00-{TRACE_ID}-{span_id}-")
    # OpenMetrics carries the exemplar on the request's latency bucket; the text format cannot
    marked = [
        line
        for line in scrape.text.splitlines()
        if line.startswith("http_request_duration_seconds_bucket") and "# {" in line
    ]
    assert len(marked) == 1 and f'trace_id="{TRACE_ID}"' in marked[0]
    assert "item_id" in marked[0] and 'status="200"' in marked[0]
    assert "# {" not in plain.text


def test_without_a_tracer_provider_no_span_is_opened() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider

    from aivitals.instrument._context import TRACERS

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("something in this process set a global tracer provider")
    view = enable_otel(MeterProvider())  # the global tracer provider was never set
    try:
        assert view.tracer is None and not TRACERS
    finally:
        view.close()
