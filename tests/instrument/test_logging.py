from __future__ import annotations

import io
import json
import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

import aivitals
from aivitals.errors import ConfigError
from aivitals.instrument import CONTEXT_FIELDS, JsonFormatter, configure_logging, inference
from aivitals.signals import ErrorCode
from tests.instrument._apps import fastapi_app


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.anyio
async def test_lifecycle_lines_parse_and_carry_the_five_fields(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)

    @app.post("/v1/generate")
    async def generate(body: dict[str, Any]) -> dict[str, int]:
        queue: aivitals.instrument.InstrumentedQueue[int] = aivitals.instrument.InstrumentedQueue(
            4, name="gen", registry=reg
        )
        queue.put_nowait(1)
        await queue.get()
        ids = list(range(len(body["prompt"])))
        with inference(
            model="toy", version="v1.2.3-9-gdeadbee", input_ids=ids, max_new_tokens=16, registry=reg
        ) as call:
            call.output_ids([1, 2])
        return {"n": len(ids)}

    path = tmp_path / "svc.jsonl"
    writer = configure_logging(path, registry=reg)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.post(
                "/v1/generate", json={"prompt": "hello world"}, headers={"X-Request-ID": "rid-42"}
            )
            assert r.status_code == 200
    finally:
        writer.stop()
    lines = _lines(path)
    assert [line["event"] for line in lines] == ["received", "enqueued", "started", "responded"]
    for line in lines:
        for field in CONTEXT_FIELDS:
            assert field in line
        assert line["request_id"] == "rid-42"
    received, enqueued, started, responded = lines
    assert received["body_size_bytes"] == len(b'{"prompt":"hello world"}')
    assert enqueued["queue_length"] == 1
    assert started["input_tokens"] == 11 and started["max_new_tokens"] == 16
    assert responded["model_version"] == "v1.2.3"
    assert responded["input_token_count"] == 11
    assert responded["gpu_device_id"] == "cpu"
    assert responded["error_code"] is None
    assert responded["status"] == 200
    assert responded["total_time_ms"] >= responded["gpu_time_ms"] > 0


@pytest.mark.anyio
async def test_failed_request_logs_error_code_and_responded(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)

    @app.get("/v1/oom")
    async def oom() -> None:
        with inference(model="toy", registry=reg):
            raise RuntimeError("CUDA out of memory. Tried to allocate 8.00 GiB.")

    path = tmp_path / "svc.jsonl"
    with configure_logging(path, registry=reg):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/v1/oom")).status_code == 500
    responded = [line for line in _lines(path) if line["event"] == "responded"]
    assert len(responded) == 1
    assert responded[0]["error_code"] == "CUDA_OOM"
    assert responded[0]["status"] == 500


def test_other_packages_extra_fields_render_and_prompts_are_redacted() -> None:
    stream = io.StringIO()
    reg = CollectorRegistry()
    writer = configure_logging(stream, registry=reg)
    try:
        log = logging.getLogger("aivitals.protect")
        log.info("shed", extra={"reason": "queue_full", "prompt": "secret text", "n": 3})
        log.warning("odd", extra={"obj": object()})
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        except RuntimeError:
            log.exception("crashed")
    finally:
        writer.stop()
    shed, odd, crashed = (json.loads(line) for line in stream.getvalue().splitlines())
    assert shed["event"] == "shed" and shed["logger"] == "aivitals.protect"
    assert shed["reason"] == "queue_full" and shed["n"] == 3
    assert shed["prompt"] == "<redacted 11 chars>"
    assert shed["request_id"] is None and shed["error_code"] is None
    assert odd["level"] == "warning" and odd["obj"].startswith("<object")
    assert crashed["error_code"] == "CUDA_ERROR" and "Traceback" in crashed["traceback"]


def test_prompts_logged_only_when_opted_in() -> None:
    record = logging.LogRecord("aivitals.x", logging.INFO, "", 0, "e", (), None)
    record.prompt = "hello"
    assert json.loads(JsonFormatter(log_prompts=True).format(record))["prompt"] == "hello"


