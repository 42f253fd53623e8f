"""A real Flask app under a real gunicorn (sync and gthread workers) on 127.0.0.1."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._servers import promtool

pytest.importorskip("gunicorn")
pytest.importorskip("flask")

from tests.instrument._gunicorn import (
    EARLY_APP,
    gunicorn_boot_failure,
    gunicorn_wsgi,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ITEMS = "/v1/items/<int:item_id>"


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def _total(text: str, name: str, **labels: str) -> float:
    return sum(
        v for found, v in _samples(text, name) if all(found.get(k) == x for k, x in labels.items())
    )


def _scrape(client: httpx.Client, url: str, *, settled: int) -> str:
    """/metrics once ``settled`` requests have ended and none is in flight.

    A worker hands the last byte to the client before it sees the end of the
    response iterable and records the request, so a scrape answered by the
    other worker a moment later may not count it yet. It records the duration,
    then the body sizes: the response size, recorded last, says it is done.
    """
    deadline = time.monotonic() + 10
    while True:
        text = client.get(f"{url}/metrics").text
        done = _total(text, "http_response_body_size_bytes_count") >= settled
        if done and _total(text, "http_requests_in_flight") == 0:
            return text
        if time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def _fresh() -> httpx.Client:
    # no keep-alive: every request a new connection, so the workers share them
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=20)


def test_sync_workers_share_one_exposition_without_any_setup(tmp_path: Path) -> None:
    """gunicorn -w 2 (sync), no PROMETHEUS_MULTIPROC_DIR, no config: aivitals sets it up."""
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"AIVITALS_TEST_LOG": str(logs / "svc-{pid}.jsonl")}
    n = 40
    with gunicorn_wsgi(tmp_path, workers=2, env=env) as url, _fresh() as client:
        # slow-ish requests in parallel keep both sync workers busy, so both serve some
        # (rounds until the second worker, which may still be booting, has answered)
        def slow_pid(_: int) -> dict[str, int]:
            answer: dict[str, int] = client.get(f"{url}/v1/slow?s=0.2").json()
            return answer

        slow: list[dict[str, int]] = []
        deadline = time.monotonic() + 30
        with ThreadPoolExecutor(4) as pool:
            while len({r["pid"] for r in slow}) < 2 and time.monotonic() < deadline:
                slow += pool.map(slow_pid, range(4))
            items = list(pool.map(lambda i: client.get(f"{url}/v1/items/{i}"), range(n)))
        generated = [
            client.post(f"{url}/v1/generate", content=b"x" * 40, headers={"x-request-id": f"g-{i}"})
            for i in range(5)
        ]
        text = _scrape(client, url, settled=n + len(slow) + 5)
    assert len({r["pid"] for r in slow}) == 2  # both workers served
    assert all(r.status_code == 200 for r in items)
    # every worker's requests, in any worker's scrape
    assert _total(text, "http_request_duration_seconds_count", route=ITEMS) == n
    assert _total(text, "http_request_duration_seconds_count", route="/v1/slow") == len(slow)
    assert _total(text, "http_requests_in_flight") == 0
    # the model call, timed inside the request, from both workers' files
    assert _total(text, "model_inference_time_seconds_count", model="toy") == 5
    assert _total(text, "model_input_tokens_sum", model="toy") == 5 * 11
    # request ids: honoured and echoed, and the one the model call saw
    assert [r.headers["x-request-id"] for r in generated] == [f"g-{i}" for i in range(5)]
    assert [r.json()["request_id"] for r in generated] == [f"g-{i}" for i in range(5)]
    assert all(len(r.headers["x-request-id"]) == 32 for r in items)  # made when absent
    # the multiprocess directory aivitals made by itself, under the server's TMPDIR
    made = list(tmp_path.glob("aivitals-prometheus-*/*/*.db"))
    assert made, "no multiprocess files"
    assert promtool("check", "metrics", input_text=text).returncode == 0
    # lifecycle log lines: JSON, a received and a responded line per request
    lines = _log_lines(logs, expect=n + len(slow) + 5)
    assert all(isinstance(x, dict) for x in lines)
    responded = {x["request_id"]: x for x in lines if x["event"] == "responded"}
    received = {x["request_id"] for x in lines if x["event"] == "received"}
    assert received == set(responded)
    g0 = responded["g-0"]
    assert g0["route"] == "/v1/generate" and g0["status"] == 200
    assert g0["model_version"] == "v1.2.0" and g0["input_token_count"] == 11
    assert g0["gpu_time_ms"] >= 10  # the model call's own time (CPU: its wall time)


def _log_lines(logs: Path, *, expect: int) -> list[dict[str, object]]:
    # the writers flush every 50 ms; gunicorn's stop writes out the rest (atexit)
    deadline = time.monotonic() + 10
    while True:
        lines = [
            json.loads(line)
            for path in sorted(logs.glob("svc-*.jsonl"))
            for line in path.read_text().splitlines()
        ]
        responded = [x for x in lines if x["event"] == "responded"]
        if len(responded) >= expect or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_gthread_with_the_config_protection_answers_429_and_413(tmp_path: Path) -> None:
    """gunicorn -k gthread -w 2 --threads 4 -c python:aivitals.instrument.gunicorn_conf."""
    env = {"AIVITALS_TEST_PROTECT": "1"}
    with (
        gunicorn_wsgi(
            tmp_path, workers=2, worker_class="gthread", threads=4, conf=True, env=env
        ) as url,
        _fresh() as client,
    ):
        # one slot per worker, no queue: six at once leave at least four refused
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: client.get(f"{url}/v1/slow?s=1"), range(6)))
        refused = [r for r in answers if r.status_code == 429]
        assert len(refused) >= 4 and len(answers) - len(refused) >= 1
        for r in refused:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "QUEUE_FULL"
            assert r.json()["request_id"] == r.headers["x-request-id"]
        _scrape(client, url, settled=6)  # every slot given back
        big = client.post(f"{url}/v1/echo", content=b"a" * 5000)
        assert big.status_code == 413 and big.json()["error"]["code"] == "INPUT_TOO_LARGE"
        small = client.post(f"{url}/v1/echo", content=b"a" * 500)
        assert small.json() == {"n": 500}
        text = _scrape(client, url, settled=6 + 2)
    assert _total(text, "http_request_duration_seconds_count", route="/v1/slow", status="429") == (
        len(refused)
    )
    assert _total(text, "http_request_duration_seconds_count", route="/v1/echo", status="413") == 1
    assert _total(text, "admission_rejections_total", reason="queue_full") == len(refused)
    assert _total(text, "input_rejections_total", reason="INPUT_TOO_LARGE") == 1
    # refused unread by its Content-Length, yet the client sent 5000 bytes
    assert _total(text, "http_request_body_size_bytes_sum", route="/v1/echo") == 5500


def test_app_metrics_made_before_aivitals_refuse_the_start_with_the_fix(tmp_path: Path) -> None:
    status, log = gunicorn_boot_failure(tmp_path, workers=2, app=EARLY_APP)
    assert status != 0
    assert "ConfigError" in log and "gunicorn runs 2 workers" in log
    assert "app_early_total" in log and "python:aivitals.instrument.gunicorn_conf" in log


def test_the_named_fix_works_and_keeps_the_apps_own_metric(tmp_path: Path) -> None:
    with (
        gunicorn_wsgi(tmp_path, workers=2, conf=True, app=EARLY_APP) as url,
        _fresh() as client,
    ):
        for i in range(10):
            assert client.get(f"{url}/v1/items/{i}").status_code == 200
        text = _scrape(client, url, settled=10)
    assert _total(text, "http_request_duration_seconds_count", route=ITEMS) == 10
    assert _total(text, "app_early_total") == 2  # one per worker, each made at import
