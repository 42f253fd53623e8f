"""The README's service example runs as written.

The block after the ``<!-- example: examples/service.py -->`` marker must be the
whole of ``examples/service.py``, and the block itself (not the file) is what
runs here: under a real uvicorn on a free port, with its tiny random-weight
model (built locally, nothing downloaded).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- example: examples/service.py -->"
MODEL = "tiny-gpt2-random-weights"
ROUTE = "/v1/generate"


def readme_example() -> str:
    """The python block right after the marker in README.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.count(MARKER) == 1, f"README.md must hold {MARKER!r} exactly once"
    after = text.split(MARKER, 1)[1]
    match = re.match(r"\s*```python\n(.*?)\n```\n", after, re.DOTALL)
    assert match, "the marker must be followed by a ```python block"
    return match.group(1) + "\n"


def test_readme_block_is_the_example_file() -> None:
    assert readme_example() == (ROOT / "examples" / "service.py").read_text(encoding="utf-8")


def test_readme_block_puts_protection_inside_instrumentation() -> None:
    # The order the issue was about: instrument(protect(app)), so refusals are counted
    # and /metrics never meets admission control.
    code = readme_example()
    assert re.search(r"service = instrument\(\s*protect\(\s*app,", code)
    assert "run_in_executor(pool, run_model" in code  # the model never runs on the loop


# --- the block, served ---------------------------------------------------------------


class _Server:
    def __init__(self, module: types.ModuleType) -> None:
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(module.service, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[types.ModuleType, str]]:
    workdir = tmp_path_factory.mktemp("service")
    module = types.ModuleType("readme_service")
    module.__file__ = str(workdir / "service.py")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")  # nothing is downloaded; make sure of it
        patch.chdir(workdir)  # the example writes service.jsonl into its working directory
        # pydantic resolves the body model through the module's entry
        patch.setitem(sys.modules, module.__name__, module)
        yield from _serve(module)


def _serve(module: types.ModuleType) -> Iterator[tuple[types.ModuleType, str]]:
    try:
        exec(compile(readme_example(), "README.md[service]", "exec"), module.__dict__)
        with _Server(module) as server:
            yield module, server.url
    finally:
        writer = module.__dict__.get("log_writer")
        if writer is not None:
            writer.stop()
        pool = module.__dict__.get("pool")
        if pool is not None:
            pool.shutdown(wait=True)


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def _scrape(url: str) -> dict[Any, float]:
    response = httpx.get(url + "/metrics", timeout=10)
    assert response.status_code == 200
    return _samples(response.text)


@pytest.mark.integration
@pytest.mark.slow
def test_generate_answers_and_every_layer_measures_it(
    served: tuple[types.ModuleType, str],
) -> None:
    module, url = served
    before = _scrape(url)
    body = {"prompt": "hello world", "max_new_tokens": 8}
    response = httpx.post(url + ROUTE, json=body, headers={"x-request-id": "readme-1"}, timeout=30)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == MODEL
    assert isinstance(answer["text"], str)
    assert 1 <= answer["completion_tokens"] <= 8  # only new tokens: the prompt is not counted
    assert response.headers["x-request-id"] == "readme-1"

    after = _scrape(url)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("http_request_duration_seconds_count", route=ROUTE, status="200") == 1
    assert grew("model_inference_time_seconds_count", model=MODEL) == 1
    assert grew("model_inference_time_seconds_sum", model=MODEL) > 0
    assert grew("model_output_tokens_sum", model=MODEL) == answer["completion_tokens"]
    prompt_tokens = len(module.tokenizer("hello world")["input_ids"])  # [CLS] hello world [SEP]
    assert grew("model_input_tokens_sum", model=MODEL) == prompt_tokens
    assert _value(after, "model_load_time_seconds", model=MODEL) > 0  # a gauge: the last load

    # the request's JSON lifecycle lines carry its id and the model call's facts
    module.log_writer.handler.flush()
    deadline = time.monotonic() + 5
    lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        text = Path("service.jsonl").read_text(encoding="utf-8")
        lines = [json.loads(x) for x in text.splitlines() if '"readme-1"' in x]
        if any(x.get("event") == "responded" for x in lines):
            break
        time.sleep(0.05)
    responded = [x for x in lines if x.get("event") == "responded"]
    assert responded, lines
    assert responded[0]["status"] == 200
    assert responded[0]["input_token_count"] == prompt_tokens


