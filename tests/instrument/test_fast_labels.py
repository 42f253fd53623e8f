from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from aivitals.instrument._metrics import family
from aivitals.signals import metric


def test_shared_family_takes_labels_by_name_or_position() -> None:
    registry = CollectorRegistry()
    fam = family("cache_requests_total", registry)
    fam.labels(cache="redis", result="hit").inc()
    fam.labels("redis", "hit").inc()
    text = generate_latest(registry).decode()
    assert 'cache_requests_total{cache="redis",result="hit"} 2.0' in text
    with pytest.raises(ValueError, match="expected labels"):
        fam.labels(cache="redis")
    with pytest.raises(ValueError, match="expected labels"):
        fam.labels("redis", result="hit")


def test_protect_and_instrument_share_queue_families_in_either_order() -> None:
    from aivitals.protect._metrics import metrics_for

    first = CollectorRegistry()
    family("queue_length", first).labels(queue="pool").set(3)
    metrics_for(first).queue_length.labels("admission").set(1)
    second = CollectorRegistry()
    metric("queue_length", registry=second).labels(queue="admission").set(1)
    family("queue_length", second).labels(queue="pool").set(3)
    for registry in (first, second):
        text = generate_latest(registry).decode()
        assert 'queue_length{queue="pool"} 3.0' in text
        assert 'queue_length{queue="admission"} 1.0' in text


def test_pending_request_records_fold_into_the_separate_observations() -> None:
    from aivitals.instrument._fast import PENDING, fold_pending, is_lean

    def families(registry: CollectorRegistry) -> list[object]:
        names = (
            "http_requests_in_flight",
            "http_request_duration_seconds",
            "http_request_body_size_bytes",
            "http_response_body_size_bytes",
        )
        return [family(n, registry) for n in names]

    one, separate = CollectorRegistry(), CollectorRegistry()
    texts = []
    for registry, combined in ((one, True), (separate, False)):
        flight, duration, body, response = families(registry)
        f = flight.labels("POST", "/v1/x")  # type: ignore[attr-defined]
        d = duration.labels("POST", "/v1/x", "2xx", "200")  # type: ignore[attr-defined]
        b = body.labels("POST", "/v1/x")  # type: ignore[attr-defined]
        r = response.labels("POST", "/v1/x")  # type: ignore[attr-defined]
        assert is_lean(f, d, b, r)
        for seconds, nbody, nresp in ((0.003, 40, 7), (0.25, 0, 1_000_000), (99.0, 5e9, 0)):
            if combined:
                PENDING.append(f)  # what the middleware appends: started, then finished
                PENDING.append(((f, b, r), d, seconds, nbody, nresp))
                if seconds > 1:
                    fold_pending()  # a fold by the request path; the rest at the scrape
            else:
                f.inc()
                f.dec()
                d.observe(seconds)
                b.observe(nbody)
                r.observe(nresp)
        texts.append(generate_latest(registry).decode())
    assert texts[0] == texts[1]
    assert 'http_requests_in_flight{method="POST",route="/v1/x"} 0.0' in texts[0]
    assert "http_request_duration_seconds_count{" in texts[0]


def test_generated_request_ids_are_unique_and_change_prefix_after_fork() -> None:
    import os

    from aivitals.instrument._middleware import _ids

    first = {_ids.new() for _ in range(1000)}
    assert len(first) == 1000
    assert all(len(i) == 32 and i.startswith(_ids.prefix) and i.isalnum() for i in first)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports its prefix and leaves at once
        os.write(write, _ids.prefix.encode())
        os._exit(0)
    os.close(write)
    child_prefix = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child_prefix) == 20 and child_prefix != _ids.prefix


def test_pending_records_from_many_threads_fold_exactly_and_stay_bounded() -> None:
    import threading

    from aivitals.instrument._fast import FOLD_AT, PENDING, fold_pending

    registry = CollectorRegistry()
    f = family("http_requests_in_flight", registry).labels("GET", "/t")
    d = family("http_request_duration_seconds", registry).labels("GET", "/t", "2xx", "200")
    b = family("http_request_body_size_bytes", registry).labels("GET", "/t")
    r = family("http_response_body_size_bytes", registry).labels("GET", "/t")
    per_thread = 5000

    def requests() -> None:
        for i in range(per_thread):
            PENDING.append(f)
            PENDING.append(((f, b, r), d, 0.01, 10, i % 3))
            if len(PENDING) >= FOLD_AT:
                fold_pending()

    def scrapes() -> None:
        for _ in range(50):
            generate_latest(registry)  # collect folds concurrently with the appends

    threads = [threading.Thread(target=requests) for _ in range(4)]
    threads.append(threading.Thread(target=scrapes))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(PENDING) < FOLD_AT + 2 * len(threads)  # bounded between scrapes
    text = generate_latest(registry).decode()
    assert 'http_requests_in_flight{method="GET",route="/t"} 0.0' in text
    assert (
        'http_request_duration_seconds_count{method="GET",route="/t",status="200",'
        'status_class="2xx"} 20000.0'
    ) in text
    assert 'http_request_body_size_bytes_sum{method="GET",route="/t"} 200000.0' in text
    assert not PENDING


@pytest.mark.anyio
async def test_a_scrape_during_a_request_counts_it_in_flight() -> None:
    import asyncio

    import httpx

    import aivitals

    registry = CollectorRegistry()
    started, release = asyncio.Event(), asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.set()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    wrapped = aivitals.instrument(app, registry=registry, routes=["/slow"])
    transport = httpx.ASGITransport(app=wrapped)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        pending = asyncio.create_task(client.get("/slow"))
        await started.wait()
        during = generate_latest(registry).decode()
        release.set()
        assert (await pending).status_code == 200
    after = generate_latest(registry).decode()
    assert 'http_requests_in_flight{method="GET",route="/slow"} 1.0' in during
    assert 'http_requests_in_flight{method="GET",route="/slow"} 0.0' in after
    assert 'seconds_count{method="GET",route="/slow",status="200",status_class="2xx"} 1.0' in after
