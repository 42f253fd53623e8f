"""Against a real uvicorn: multiprocess sums, promtool, malformed and cut-off requests."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._servers import promtool
from tests.instrument._uvicorn import uvicorn_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def test_uvicorn_workers_4_sum_to_n_in_the_scraped_counters(tmp_path: Path) -> None:
    n = 120
    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(mp_dir)}
    with uvicorn_server(workers=4, env=env) as url:
        pids = set()
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=url, limits=limits, timeout=10) as client:
            for _ in range(n):
                pids.add(client.get("/v1/pid").json()["pid"])
            text = client.get("/metrics").text
    counts = _samples(text, "http_request_duration_seconds_count")
    pid_route = [v for labels, v in counts if labels.get("route") == "/v1/pid"]
    # the readiness probes hit /v1/pid too: at least one, and never a lost or doubled request
    assert pid_route and n < sum(pid_route) <= n + 600
    ready_probes = sum(pid_route) - n
    assert ready_probes >= 1
    in_flight = _samples(text, "http_requests_in_flight")
    assert all(v == 0 for _, v in in_flight)
    rss = _samples(text, "service_process_resident_memory_bytes")
    worker_pids = {labels["pid"] for labels, _ in rss}
    assert {str(p) for p in pids} <= worker_pids
    assert all(v > 0 for _, v in rss)


def test_uvicorn_workers_exact_count_after_readiness(tmp_path: Path) -> None:
    n = 100
    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    with uvicorn_server(workers=4, env={"PROMETHEUS_MULTIPROC_DIR": str(mp_dir)}) as url:
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=url, limits=limits, timeout=10) as client:
            for i in range(n):
                assert client.get(f"/v1/items/{i}").status_code == 200
            text = client.get("/metrics").text
    counts = _samples(text, "http_request_duration_seconds_count")
    items = [v for labels, v in counts if labels.get("route") == "/v1/items/{item_id}"]
    assert sum(items) == n


def test_promtool_check_metrics_passes_on_a_real_scrape(tmp_path: Path) -> None:
    with uvicorn_server() as url, httpx.Client(base_url=url, timeout=10) as client:
        client.post("/v1/echo", content=b"abc")
        client.get("/v1/stream")
        client.get("/v1/items/3")
        client.get("/no/such/path")
        text = client.get("/metrics").text
    result = promtool("check", "metrics", input_text=text)
    assert result.returncode == 0, result.stdout + result.stderr


def _raw(url: str, payload: bytes, *, read: bool = True, half_close: bool = False) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(payload)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        if not read:
            return b""
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


BAD_REQUESTS = {
    "garbage": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03garbage\r\n\r\n",
    "bad_request_line": b"GET\r\n\r\n",
    "non_utf8_header": b"GET /v1/items/1 HTTP/1.1\r\nHost: x\r\nX-Request-ID: \xff\xfe\r\n"
    b"User-Agent: \xc3\x28\r\nConnection: close\r\n\r\n",
    "bad_content_length": b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    "body_cut_off": b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    + b"x" * 100,
}


def _status(response: bytes) -> str:
    return response.split(b"\r\n", 1)[0].decode("latin-1") if response else "<closed>"


def _behaviour(env: dict[str, str]) -> tuple[dict[str, str], str, str]:
    out = {}
    with uvicorn_server(env=env) as url:
        for name, payload in BAD_REQUESTS.items():
            out[name] = _status(_raw(url, payload, half_close=name == "body_cut_off"))
        # a client that sends half a body and goes away without reading
        _raw(url, BAD_REQUESTS["body_cut_off"], read=False)
        # and one that cancels a streaming response after the first bytes
        with socket.create_connection(url.removeprefix("http://").split(":"), timeout=5) as s:
            s.sendall(b"GET /v1/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(10)
        time.sleep(0.5)  # the server notices the departures
        with httpx.Client(base_url=url, timeout=10) as client:
            after = client.get("/v1/items/9").status_code
            metrics = client.get("/metrics").text
    return out, str(after), metrics


def test_bad_input_is_answered_as_without_aivitals(tmp_path: Path) -> None:
    log = tmp_path / "svc.jsonl"
    bare, bare_after, _ = _behaviour({"AIVITALS_TEST_BARE": "1"})
    ours, ours_after, metrics = _behaviour({"AIVITALS_TEST_LOG": str(log)})
    assert ours == bare
    assert ours_after == bare_after == "200"
    assert ours["non_utf8_header"].startswith("HTTP/1.1 200")
    in_flight = _samples(metrics, "http_requests_in_flight")
    assert in_flight and all(v == 0 for _, v in in_flight)
    # nothing lost from the logs: every request the app saw has its received and responded lines
    deadline = time.monotonic() + 5
    while True:
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        received = [x for x in lines if x["event"] == "received"]
        responded = [x for x in lines if x["event"] == "responded"]
        if len(responded) >= len(received) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(received) == len(responded) >= 4
    assert {x["request_id"] for x in received} == {x["request_id"] for x in responded}
    cut = [x for x in responded if x["route"] == "/v1/echo"]
    assert cut and all(x["client_disconnected"] for x in cut)
    assert all(x["status"] == 499 and x["error_code"] == "CLIENT_DISCONNECT" for x in cut)
    errors = _samples(metrics, "http_server_errors_total")
    assert all(v == 0 for _, v in errors)  # a client leaving is not a server error


def test_gunicorn_workers_sum_and_a_killed_worker_leaves_no_live_gauges(tmp_path: Path) -> None:
    import os
    import signal

    pytest.importorskip("gunicorn")
    from tests.instrument._uvicorn import gunicorn_server

    mp_dir = tmp_path / "prom"
    mp_dir.mkdir()
    n = 60
    with gunicorn_server(tmp_path, workers=2, env={"PROMETHEUS_MULTIPROC_DIR": str(mp_dir)}) as url:
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=url, limits=limits, timeout=10) as client:
            for i in range(n):
                assert client.get(f"/v1/items/{i}").status_code == 200
            victim = client.get("/v1/pid").json()["pid"]
            assert list(mp_dir.glob(f"gauge_livesum_{victim}.db"))
            os.kill(victim, signal.SIGKILL)  # gunicorn runs child_exit, then a new worker
            deadline = time.monotonic() + 20
            while list(mp_dir.glob(f"gauge_livesum_{victim}.db")):
                assert time.monotonic() < deadline, "child_exit did not drop the dead worker"
                time.sleep(0.1)
            text = client.get("/metrics").text
    counts = _samples(text, "http_request_duration_seconds_count")
    items = [v for labels, v in counts if labels.get("route") == "/v1/items/{item_id}"]
    assert sum(items) == n  # the dead worker's requests are still counted
    pids = {labels["pid"] for labels, _ in _samples(text, "service_process_threads")}
    assert str(victim) not in pids
    assert all(v == 0 for _, v in _samples(text, "http_requests_in_flight"))