def test_full_queue_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    gate = threading.Event()

    class SlowHandler(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            gate.wait(5)
            self.lines.append(self.format(record))

    handler = SlowHandler()
    writer = configure_logging(handler, queue_size=5, registry=reg)
    log = logging.getLogger("aivitals.test")
    try:
        for i in range(50):
            log.info("burst", extra={"i": i})
        assert writer.dropped >= 40
        assert reg.get_sample_value("aivitals_log_records_dropped_total") == writer.dropped
    finally:
        gate.set()
        writer.stop()
    # nothing accepted is lost: every record not counted as dropped was written
    assert len(handler.lines) + writer.dropped == 50


def test_bad_logging_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="queue_size"):
        configure_logging(io.StringIO(), queue_size=0)
    with pytest.raises(ConfigError, match="level"):
        configure_logging(io.StringIO(), level="LOUD")
    with pytest.raises(ConfigError, match="log target"):
        configure_logging(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cannot be opened"):
        configure_logging("/nonexistent-dir/x/y.jsonl")


def test_direct_lines_equal_the_record_path() -> None:
    from aivitals.instrument import log_event

    stream = io.StringIO()
    writer = configure_logging(stream, registry=CollectorRegistry())
    logger = logging.getLogger("aivitals.instrument")
    plain = {
        "route": "/x",
        "status": 200,
        "ratio": 0.5,
        "ok": True,
        "none": None,
        "nested": {"a": [1, 2]},
        "odd": object,
        "code": ErrorCode.CUDA_OOM,
        "inf": float("inf"),
        "quote": 'a"b%s\u00e9\n',
        "big": 10**20,
    }
    payloads = (plain, {**plain, "prompt": "secret"}, {**plain, "error_code": "TIMEOUT"})
    try:
        for payload in payloads:
            log_event("same", payload)  # the direct lane: our writer is the only handler
        logger.addFilter(lambda record: True)  # a filter sends it through a LogRecord
        for payload in payloads:
            log_event("same", payload)
    finally:
        logger.filters.clear()
        writer.stop()
    raw = stream.getvalue().splitlines()
    lines = [json.loads(line) for line in raw]
    for line in lines:
        line.pop("ts")
    assert lines[:3] == lines[3:]
    assert lines[0]["quote"] == 'a"b%s\u00e9\n' and lines[0]["code"] == "CUDA_OOM"
    assert lines[1]["prompt"] == "<redacted 6 chars>"
    assert lines[2]["error_code"] == "TIMEOUT"
    assert raw[0].split(", ", 1)[1] == raw[3].split(", ", 1)[1]  # byte for byte after ts


def test_template_lines_equal_the_dict_encoding_with_and_without_model_fields() -> None:
    # line() fills cached templates (one with the four model fields as literal
    # nulls); json of the whole dict is the reference for every value kind
    formatter = JsonFormatter()
    fields = {"route": "/x", "n": 3, "t": 1.25, "ok": False, "s": 'q"%\u00e9', "v": None}
    contexts = [
        ("rid-1", None, None, None, None),
        ("rid-2", "v3.2.1", 12, "0", None),
        (None, None, None, None, "CUDA_OOM"),
        ("rid-4", None, 7, None, None),
    ]
    for ctx in contexts:
        for payload in (fields, {**fields, "nan": float("nan")}, {"x": [1]}, {}):
            fast = formatter.line("aivitals.t", "e", ctx, payload, 1_700_000_000.5)
            slow = formatter._line_via_dict("aivitals.t", "e", ctx, payload, 1_700_000_000.5)
            assert fast == slow
            assert fast.startswith('{"ts": "2023-11-14T22:13:20.500Z"')
            if "nan" not in payload:
                assert json.loads(fast)["request_id"] == ctx[0]


def test_route_lines_render_exactly_what_log_event_would_write() -> None:
    # the middleware's received/responded tuples, rendered from per-route
    # templates, against the generic line of the same event
    from enum import IntEnum

    from aivitals.instrument._logging import RequestLines

    class Status(IntEnum):
        OK = 200

    lines = RequestLines("aivitals.instrument", "POST", '/v1/"odd"/%s/\u00e9')
    contexts = [("rid", None, None, None, None), ("rid", "v1", 3, "0", "CUDA_OOM"), (None,) * 5]
    for ctx in contexts:
        items = [
            (lines, RequestLines.RECEIVED, ctx, 1_700_000_000.25, 45, True),
            (lines, RequestLines.RECEIVED, ctx, 1_700_000_000.25, 7, False),
            (lines, RequestLines.RESPONDED, ctx, 1_700_000_000.25, 200, 1.235, 0.0, 8, False),
            (lines, RequestLines.RESPONDED, ctx, 1_700_000_000.25, Status.OK, 2.5, 1.0, 0, True),
            (lines, RequestLines.RESPONDED, ctx, 1.5, 499, float("inf"), float("nan"), 0, True),
        ]
        for static in ({}, {"service": "svc"}):
            formatter = JsonFormatter(static=static)
            for item in items:
                assert lines.render(formatter, item) == formatter.line(*lines.event(item))
    item = (lines, RequestLines.RECEIVED, contexts[1], 1_700_000_000.25, 7, False)
    parsed = json.loads(lines.render(JsonFormatter(), item))
    assert parsed["route"] == '/v1/"odd"/%s/\u00e9' and parsed["body_complete"] is False
    assert parsed["error_code"] == "CUDA_OOM" and parsed["ts"] == "2023-11-14T22:13:20.250Z"


@pytest.mark.anyio
async def test_middleware_lines_equal_with_and_without_the_direct_lane() -> None:
    reg = CollectorRegistry()
    app = fastapi_app(reg)

    @app.post("/v1/echo")
    async def echo(body: dict[str, Any]) -> dict[str, int]:
        return {"n": len(body)}

    stream = io.StringIO()
    writer = configure_logging(stream, registry=reg)
    logger = logging.getLogger("aivitals.instrument")
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for lane in (True, False):
                if not lane:
                    logger.addFilter(lambda record: True)  # a filter: through a LogRecord
                r = await client.post("/v1/echo", json={"a": 1}, headers={"X-Request-ID": "r"})
                assert r.status_code == 200
    finally:
        logger.filters.clear()
        writer.stop()
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    for line in parsed:
        line.pop("ts")
        line.pop("total_time_ms", None)  # received lines have none
    assert [line["event"] for line in parsed] == ["received", "responded"] * 2
    assert parsed[:2] == parsed[2:]


def test_executor_submissions_log_enqueued_with_the_waiting_count() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from aivitals.instrument import REQUEST_ID, InstrumentedExecutor

    stream = io.StringIO()
    reg = CollectorRegistry()
    pool = InstrumentedExecutor(ThreadPoolExecutor(1), name="gen", registry=reg)
    gate = threading.Event()
    token = REQUEST_ID.set("rid-pool")
    try:
        with configure_logging(stream, registry=reg):
            first = pool.submit(gate.wait, 5)
            second = pool.submit(gate.wait, 5)
            gate.set()
            first.result(5)
            second.result(5)
    finally:
        REQUEST_ID.reset(token)
        pool.shutdown()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(x["event"], x["queue"]) for x in lines] == [("enqueued", "pool:gen")] * 2
    assert lines[1]["queue_length"] >= lines[0]["queue_length"]
    assert all(x["request_id"] == "rid-pool" for x in lines)
