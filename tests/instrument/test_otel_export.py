"""OTLP export: a span per request and the GenAI histograms, read back by a receiver.

The receiver is a plain HTTP server on a free local port that decodes each
OTLP/HTTP body with opentelemetry-proto's own message classes, as a collector
would; nothing here inspects the SDK's in-memory objects.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

import aivitals
from aivitals.errors import ConfigError
from aivitals.instrument import GENAI_BUCKETS, configure_logging, enable_otel
from tests.instrument._apps import fastapi_app

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
pytest.importorskip("opentelemetry.proto")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


class _Receiver:
    """An OTLP/HTTP receiver: keeps every decoded export request, answers 200."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[Any] = []
        self.metrics: list[Any] = []
        self.content_types: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.content_types.add(self.headers["Content-Type"])
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            receiver.spans.extend(scope.spans)
                elif self.path == "/v1/metrics":
                    metrics_request = ExportMetricsServiceRequest()
                    metrics_request.ParseFromString(body)
                    for resource in metrics_request.resource_metrics:
                        for scope in resource.scope_metrics:
                            receiver.metrics.extend(scope.metrics)
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def _attrs(item: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in item.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _model_app(reg: CollectorRegistry) -> Any:
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/generate")
    async def generate() -> dict[str, int]:
        with aivitals.inference(
            model="toy", version="v2.1.0", input_tokens=7, registry=reg
        ) as call:
            for _ in range(3):
                call.token()
        return {"tokens": 3}

    aivitals.instrument(app, registry=reg)
    return app


@pytest.mark.anyio
async def test_one_request_reaches_the_receiver_as_spans_and_genai_histograms(
    receiver: _Receiver, tmp_path: Path
) -> None:
    reg = CollectorRegistry()
    view = enable_otel(endpoint=receiver.endpoint, service_name="svc", registry=reg)
    log = tmp_path / "svc.jsonl"
    writer = configure_logging(log, registry=reg)
    try:
        app = _model_app(reg)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.post(
                "/v1/generate", headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"}
            )
        view.force_flush()
    finally:
        view.close()
        writer.stop()
    assert response.status_code == 200
    assert "application/x-protobuf" in receiver.content_types

    spans = {span.name: span for span in receiver.spans}
    server = spans["POST /v1/generate"]
    model = spans["text_completion toy"]
    # the incoming trace is continued: same trace id, the caller's span as parent
    assert server.trace_id.hex() == TRACE_ID
    assert server.parent_span_id.hex() == PARENT_SPAN
    assert server.kind == server.SPAN_KIND_SERVER
    assert _attrs(server) | {"http.response.status_code": 200} == _attrs(server)
    assert _attrs(server)["http.route"] == "/v1/generate"
    assert _attrs(server)["http.request.method"] == "POST"
    # the model call is a child of the request's span
    assert model.trace_id == server.trace_id and model.parent_span_id == server.span_id
    attrs = _attrs(model)
    assert attrs["gen_ai.operation.name"] == "text_completion"
    assert attrs["gen_ai.request.model"] == "toy"
    assert attrs["gen_ai.usage.input_tokens"] == 7
    assert attrs["gen_ai.usage.output_tokens"] == 3
    assert server.start_time_unix_nano <= model.start_time_unix_nano
    assert model.end_time_unix_nano <= server.end_time_unix_nano

    # the response names the span, beside x-request-id
    tp = response.headers["traceparent"]
    assert tp == f"00-{TRACE_ID}-{server.span_id.hex()}-01"
    assert response.headers["x-request-id"]

    # the GenAI histograms arrive with the conventions' boundaries, not the SDK's defaults
    by_name: dict[str, Any] = {}
    for metric in receiver.metrics:  # the export at force_flush, not the one at close
        by_name.setdefault(metric.name, metric)
    for name in (
        "gen_ai.server.request.duration",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.client.token.usage",
    ):
        points = by_name[name].histogram.data_points
        assert points, name
        for point in points:
            assert tuple(point.explicit_bounds) == GENAI_BUCKETS[name], name
    ttft = by_name["gen_ai.server.time_to_first_token"].histogram.data_points[0]
    assert ttft.count == 1 and ttft.bucket_counts[0] == 1  # sub-millisecond TTFT
    usage = {
        _attrs(p)["gen_ai.token.type"]: p
        for p in by_name["gen_ai.client.token.usage"].histogram.data_points
    }
    assert usage["input"].sum == 7 and usage["output"].sum == 3
    duration = by_name["gen_ai.server.request.duration"].histogram.data_points[0]
    assert _attrs(duration)["http.route"] == "/v1/generate"
    # exemplars link the latency points to the request's trace
    assert [e.trace_id.hex() for e in duration.exemplars] == [TRACE_ID]
    assert [e.trace_id.hex() for e in ttft.exemplars] == [TRACE_ID]

    # the lifecycle lines carry the trace id
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    lifecycle = [line for line in lines if line.get("event") in ("received", "responded")]
    assert {line["event"] for line in lifecycle} == {"received", "responded"}
    assert all(line["trace_id"] == TRACE_ID for line in lifecycle)
    assert all(line["request_id"] == response.headers["x-request-id"] for line in lifecycle)


@pytest.mark.anyio
async def test_without_traceparent_a_trace_is_started_and_returned(receiver: _Receiver) -> None:
    reg = CollectorRegistry()
    view = enable_otel(endpoint=receiver.endpoint, registry=reg)
    try:
        app = fastapi_app(reg)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            first = await client.get("/v1/items/1")
            second = await client.get("/v1/items/2", headers={"traceparent": "not-a-traceparent"})
        view.force_flush()
    finally:
        view.close()
    trace_ids = set()
    for response in (first, second):
        version, trace_id, span_id, flags = response.headers["traceparent"].split("-")
        assert (version, len(trace_id), len(span_id)) == ("00", 32, 16)
        assert int(flags, 16) & 1  # sampled (the SDK also sets level 2's random bit)
        trace_ids.add(trace_id)
    assert len(trace_ids) == 2  # a malformed traceparent starts a new trace, not an error
    roots = [s for s in receiver.spans if s.name == "GET /v1/items/{item_id}"]
    assert len(roots) == 2 and all(not s.parent_span_id for s in roots)


@pytest.mark.anyio
async def test_endpoint_down_requests_are_served_and_drops_counted() -> None:
    reg = CollectorRegistry()
    down = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    view = enable_otel(endpoint=down, registry=reg, export_timeout_s=0.2)
    try:
        app = fastapi_app(reg)
        transport = httpx.ASGITransport(app=app)
        started = time.perf_counter()
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            responses = [await client.get(f"/v1/items/{i}") for i in range(5)]
        served = time.perf_counter() - started
        view.force_flush(timeout_s=1.0)
    finally:
        view.close()
    assert [r.status_code for r in responses] == [200] * 5
    assert all("traceparent" in r.headers for r in responses)
    # export is batched off the request path: five requests take nothing like a timeout
    assert served < 0.2 * 5
    spans = reg.get_sample_value("aivitals_otel_export_dropped_total", {"signal": "traces"})
    points = reg.get_sample_value("aivitals_otel_export_dropped_total", {"signal": "metrics"})
    assert spans == 5
    assert points is not None and points >= 1


@pytest.mark.parametrize(
    "endpoint", ["collector:4318", "ftp://collector:4318", "http://", "http://c:port"]
)
def test_a_bad_endpoint_is_refused(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="otlp endpoint"):
        enable_otel(endpoint=endpoint, registry=CollectorRegistry())


def test_the_standard_environment_variable_configures_the_endpoint(receiver: _Receiver) -> None:
    reg = CollectorRegistry()
    view = enable_otel(registry=reg, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
    try:
        with aivitals.inference(model="m", version="v1", input_tokens=2, registry=reg):
            pass
        view.force_flush()
    finally:
        view.close()
    assert "gen_ai.client.token.usage" in {m.name for m in receiver.metrics}


def test_endpoint_and_providers_together_are_refused() -> None:
    from opentelemetry.sdk.metrics import MeterProvider

    with pytest.raises(ConfigError, match="not both"):
        enable_otel(MeterProvider(), endpoint="http://127.0.0.1:4318")
