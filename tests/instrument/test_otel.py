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
