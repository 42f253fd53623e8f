from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry

import aivitals
import aivitals.instrument as instrument_pkg


def test_all_is_sorted_unique_and_exported() -> None:
    names = list(instrument_pkg.__all__)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(instrument_pkg, name), name


def test_top_level_entry_points() -> None:
    assert callable(aivitals.instrument)
    assert aivitals.instrument is instrument_pkg
    assert aivitals.inference is instrument_pkg.inference
    assert aivitals.timed_inference is instrument_pkg.timed_inference
    assert aivitals.instrument.configure_logging is instrument_pkg.configure_logging


@pytest.mark.anyio
async def test_calling_the_package_instruments_a_raw_app() -> None:
    async def app(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    reg = CollectorRegistry()
    wrapped = aivitals.instrument(app, registry=reg, routes=["/"])
    transport = httpx.ASGITransport(app=wrapped)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.get("/")
    assert r.status_code == 200 and "x-request-id" in r.headers
    assert (
        reg.get_sample_value(
            "http_request_duration_seconds_count",
            {"method": "GET", "route": "/", "status_class": "2xx", "status": "200"},
        )
        == 1
    )