@pytest.mark.integration
@pytest.mark.slow
def test_health_probe_runs_a_real_inference(served: tuple[types.ModuleType, str]) -> None:
    _, url = served
    before = _scrape(url)
    assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    deadline = time.monotonic() + 20
    ready = httpx.get(url + "/readyz", timeout=5)
    while ready.status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
        ready = httpx.get(url + "/readyz", timeout=5)
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert checks["probe"]["ok"] and checks["warmup"]["ok"]
    after = _scrape(url)
    # probes are answers about the service, not served requests
    assert _value(after, "http_request_duration_seconds_count", route="/readyz") == _value(
        before, "http_request_duration_seconds_count", route="/readyz"
    )


@pytest.mark.integration
@pytest.mark.slow
def test_overload_is_refused_with_retry_after_counted_and_metrics_still_served(
    served: tuple[types.ModuleType, str],
) -> None:
    _, url = served
    before = _scrape(url)

    async def burst() -> tuple[list[httpx.Response], list[httpx.Response]]:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            body = {
                "prompt": "a longer prompt to keep the one model worker busy",
                "max_new_tokens": 64,
            }
            generations = [asyncio.ensure_future(client.post(ROUTE, json=body)) for _ in range(64)]
            scrapes = []
            for _ in range(5):  # while the queue is full
                await asyncio.sleep(0.02)
                scrapes.append(await client.get("/metrics"))
            return list(await asyncio.gather(*generations)), scrapes

    generated, scrapes = asyncio.run(burst())
    assert [s.status_code for s in scrapes] == [200] * 5  # /metrics never queued or refused
    refused = [r for r in generated if r.status_code == 429]
    answered = [r for r in generated if r.status_code == 200]
    assert len(refused) + len(answered) == len(generated), {r.status_code for r in generated}
    assert refused, "64 requests at once against 4 running + 16 queued: some must be refused"
    assert answered, "admission must still let requests through"
    for r in refused:
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] in {"QUEUE_FULL", "DEADLINE_UNMEETABLE"}
        assert r.headers["x-request-id"] == r.json()["request_id"]

    after = _scrape(url)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    # the refusals reach the HTTP metrics, because instrumentation wraps protection
    assert grew("http_request_duration_seconds_count", route=ROUTE, status="429") == len(refused)
    assert grew("http_request_duration_seconds_count", route=ROUTE, status="200") == len(answered)
    assert grew("admission_rejections_total") == len(refused)
    assert grew("model_inference_time_seconds_count", model=MODEL) == len(answered)


@pytest.mark.integration
@pytest.mark.slow
def test_bad_input_gets_a_clear_error(served: tuple[types.ModuleType, str]) -> None:
    _, url = served
    too_big = httpx.post(url + ROUTE, json={"prompt": "x" * 200_000}, timeout=10)
    assert too_big.status_code == 413
    assert too_big.json()["error"]["code"] == "INPUT_TOO_LARGE"
    too_long = httpx.post(url + ROUTE, json={"prompt": "hi", "max_new_tokens": 10_000}, timeout=10)
    assert too_long.status_code == 422
    broken = httpx.post(
        url + ROUTE, content=b'{"prompt": ', headers={"content-type": "application/json"}
    )
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == "INPUT_BAD_JSON"


@pytest.mark.integration
@pytest.mark.slow
def test_a_deadline_answers_504_and_stops_generate_at_the_next_token(
    served: tuple[types.ModuleType, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A slow model (20 ms a token) and a 0.3 s deadline: the deadline middleware answers
    # 504 and calls abort_request; the example's stopping criterion must end generate()
    # at the next token instead of running all 64 for nobody.
    module, url = served
    steps = 0
    forward = module.model.forward

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        nonlocal steps
        steps += 1
        time.sleep(0.02)
        return forward(*args, **kwargs)

    before = _scrape(url)
    monkeypatch.setattr(module.model, "forward", slow_forward)
    response = httpx.post(
        url + ROUTE,
        json={"prompt": "hello", "max_new_tokens": 64},
        headers={"x-request-timeout": "0.3", "x-request-id": "readme-deadline"},
        timeout=30,
    )
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "TIMEOUT"
    assert response.headers["x-request-id"] == "readme-deadline"

    aborts = ("model_aborts_total", {"model": MODEL, "reason": "deadline"})
    deadline = time.monotonic() + 10
    after = _scrape(url)
    while _value(after, aborts[0], **aborts[1]) == _value(before, aborts[0], **aborts[1]):
        assert time.monotonic() < deadline, "the model call was never aborted"
        time.sleep(0.05)
        after = _scrape(url)
    assert steps < 40  # stopped near 0.3 s / 20 ms, not after 64 tokens (probes add a few)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew(aborts[0], **aborts[1]) == 1
    assert grew("http_request_duration_seconds_count", route=ROUTE, status="504") == 1
    assert grew("request_timeouts_total", reason="deadline") == 1
